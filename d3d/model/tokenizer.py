"""Tokenizer: a thin wrapper over a HF ``tokenizer.json`` (the ``tokenizers`` package) with the
Qwen chat format built in, so no jinja is needed.

Chat format (Qwen2.5 / Qwen3 "ChatML")::

    <|im_start|>system\n{content}<|im_end|>\n
    <|im_start|>user\n{content}<|im_end|>\n
    <|im_start|>assistant\n            <- the generation prompt

For Qwen3 templates, assistant turns *before* the last user turn have their ``<think>…</think>``
part removed, and ``enable_thinking=False`` appends an empty think block to the generation
prompt, exactly as the official template does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


class Tokenizer:
    def __init__(self, tokenizer: _HFTokenizer, config: dict | None = None, source: str = "tokenizer.json"):
        self._tok = tokenizer
        self.config = config or {}
        self.source = source
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.added = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()}
        self.special_ids = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
        template = self.config.get("chat_template") or ""
        # The Qwen3 template handles <think>; Qwen2.5's does not (and adds a default system prompt).
        self.thinking_template = "<think>" in template
        self.default_system = None
        if "You are Qwen, created by Alibaba Cloud" in template:
            self.default_system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

    # ------------------------------------------------------------ loading

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        """Load from a directory holding ``tokenizer.json`` (+ optional ``tokenizer_config.json``)."""
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"{file}: no such file (expected a HF tokenizer.json)")
        try:
            tok = _HFTokenizer.from_file(str(file))
        except Exception as e:
            raise ValueError(f"{file}: not a valid tokenizer.json ({e})") from None
        config = {}
        cfg_file = file.parent / "tokenizer_config.json"
        if cfg_file.is_file():
            try:
                config = json.loads(cfg_file.read_text())
            except json.JSONDecodeError as e:
                raise ValueError(f"{cfg_file}: not valid JSON ({e})") from None
        return cls(tok, config, str(file))

    # ------------------------------------------------------------ special tokens

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def _config_token(self, key: str) -> int | None:
        value = self.config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        return self.token_id(value) if isinstance(value, str) else None

    @property
    def eos_token_id(self) -> int | None:
        return self._config_token("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._config_token("pad_token")

    def stop_token_ids(self) -> list[int]:
        """Tokens that end a generation: the configured eos, <|im_end|> and <|endoftext|> if present."""
        ids = [self.eos_token_id, self.token_id(IM_END), self.token_id("<|endoftext|>")]
        return sorted({i for i in ids if i is not None})

    # ------------------------------------------------------------ text <-> ids

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings in it become their special ids."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token id(s) {bad[:5]} out of range for {self.source} (vocab size {self.vocab_size})")
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------ chat

    def apply_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                   enable_thinking: bool | None = None) -> str:
        """Render a conversation in the Qwen chat format (see module docstring)."""
        if not messages:
            raise ValueError("messages is empty")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
                raise ValueError(f"messages[{i}]: expected a dict with role system/user/assistant, got {m!r}")
            if not isinstance(m.get("content"), str):
                raise ValueError(f"messages[{i}]: 'content' must be a str")
        parts = []
        if self.default_system and messages[0]["role"] != "system":
            parts.append(f"{IM_START}system\n{self.default_system}{IM_END}\n")
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=len(messages) - 1)
        for i, m in enumerate(messages):
            content = m["content"]
            if m["role"] == "assistant" and self.thinking_template:
                content = self._assistant_content(content, keep_reasoning=i > last_user, last=i == len(messages) - 1)
            parts.append(f"{IM_START}{m['role']}\n{content}{IM_END}\n")
        if add_generation_prompt:
            parts.append(f"{IM_START}assistant\n")
            if self.thinking_template and enable_thinking is False:
                parts.append("<think>\n\n</think>\n\n")
        return "".join(parts)

    @staticmethod
    def _assistant_content(content: str, keep_reasoning: bool, last: bool) -> str:
        answer, reasoning = content, ""
        if "</think>" in content:
            answer = content.split("</think>")[-1].lstrip("\n")
            reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
        if keep_reasoning and (last or reasoning):
            return "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + answer.lstrip("\n")
        return answer

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    enable_thinking: bool | None = None) -> list[int]:
        return self.encode(self.apply_chat(messages, add_generation_prompt, enable_thinking))


def load_tokenizer(path: str | Path) -> Tokenizer:
    return Tokenizer.load(path)


class StreamPrinter:
    """Prints generated text as it arrives; holds back an incomplete UTF-8 character."""

    def __init__(self, tok, out=None):
        self.tok, self.out, self.ids, self.shown = tok, out or sys.stdout, [], 0

    def __call__(self, seq: int, new: list[int]) -> None:
        self.ids.extend(new)
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        self.out.write(text[self.shown:])
        self.out.flush()
        self.shown = len(text)
