"""Chat-format training data for an instruction-tuned target (the real-model track).

A chat model answers requests, so its drafter should learn from answers, not from raw file
windows. The prompts here mimic the HumanEval chat format the benchmark uses, built from the
*training split* of the standard library: each prompt is a function header + docstring cut out
of a training file with ``ast``, wrapped in a user message (``d3d.prompts.code_request``, three
phrasings). The target's greedy answer (up to ``gen_len`` tokens, stopping at its end-of-turn
token) is the supervision. With ``extra_functions`` a longer list goes on, past
the corpus's own functions, with functions of the other installed Python sources (torch, pip, ...).

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
from ..corpus import PYTHON_SOURCES, Corpus, find_corpus, read_texts
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


def extra_train_snippets(corpus: Corpus, heldout_fraction: float, exclude: set[str], seed: int) -> list[str]:
    """Functions to ask about beyond ``corpus``: those of the training split of ``--corpus
    python-sources`` (the standard library + torch, pip, setuptools, triton, ...) in files outside
    ``corpus``, shuffled by ``seed``. A function whose text is in ``exclude`` (the caller's own)
    or anywhere in ``corpus``'s held-out files is left out, so a vendored copy of a held-out
    function never becomes training data. The installed packages vary by machine, and so does
    this list (the answers' cache key covers it)."""
    if str(corpus.root) == PYTHON_SOURCES:
        return []
    held = set(function_snippets(read_texts(corpus.heldout)))
    own = set(corpus.train) | set(corpus.heldout)
    files = [p for p in find_corpus(PYTHON_SOURCES, heldout_fraction).train if p not in own]
    extra = list(dict.fromkeys(s for s in function_snippets(read_texts(files)) if s not in exclude and s not in held))
    gen = torch.Generator().manual_seed(seed + 1)  # its own stream: the corpus's picks and kinds stay as they were
    return [extra[k] for k in torch.randperm(len(extra), generator=gen).tolist()]


def chat_prompts(tok: Tokenizer, corpus_root: str | None, heldout_fraction: float, n: int, split: str = "train",
                 seed: int = 0, templates: int = len(CHAT_TEMPLATES), explain: bool = False,
                 extra_functions: bool = False) -> list[list[int]]:
    """``n`` chat prompts (token ids) built from function snippets of the ``split`` files: "train",
    or a held-out part — "validation" (a trainer's τ monitor, checkpoint picks), "evaluation"
    (reported figures) or "heldout" (both; ``d3d.corpus.Corpus.part``). ``explain``: ask for a
    prose explanation of each function (``explain_request``) instead of its code. Past the split's
    functions the requests repeat them; with ``extra_functions`` (train split only) the functions
    of ``extra_train_snippets`` come first. The first requests never depend on ``n``, so the
    answers to a shorter list are a prefix of a longer one's (``make_chat_training_data`` reuses them)."""
    corpus = find_corpus(corpus_root, heldout_fraction)
    files = corpus.train if split == "train" else corpus.part(split)
    snippets = function_snippets(read_texts(files))
    if not snippets:
        raise ValueError(f"{corpus.root}: no function with a docstring in the {split} split")
    if extra_functions and split != "train":
        raise ValueError(f"extra_functions: only for the train split, not {split!r}")
    gen = torch.Generator().manual_seed(seed)
    pool = [snippets[k] for k in torch.randperm(len(snippets), generator=gen).tolist()]
    if extra_functions and n > len(pool):
        pool += extra_train_snippets(corpus, heldout_fraction, set(snippets), seed)
    picks = [pool[i % len(pool)] for i in range(n)]
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


def answers_key(prompts: list[list[int]], gen_len: int, target: Transformer) -> str:
    """Cache key of the target's answers to ``prompts``: the requests, the answer cap and the model."""
    return hashlib.sha256(json.dumps([prompts, gen_len, target.cfg.to_hf()]).encode()
                          + target.embed_tokens.weight[:4].float().numpy().tobytes()).hexdigest()[:16]


def cached_prefix(prompts: list[list[int]], gen_len: int, target: Transformer, cache_dir: Path) -> list[list[int]]:
    """The longest finished answers file in ``cache_dir`` that answers a prefix of ``prompts``
    (its name is the key of the first len(file) requests), or []: growing --n-sequences
    only generates the new requests' answers."""
    best: list[list[int]] = []
    for path in cache_dir.glob("chat-answers-*.pt"):
        if path.name.endswith(".partial.pt"):
            continue
        answers = torch.load(path)
        m = len(answers)
        if len(best) < m < len(prompts) and path.name == f"chat-answers-{answers_key(prompts[:m], gen_len, target)}.pt":
            best = answers
    return best


@torch.no_grad()
def make_chat_training_data(target: Transformer, tok: Tokenizer, corpus_root: str | None, heldout_fraction: float,
                            n_sequences: int, gen_len: int, window: int, seed: int, cache_dir: Path,
                            batch: int = 64, minutes: float | None = None, extra_functions: bool = False,
                            log=print) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, loss_mask)`` ``[rows, window]``: chat prompts + the target's greedy answers.

    Answers are generated ``batch`` at a time and saved after each batch (an interrupted run
    resumes where it stopped; a finished smaller run's answers to the same first requests are
    reused). ``minutes``: stop generating after this much wall time and return the rows answered
    so far (all earlier invocations' included) — data in chunks that fit a session; a later call
    with the same settings goes on from there. ``extra_functions``: see ``chat_prompts``."""
    prompts = chat_prompts(tok, corpus_root, heldout_fraction, n_sequences, "train", seed,
                           extra_functions=extra_functions)
    key = answers_key(prompts, gen_len, target)
    path = cache_dir / f"chat-answers-{key}.pt"
    partial = cache_dir / f"chat-answers-{key}.partial.pt"
    if path.is_file():
        log(f"using cached target answers {path}")
        answers = torch.load(path)
    else:
        if not partial.is_file() and cache_dir.is_dir() and (prefix := cached_prefix(prompts, gen_len, target, cache_dir)):
            log(f"reusing {len(prefix)} cached answers to the same first requests")
            save_atomic([prefix], partial)
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
            log(f"{len(answers)} of {n_sequences} answers made so far")
    pad = tok.token_id("<|endoftext|>") or 0
    return to_windows(prompts[:len(answers)], answers, window, pad)
