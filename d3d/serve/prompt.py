"""What a client sends, as token ids for ``d3d serve``: its text is always plain text.

The chat template's own control tokens (``<|im_start|>``, ``<|im_end|>``) are the only special tokens
in a prompt. The same strings inside a message, or in a /v1/completions prompt, are encoded as the
characters they are (the ``tokenizers`` package's ``encode_special_tokens``), so a user cannot forge
a system turn or end one. Text without such strings encodes exactly as ``Tokenizer.encode_chat`` and
``Tokenizer.encode`` do (``tokenizers`` encodes the text between special tokens piece by piece too).

``max_bytes``: the most UTF-8 bytes a prompt of ``context`` tokens can hold (the context times the
longest token's bytes), checked before tokenizing, so that no prompt that fits is refused and none
that cannot fit is tokenized.
"""

from __future__ import annotations

import re
from itertools import chain

from tokenizers import Tokenizer as HFTokenizer

# characters no template writes: one absent from every message marks the special strings in them
_PRIVATE = chain(range(0xE000, 0xF900), range(0xF0000, 0xFFFFE), range(0x100000, 0x10FFFE))


class PromptEncoder:
    """Plain-text encoding over ``tok`` (a ``d3d.model.tokenizer.Tokenizer``) for a ``context``-token server."""

    def __init__(self, tok, context: int):
        self.tok = tok
        self.plain = HFTokenizer.from_file(tok.source)  # its own copy: the flag below is the tokenizer's state
        self.plain.encode_special_tokens = True
        self.special = {text: i for text, i in tok.added.items() if i in tok.special_ids}
        self.split = re.compile("(" + "|".join(map(re.escape, sorted(self.special, key=len, reverse=True))) + ")")
        longest = max(len(t.encode()) for t in self.plain.get_vocab(with_added_tokens=True))
        self.max_bytes = context * longest

    def text(self, text: str) -> list[int]:
        """``text`` as plain text (special-token strings included)."""
        return self.plain.encode(text, add_special_tokens=False).ids

    def chat(self, messages: list[dict]) -> list[int]:
        """``messages`` in the chat template, their contents plain text: the special strings in them are
        swapped for markers while the template is applied, the result split at the template's special
        tokens, and the markers swapped back in the plain-text pieces."""
        if not self.special:
            return self.text(self.tok.apply_chat(messages))
        used = set().union(*(m["content"] for m in messages))
        mark = chr(next(c for c in _PRIVATE if chr(c) not in used))
        names = list(self.special)
        swapped = [m | {"content": self.split.sub(lambda x: f"{mark}{names.index(x.group())}{mark}", m["content"])}
                   for m in messages]
        back = re.compile(f"{mark}(\\d+){mark}")
        ids = []
        for k, piece in enumerate(self.split.split(self.tok.apply_chat(swapped))):
            if k % 2:  # the template's own special token
                ids.append(self.special[piece])
            elif piece:
                ids += self.text(back.sub(lambda x: names[int(x.group(1))], piece))
        return ids


__all__ = ["PromptEncoder"]
