"""Chat-format training data for an instruction-tuned target (the real-model track).

A chat model answers requests, so its drafter should learn from answers, not from raw file
windows. The prompts here mimic the HumanEval chat format the benchmark uses, built from the
*training split* of the standard library: each prompt is a function header + docstring cut out
of a training file with ``ast``, wrapped in a user message (``d3d.prompts.code_request``, three phrasings). The target's greedy answer (up to ``gen_len`` tokens, stopping at
its end-of-turn token) is the supervision.

Sequences are stored as fixed ``window``-token rows: the *last* ``window`` tokens of
prompt + answer (RoPE is relative, so where a window starts does not matter), right-padded
when shorter. ``loss_mask`` marks the answer tokens, end-of-turn token included.
"""

from __future__ import annotations

import ast
import hashlib
import json
import textwrap
from pathlib import Path

import torch

from ..engines import generate
from ..model import Transformer
from ..prompts import CHAT_TEMPLATES, code_request, explain_request
from ..tokenizer import Tokenizer
from ..corpus import find_corpus, read_texts
from .common import resumable_chunks, save_atomic

def function_snippets(texts: list[str], max_chars: int = 600) -> list[str]:
    """Header + docstring of every function with a docstring in ``texts`` (dedented, in order)."""
    out = []
    for text in texts:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        lines = text.splitlines(keepends=True)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
                continue
            doc = node.body[0]
            if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
                continue
            first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            snippet = textwrap.dedent("".join(lines[first: doc.end_lineno]))
            if 40 <= len(snippet) <= max_chars:
                out.append(snippet)
    return out


def chat_prompts(tok: Tokenizer, corpus_root: str | None, heldout_fraction: float, n: int, split: str = "train",
                 seed: int = 0, templates: int = len(CHAT_TEMPLATES), explain: bool = False) -> list[list[int]]:
    """``n`` chat prompts (token ids) built from function snippets of the ``split`` files: "train",
    or a held-out part — "validation" (a trainer's τ monitor, checkpoint picks), "evaluation"
    (reported figures) or "heldout" (both; ``d3d.corpus.Corpus.part``). ``explain``: ask for a
    prose explanation of each function (``explain_request``) instead of its code."""
    corpus = find_corpus(corpus_root, heldout_fraction)
    files = corpus.train if split == "train" else corpus.part(split)
    snippets = function_snippets(read_texts(files))
    if not snippets:
        raise ValueError(f"{corpus.root}: no function with a docstring in the {split} split")
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(snippets), generator=gen).tolist()
    picks = [snippets[order[i % len(order)]] for i in range(n)]
    if explain:
        return [tok.encode_chat(explain_request(s)) for s in picks]
    kinds = torch.randint(0, templates, (n,), generator=gen).tolist()
    return [tok.encode_chat(code_request(s, k)) for s, k in zip(picks, kinds)]


def to_windows(prompts: list[list[int]], answers: list[list[int]], window: int, pad_id: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Last ``window`` tokens of each prompt + answer, right-padded; loss mask on answer tokens."""
    ids = torch.full((len(prompts), window), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), window)
    for i, (p, a) in enumerate(zip(prompts, answers)):
        seq = (p + a)[-window:]
        n_ans = min(len(a), len(seq))
        ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, len(seq) - n_ans: len(seq)] = 1
    return ids, mask


@torch.no_grad()
def make_chat_training_data(target: Transformer, tok: Tokenizer, corpus_root: str | None, heldout_fraction: float,
                            n_sequences: int, gen_len: int, window: int, seed: int, cache_dir: Path,
                            batch: int = 64, minutes: float | None = None, log=print
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, loss_mask)`` ``[rows, window]``: chat prompts + the target's greedy answers.

    Answers are generated ``batch`` at a time and saved after each batch (an interrupted run
    resumes where it stopped). ``minutes``: stop generating after this much wall time and return
    the rows answered so far (all earlier invocations' included) — data in chunks that fit a
    session; a later call with the same settings goes on from there."""
    prompts = chat_prompts(tok, corpus_root, heldout_fraction, n_sequences, "train", seed)
    key = hashlib.sha256(json.dumps([prompts, gen_len, target.cfg.to_hf()]).encode()
                         + target.embed_tokens.weight[:4].float().numpy().tobytes()).hexdigest()[:16]
    path = cache_dir / f"chat-answers-{key}.pt"
    partial = cache_dir / f"chat-answers-{key}.partial.pt"
    if path.is_file():
        log(f"using cached target answers {path}")
        answers = torch.load(path)
    else:
        stops = tok.stop_token_ids()
        chunks = resumable_chunks(
            partial, n_sequences, batch,
            lambda i, j: generate(target, prompts[i:j], max_new_tokens=gen_len, stop_ids=stops).tokens,
            "target answers", "answer tok", lambda rows: sum(map(len, rows)), minutes, log)
        answers = [a for rows in chunks for a in rows]
        if len(answers) == n_sequences:
            save_atomic(answers, path)
            partial.unlink(missing_ok=True)
        else:
            log(f"training on the {len(answers)} answers made so far")
    pad = tok.token_id("<|endoftext|>") or 0
    return to_windows(prompts[:len(answers)], answers, window, pad)
