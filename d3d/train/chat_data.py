"""Chat-format training data for an instruction-tuned target (the real-model track).

A chat model answers requests, so its drafter should learn from answers, not from raw file
windows. The prompts here mimic the HumanEval chat format the benchmark uses, built from the
*training split* of the standard library: each prompt is a function header + docstring cut out
of a training file with ``ast``, wrapped in a user message (``d3d.data.prompts.code_request``, three
phrasings). The target's greedy answer (up to ``gen_len`` tokens, stopping at its end-of-turn
token) is the supervision, kept in an ``AnswerStore`` (a directory that can be committed, so the
slow answers outlive the machine). With ``extra_functions`` a longer list goes on, past the
corpus's own functions, with functions of the other installed Python sources (torch, pip, ...).
Requests may also ask for a prose explanation of a function (``chat_requests``' kinds).

Sequences are stored as fixed ``window``-token rows: the *last* ``window`` tokens of
prompt + answer (RoPE is relative, so where a window starts does not matter), right-padded
when shorter. ``loss_mask`` marks the answer tokens, end-of-turn token included.
"""

from __future__ import annotations

import ast
import textwrap
import time
from pathlib import Path

import torch

from ..decode.continuous import generate_continuous
from ..fetch import real_model_name
from ..model.transformer import Transformer
from ..data.prompts import CHAT_TEMPLATES, code_request, explain_request, review_request, tests_request
from .general_requests import general_requests
from ..model.tokenizer import Tokenizer
from ..data.corpus import PYTHON_SOURCES, Corpus, find_corpus, read_texts
from ..data.answers import AnswerStore, sealed_answers, target_fingerprint
from .common import resumable_chunks

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


def extra_train_snippets(corpus: Corpus, heldout_fraction: float, exclude: set[str], seed: int,
                         held: set[str] | None = None) -> list[str]:
    """Functions to ask about beyond ``corpus``: those of the training split of ``--corpus
    python-sources`` (the standard library + torch, pip, setuptools, triton, ...) in files outside
    ``corpus``, shuffled by ``seed``. A function whose text is in ``exclude`` (the caller's own)
    or anywhere in ``corpus``'s held-out files is left out, so a vendored copy of a held-out
    function never becomes training data. The installed packages vary by machine, and so does
    this list (the answer store asks each request once, by content)."""
    if str(corpus.root) == PYTHON_SOURCES:
        return []
    held = set(function_snippets(read_texts(corpus.heldout))) if held is None else held  # the caller's, if parsed
    own = set(corpus.train) | set(corpus.heldout)
    files = [p for p in find_corpus(PYTHON_SOURCES, heldout_fraction).train if p not in own]
    extra = list(dict.fromkeys(s for s in function_snippets(read_texts(files)) if s not in exclude and s not in held))
    gen = torch.Generator().manual_seed(seed + 1)  # its own stream: the corpus's picks and kinds stay as they were
    return [extra[k] for k in torch.randperm(len(extra), generator=gen).tolist()]


def training_functions(corpus_root: str | None, heldout_fraction: float, n: int, split: str = "train",
                       seed: int = 0, templates: int = len(CHAT_TEMPLATES), extra_functions: bool = False
                       ) -> tuple[list[str], list[int]]:
    """``n`` function snippets of the ``split`` files to ask about, and a request template for each
    (``chat_prompts``). The first picks never depend on ``n``. For the train split, a function whose
    text also occurs in a held-out file is left out (so at most ``n``): the standard library holds
    4 such duplicates among its 5,601 training functions, which the validation and evaluation
    requests could ask about (caught by tests/test_committed_answers.py)."""
    corpus = find_corpus(corpus_root, heldout_fraction)
    files = corpus.train if split == "train" else corpus.part(split)
    snippets = function_snippets(read_texts(files))
    if not snippets:
        raise ValueError(f"{corpus.root}: no function with a docstring in the {split} split")
    if extra_functions and split != "train":
        raise ValueError(f"extra_functions: only for the train split, not {split!r}")
    gen = torch.Generator().manual_seed(seed)
    pool = [snippets[k] for k in torch.randperm(len(snippets), generator=gen).tolist()]
    held = set(function_snippets(read_texts(corpus.heldout))) if split == "train" else set()
    if extra_functions and n > len(pool):
        pool += extra_train_snippets(corpus, heldout_fraction, set(snippets), seed, held)
    picks = [pool[i % len(pool)] for i in range(n)]
    kinds = torch.randint(0, templates, (n,), generator=gen).tolist()
    if split != "train":
        return picks, kinds
    held = {s.strip() for s in held}
    kept = [(s, k) for s, k in zip(picks, kinds) if s.strip() not in held]  # filtered after the draw: the rest keep
    return [s for s, _ in kept], [k for _, k in kept]                       # their order and phrasing


def chat_prompts(tok: Tokenizer, corpus_root: str | None, heldout_fraction: float, n: int, split: str = "train",
                 seed: int = 0, templates: int = len(CHAT_TEMPLATES), explain: bool = False,
                 extra_functions: bool = False) -> list[list[int]]:
    """``n`` chat prompts (token ids) built from function snippets of the ``split`` files: "train",
    or a held-out part — "validation" (a trainer's τ monitor, checkpoint picks), "evaluation"
    (reported figures) or "heldout" (both; ``d3d.data.corpus.Corpus.part``). ``explain``: ask for a
    prose explanation of each function (``explain_request``) instead of its code. Past the split's
    functions the requests repeat them; with ``extra_functions`` (train split only) the functions
    of ``extra_train_snippets`` come first. The first requests never depend on ``n``, so the
    answers to a shorter list are a prefix of a longer one's."""
    picks, kinds = training_functions(corpus_root, heldout_fraction, n, split, seed, templates, extra_functions)
    if explain:
        return [tok.encode_chat(explain_request(s)) for s in picks]
    return [tok.encode_chat(code_request(s, k)) for s, k in zip(picks, kinds)]


REQUEST_KINDS = ("code", "explain", "tests", "review", "chat")


def chat_requests(tok: Tokenizer, corpus_root: str | None, heldout_fraction: float, n: int, seed: int = 0,
                  kinds: tuple[str, ...] = ("code",), extra_functions: bool = False) -> list[tuple[str, list[int]]]:
    """``n`` training requests ``(kind, prompt ids)``, function by function, each function asked
    as each of ``kinds`` in turn: "code" (complete it, ``code_request``, as ``chat_prompts``),
    "explain" (explain it in prose, ``explain_request``: answers like MT-Bench's, where a code
    drafter is weakest), "tests" (write pytest tests for it) and "review" (point out a bug or an
    improvement, in prose); "chat" asks the function's turn of general requests instead
    (``general_requests``: writing, advice, explanations, arithmetic; no function). The sequence of functions
    does not depend on which kinds are asked: a store made with code+explain grows with code+explain+tests by
    the tests of the functions it holds (and all three of later functions)."""
    if not kinds or any(k not in REQUEST_KINDS for k in kinds):
        raise ValueError(f"request kinds {kinds!r}: expected one or more of {', '.join(REQUEST_KINDS)}")
    per_kind = -(-n // len(kinds))
    picks, templates = training_functions(corpus_root, heldout_fraction, per_kind, "train", seed,
                                          extra_functions=extra_functions)
    general = general_requests(per_kind, seed) if "chat" in kinds else []
    ask = {"code": lambda i, s, t: code_request(s, t), "explain": lambda i, s, t: explain_request(s),
           "tests": lambda i, s, t: tests_request(s), "review": lambda i, s, t: review_request(s),
           "chat": lambda i, s, t: general[i]}
    return [(k, tok.encode_chat(ask[k](i, s, t))) for i, (s, t) in enumerate(zip(picks, templates))
            for k in kinds][:n]


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


def store_rows(store_dir: str | Path, share: float, n_main: int, window: int, pad_id: int, seed: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows from another answer store (read only, any model's answers: e.g. a smaller model's to the
    same kind of requests) making ``share`` of the training rows beside ``n_main`` of the target's:
    a seeded random subset of its answers, all of them when it holds fewer."""
    have = sealed_answers(store_dir)
    if not have:
        raise ValueError(f"--also-answers {store_dir}: the store holds no sealed answers")
    want = min(len(have), round(n_main * share / (1 - share)))
    pick = torch.randperm(len(have), generator=torch.Generator().manual_seed(seed))[:want].sort().values.tolist()
    return to_windows([have[i].prompt for i in pick], [have[i].answer for i in pick], window, pad_id)


PROGRESS_EVERY = 64  # answers between progress lines inside a batch


@torch.no_grad()
def make_chat_training_data(target: Transformer, tok: Tokenizer, corpus_root: str | None, heldout_fraction: float,
                            n_sequences: int, gen_len: int, window: int, seed: int, store_dir: Path,
                            batch: int = 512, slots: int = 64, minutes: float | None = None, extra_functions: bool = False,
                            kinds: tuple[str, ...] = ("code",), log=print) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, loss_mask)`` ``[rows, window]``: every answer in the store at ``store_dir``
    (``AnswerStore``), after answering requests (``chat_requests``) it does not hold yet until it
    holds ``n_sequences``. Answers are generated ``slots`` sequences in flight (continuous
    batching, ``d3d.decode.continuous``) and kept after every ``batch`` requests (a killed call's answers
    are sealed by the next); ``minutes``: stop generating after this much wall time and seal what
    was made — data in chunks that fit a session."""
    store = AnswerStore(store_dir, target_fingerprint(target), gen_len, real_model_name(target.source))
    dtype = str(target.embed_tokens.weight.dtype).removeprefix("torch.")
    if store.seal(None, dtype):
        log(f"{store.root}: sealed the answers a killed call left pending")
    have = store.sealed()
    if len(have) < n_sequences and minutes != 0:  # --data-minutes 0: train on what the store holds
        asked, todo = {tuple(a.prompt) for a in have}, []
        for kind, prompt in chat_requests(tok, corpus_root, heldout_fraction, n_sequences, seed, kinds, extra_functions):
            if tuple(prompt) not in asked and len(todo) < n_sequences - len(have):  # past the pool, requests repeat
                asked.add(tuple(prompt))
                todo.append((kind, prompt))
        log(f"{store.root}: {len(have)} answers stored, answering {len(todo)} more requests")
        store.prepare()
        stops, t0 = tok.stop_token_ids(), time.perf_counter()

        def answer(i: int, j: int) -> list[tuple[str, list[int], list[int]]]:
            done = 0

            def progress(*_):  # a line every PROGRESS_EVERY answers: a batch of 512 takes ~10 min on the 1.5B
                nonlocal done
                done += 1
                if done % PROGRESS_EVERY == 0 and done < j - i:
                    log(f"target answers: {i + done}/{len(todo)} (this batch {done}/{j - i}, "
                        f"{time.perf_counter() - t0:.0f} s)")

            out = generate_continuous(target, [p for _, p in todo[i:j]], gen_len, stop_ids=stops, slots=slots,
                                      on_done=progress)
            return [(k, p, a) for (k, p), a in zip(todo[i:j], out)]

        resumable_chunks(store.pending_path, len(todo), batch, answer, "target answers", "answer tok",
                         lambda rows: sum(len(a) for _, _, a in rows), minutes, log)
        if record := store.seal(time.perf_counter() - t0, dtype):
            log(f"{store.root / record['file']}: sealed {record['rows']} answers ({record['answer_tokens']} tokens)")
        have = store.sealed()
    if not have:
        raise ValueError(f"{store.root}: no answers to train on (--data-minutes {minutes} made none)")
    pad = tok.token_id("<|endoftext|>") or 0
    return to_windows([a.prompt for a in have], [a.answer for a in have], window, pad)
