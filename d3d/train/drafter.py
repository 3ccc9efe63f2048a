"""Training the D3D drafter (``python -m d3d train-drafter``).

1. Data: the *target's own* greedy continuations of prompts drawn from the training split of the
   corpus, so the drafter learns what the target will say (cached on disk); or (``data="teacher"``)
   windows of training text with the target's greedy choice at every position as the label, from
   one target pass per window (teacher forcing: ~``window`` labels per pass instead of one).
2. Objective (BD3-LM, vectorised): the input is ``x_t ⊕ x_0`` (a noised copy of the sequence,
   then the clean copy), both halves at the same positions, under the mask of
   ``training_mask``. Each block of B tokens of ``x_t`` is noised in one of three ways:
     all-mask   every position masked (what async drafting sees: even the bonus is unknown),
     anchored   position 0 clean, the rest masked (synchronous drafting after the anchor),
     partial    a random subset masked (what later steps of multi-step denoising see).
   The loss is cross-entropy on masked positions, weighted ``exp(-(k-1)/γ)`` for the k-th
   position after the block start (or after the anchor): early positions matter most, because
   a draft is accepted only up to its first mistake.
3. Evaluation: acceptance length τ against the real target on held-out prompts (greedy, the
   sync engine), not only loss — a leaky mask gives a low loss and a useless drafter.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..model.checkpoint import SHARED_EMBEDDINGS, load_model, read_state
from ..model.config import ModelConfig
from ..data.corpus import find_corpus, read_texts, training_corpus
from ..draft.drafter import DRAFT_VOCAB, Drafter, DrafterConfig, draft_head, drafter_model_config, save_drafter
from ..decode.engines import generate
from ..files import write_json
from ..kernels.attention import bd3_training_mask
from ..model.transformer import Transformer
from ..cpu.precision import resolve_dtype
from ..data.prompts import heldout_prompts
from ..model.tokenizer import Tokenizer
from .bd3_compact import compact_layout, grouped_batch, kept_length, length_order
from .chat_data import REQUEST_KINDS, chat_prompts, make_chat_training_data, store_rows
from .common import labels_cache, make_optimizer, resumable_rows, save_atomic
from .soft_labels import make_soft_labels, soft_cross_entropy
from .loop import TrainSettings, train_loop
from .target import token_stream
from ..decode.config import SpecConfig

BLOCK_KINDS = ("all-mask", "anchored", "partial")


def training_mask(L: int, block_size: int, clean: str = "causal", device=None) -> torch.Tensor:
    """Bool ``[2L, 2L]`` mask over ``x_t ⊕ x_0`` (True = may attend).

    ``clean="block"`` is BD3-LM's mask exactly (docs/design.md §4): clean tokens see their own block
    bidirectionally. ``clean="causal"`` (the default here) makes the clean half token-causal,
    because at inference the drafter caches committed tokens one by one, causally; noisy blocks
    see every clean token of earlier blocks and their own block, in both variants.
    """
    mask = bd3_training_mask(L, block_size, device=device)
    if clean == "causal":
        mask[L:, L:] = torch.ones(L, L, dtype=torch.bool, device=device).tril()
    elif clean != "block":
        raise ValueError(f"clean={clean!r}: expected 'causal' or 'block'")
    return mask


def noise_blocks(x0: torch.Tensor, block_size: int, mask_id: int, mix: tuple[float, float, float],
                 gamma: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Noise ``x0`` [batch, L] block by block. Returns ``(x_t, weight)``: weight [batch, L] is the
    loss weight of each position (0 where not masked)."""
    b, L = x0.shape
    nb = L // block_size
    kinds = torch.multinomial(torch.tensor(mix, dtype=torch.float), b * nb, replacement=True, generator=gen).view(b, nb, 1)
    j = torch.arange(block_size).view(1, 1, -1)  # position inside the block
    rate = torch.rand(b, nb, 1, generator=gen)
    partial = torch.rand(b, nb, block_size, generator=gen) < rate
    partial[..., 0] |= ~partial.any(-1)  # at least one masked position
    masked = torch.where(kinds == 0, torch.ones_like(partial),
                         torch.where(kinds == 1, (j > 0).expand_as(partial), partial))
    k = torch.where(kinds == 1, j, j + 1).float()  # k-th position after the block start / anchor
    weight = torch.exp(-(k - 1) / gamma) * masked
    xt = torch.where(masked.view(b, L), torch.full_like(x0, mask_id), x0)
    return xt, weight.view(b, L)


def greedy_chain(x0: torch.Tensor, labels: torch.Tensor, masked: torch.Tensor, block_size: int) -> torch.Tensor:
    """``[batch, L]`` bool: where a teacher label is the target's greedy continuation of what the
    drafter sees.

    ``labels[j]`` = argmax p(. | x0[:j]) is conditioned on the real tokens at the masked positions
    before j in its block, which the drafter cannot see. At inference those positions hold the
    target's own greedy tokens, so the label is the right one only if every masked position
    i < j of the block has ``x0[i] == labels[i]`` (then x0 up to j *is* the greedy chain from the
    visible context). Past the first disagreement the label is the target's choice after text it
    would not have written. Measured on target-16m (``docs/results/teacher-labels``, 1,500 steps of
    the bundled drafter's schedule): validation τ 2.26 with the rule, 2.15 without, 2.89 from
    generated continuations — the target agrees with real text at 56% of positions, so the chain
    keeps only 20% of an all-mask block's labels; the text, not the rule, is the gap.
    """
    b, L = x0.shape
    off = (masked & (x0 != labels)).view(b, L // block_size, block_size).int()
    return (off.cumsum(-1) - off == 0).view(b, L)  # no disagreement strictly before j in the block


def bd3_loss(model: Transformer, x0: torch.Tensor, loss_mask: torch.Tensor, attn_mask: torch.Tensor,
             block_size: int, mask_id: int, mix, gamma: float, gen: torch.Generator,
             label_map: torch.Tensor | None = None, labels: torch.Tensor | None = None,
             chain: bool = True, compact: bool = True,
             soft: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Weighted cross-entropy on the masked positions of ``x_t`` (see the module docstring).

    loss_mask: ``[L]`` or ``[batch, L]`` (1 where a token is supervised). label_map: ``[V]``
    target id -> drafting-vocabulary index (-1 outside it: not supervised), for a reduced head.
    labels: ``[batch, L]`` what each position should predict (default ``x0`` itself; teacher
    forcing: the target's greedy token after ``x0[:, :j]``, supervised only along the greedy
    chain (``greedy_chain``) unless ``chain`` is False). compact: leave out the positions no
    supervised logit depends on (``bd3_compact``; the same loss, fewer positions). soft: ``(ids,
    probs)`` ``[batch, L, k]``, the target's top-k distribution at each position
    (``soft_labels``): the cross-entropy to it replaces the hard label's.
    """
    b, L = x0.shape
    xt, weight = noise_blocks(x0, block_size, mask_id, mix, gamma, gen)
    if labels is not None and chain:
        weight = weight * greedy_chain(x0, labels, xt == mask_id, block_size)
    labels = x0 if labels is None else labels
    labels = labels if label_map is None else label_map[labels]
    weight = weight * loss_mask * (labels >= 0)
    sel = weight.flatten().nonzero().squeeze(1)
    if compact:
        ids, positions, attn_mask, rows = compact_layout(xt, x0, weight, attn_mask, block_size)
    else:
        ids, positions = torch.cat([xt, x0], dim=1), torch.arange(L).repeat(2)
        rows = sel // L * (2 * L) + sel % L  # index of each selected x_t position in the [b, 2L] input
    logits = model(ids, attn_mask=attn_mask, positions=positions, logits_index=rows)
    if soft is None:
        ce = F.cross_entropy(logits.float(), labels.flatten()[sel], reduction="none")
    else:
        ce = soft_cross_entropy(logits, soft[0].flatten(0, 1)[sel], soft[1].flatten(0, 1)[sel], label_map)
    w = weight.flatten()[sel]
    return (ce * w).sum() / w.sum()


# ----------------------------------------------------------------------------- data


@torch.no_grad()
def make_training_data(target: Transformer, tok: Tokenizer, corpus_root: str | None, heldout_fraction: float,
                       n_sequences: int, prompt_len: int, gen_len: int, seed: int, cache_dir: Path,
                       batch: int = 32, log=print) -> torch.Tensor:
    """``[n_sequences, prompt_len + gen_len]``: corpus prompts + the target's greedy continuation
    (generated in ``target``'s dtype: pass the dtype policy's copy, bf16 where the CPU is fast at it)."""
    corpus = find_corpus(corpus_root, heldout_fraction)
    path, partial, cached = labels_cache(cache_dir, "drafter-data", target, json.dumps(
        [str(corpus.root), len(corpus.train), n_sequences, prompt_len, gen_len, seed]).encode(),
        "target continuations", log)
    if cached is not None:
        return cached
    stream = token_stream(tok, read_texts(corpus.train))
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, stream.numel() - prompt_len, (n_sequences,), generator=gen)
    prompts = torch.stack([stream[s: s + prompt_len] for s in starts.tolist()])

    def continue_rows(i: int, j: int) -> torch.Tensor:
        rows = []
        for k in range(i, j, batch):
            p = prompts[k: min(k + batch, j)]
            out = generate(target, p.tolist(), max_new_tokens=gen_len, stop_ids=[])
            rows.append(torch.cat([p, torch.tensor(out.tokens)], dim=1))
        return torch.cat(rows)

    what = f"target continuations ({str(target.dtype).removeprefix('torch.')})"
    data = resumable_rows(partial, n_sequences, 4 * batch, continue_rows, what, gen_len, "tok", log)
    save_atomic(data, path)
    partial.unlink(missing_ok=True)
    return data


@torch.no_grad()
def teacher_labels(target: Transformer, windows: torch.Tensor, batch: int = 16) -> torch.Tensor:
    """The target's greedy token at every position of ``windows`` [N, L] given the real tokens
    before it: ``labels[:, j] = argmax p(. | windows[:, :j])`` for j >= 1; ``labels[:, 0]`` = -1
    (no context: never supervised)."""
    labels = torch.full_like(windows, -1)
    for i in range(0, windows.shape[0], batch):
        w = windows[i: i + batch].to(target.device)
        labels[i: i + batch, 1:] = target(w[:, :-1]).argmax(-1).cpu()
    return labels


@torch.no_grad()
def make_teacher_data(target: Transformer, tok: Tokenizer, corpus_root: str | None, heldout_fraction: float,
                      n_windows: int, window: int, seed: int, cache_dir: Path, batch: int = 16,
                      log=print) -> tuple[torch.Tensor, torch.Tensor]:
    """``(windows, labels)`` [n_windows, window]: random windows of the training split and the
    target's greedy token at every position (``teacher_labels``), cached, resumable by chunks."""
    corpus = find_corpus(corpus_root, heldout_fraction)
    path, partial, cached = labels_cache(cache_dir, "teacher", target, json.dumps(
        [str(corpus.root), len(corpus.train), n_windows, window, seed]).encode(), "teacher labels", log)
    if cached is not None:
        return cached["windows"], cached["labels"]
    stream = token_stream(tok, read_texts(corpus.train))
    if stream.numel() <= window:
        raise ValueError(f"corpus {corpus.root}: {stream.numel()} training tokens, fewer than one --window {window}")
    starts = torch.randint(0, stream.numel() - window, (n_windows,), generator=torch.Generator().manual_seed(seed))
    windows = torch.stack([stream[s: s + window] for s in starts.tolist()])
    chunk = max(batch, 1024 // window * batch)  # a partial save every few passes
    what = f"teacher labels ({str(target.dtype).removeprefix('torch.')})"
    labels = resumable_rows(partial, n_windows, chunk, lambda i, j: teacher_labels(target, windows[i: j], batch),
                            what, window, "labels", log)
    save_atomic({"windows": windows, "labels": labels}, path)
    partial.unlink(missing_ok=True)
    return windows, labels


def labelling_model(target_dir: str, fp32_target: Transformer) -> Transformer:
    """The target that writes the training data: in the dtype policy's choice (bf16 where the CPU
    multiplies bf16 fast — what the target runs in at inference there, and faster to generate
    with: docs/results/real-drafter/labelling_throughput.json), else the fp32 copy already loaded."""
    if resolve_dtype("auto", fp32_target.device) == torch.float32:
        return fp32_target
    return load_model(target_dir)


def measure_tau(target: Transformer, drafter: Drafter, prompts: list[list[int]], max_new_tokens: int,
                block_size: int | None = None, batch: int = 8, stop_ids=()) -> dict:
    """Greedy sync speculative decoding over ``prompts``: τ and the acceptance histogram
    (``stop_ids``: end generation there, e.g. a chat model's end-of-turn token). The drafter's own
    τ: no bonus leaves, no copied drafts, no plain steps and no cut drafts (``leaves=0, lookup=0,
    verify_min_prob=0``: the row price's cuts and a batch's plain steps depend on timing), as every τ
    monitor before them."""
    hist, rounds = None, 0
    for i in range(0, len(prompts), batch):
        out = generate(target, prompts[i: i + batch], max_new_tokens=max_new_tokens, drafter=drafter,
                       stop_ids=list(stop_ids),
                       spec=SpecConfig(mode="sync", block_size=block_size, lookup=0, leaves=0, verify_min_prob=0.0))
        hist = out.stats.accept_hist if hist is None else [a + b for a, b in zip(hist, out.stats.accept_hist)]
        rounds += out.stats.rounds
    tau = sum((a + 1) * c for a, c in enumerate(hist)) / rounds
    return {"tau": tau, "rounds": rounds, "accept_hist": hist}


# ----------------------------------------------------------------------------- training


@dataclass(kw_only=True)
class DrafterTrainConfig(TrainSettings):
    target: str
    base: str | None = None  # a real model (d3d.fetch's name) the drafter is built from instead of the target
    num_layers: int = 3
    block_size: int = 16
    shared_embeddings: bool = True
    init_from_target: bool = True
    n_sequences: int = 4096
    prompt_len: int = 32
    gen_len: int = 224
    gamma: float = 7.0
    mix: tuple[float, float, float] = (0.45, 0.45, 0.10)  # all-mask, anchored, partial
    clean_mask: str = "causal"
    eval_prompts: int = 8
    eval_new_tokens: int = 64
    data: str = "windows"  # "windows": corpus windows + continuation; "chat": chat requests + answers;
    # "teacher": corpus windows labelled by the target at every position (one pass per window)
    teacher_chain: bool = True  # teacher labels: supervise only along the greedy chain (greedy_chain)
    window: int = 256  # chat data: tokens per training row (last `window` of prompt + answer)
    data_minutes: float | None = None  # chat data: generate answers for at most this long, then train on those made
    extra_functions: bool = False  # chat data: past the corpus's functions, other installed packages' (extra_train_snippets)
    data_only: bool = False  # make (or extend) the cached data, then stop without training
    answers: str | None = None  # chat data: the answer store (AnswerStore); None: OUT/data/answers
    also_answers: str | None = None  # chat data: another store whose answers make also_share of the rows
    also_share: float = 0.5
    requests: str = "code"  # chat data: request kinds asked of each function, "+"-joined (chat_requests)
    init_drafter: str | None = None  # start from this saved drafter's weights and drafting vocabulary (fresh optimizer)
    fresh_vocab: bool = False  # with init_drafter: the drafting vocabulary chosen afresh from this run's data
    soft_labels: int = 0  # k > 0: train on the target's top-k distributions (one more target pass per row)
    draft_vocab: int = 0  # K > 0: reduced drafting vocabulary of the K most frequent answer ids
    mask_token_id: int = -1  # -1: <|mask|>, or else the first embedding row past the tokenizer's ids


def init_from_target_layers(model: Transformer, target: Transformer) -> None:
    """Copy evenly spaced target layers (first and last included) and the final norm into a
    drafter of the target's layer shape: a representation-compatible start."""
    n, L = model.cfg.num_hidden_layers, target.cfg.num_hidden_layers
    for i in range(n):
        model.layers[i].load_state_dict(target.layers[round(i * (L - 1) / max(1, n - 1))].state_dict())
    model.norm.load_state_dict(target.norm.state_dict())


def pick_mask_id(tok: Tokenizer, vocab_size: int, asked: int = -1) -> int:
    """The drafter's mask token: ``asked``, else ``<|mask|>``, else the first embedding row no
    token of the tokenizer uses (Qwen2.5 pads its 151,665 ids to 151,936 rows: the row is an
    untrained but fixed vector, which is all a mask needs to be)."""
    if asked >= 0:
        if asked >= vocab_size:
            raise ValueError(f"--mask-token-id={asked}: outside the target's vocabulary ({vocab_size})")
        return asked
    mask_id = tok.token_id("<|mask|>")
    if mask_id is not None:
        return mask_id
    used = tok._tok.get_vocab_size(with_added_tokens=True)
    if used >= vocab_size:
        raise ValueError(f"{tok.source}: no <|mask|> token and no spare embedding row; pass --mask-token-id")
    return used


def frequent_ids(ids: torch.Tensor, weight: torch.Tensor, k: int, vocab_size: int) -> torch.Tensor:
    """The ``k`` target ids most frequent where ``weight`` > 0 (sorted by id), the drafting vocabulary."""
    counts = torch.bincount(ids[weight > 0], minlength=vocab_size)
    return counts.topk(min(k, vocab_size)).indices.sort().values


def drafting_vocabulary(ids: torch.Tensor, weight: torch.Tensor, k: int, vocab_size: int, path: Path,
                        resume: bool, log=print) -> torch.Tensor:
    """``frequent_ids`` of the training data, kept in ``path``: a resumed run reuses the ids it
    started with even when its data has grown since (the trained head rows follow those ids)."""
    if resume and path.is_file():
        vocab_map = torch.load(path)
        if vocab_map.numel() != min(k, vocab_size):
            raise ValueError(f"--draft-vocab={k}: the run being resumed drafts over {vocab_map.numel()} ids ({path})")
        log(f"drafting vocabulary: the resumed run's {vocab_map.numel()} ids ({path})")
        return vocab_map
    vocab_map = frequent_ids(ids, weight, k, vocab_size)
    save_atomic(vocab_map, path)
    return vocab_map


def base_dir(cfg: DrafterTrainConfig, tok: Tokenizer, log=print) -> str:
    """The directory of the model a drafter is built from: ``--base``'s (fetched where missing),
    which must speak the target's tokenizer, else the target's own."""
    if cfg.base is None:
        return cfg.target
    from ..fetch import fetch

    path = fetch(cfg.base, log=log)
    if Tokenizer.load(path)._tok.get_vocab(with_added_tokens=True) != tok._tok.get_vocab(with_added_tokens=True):
        raise ValueError(f"--base {cfg.base}: its tokenizer ({path}) is not the target's ({cfg.target}): "
                         f"a drafter reads and writes its target's tokens")
    return str(path)


def build_drafter(target: Transformer, tok: Tokenizer, cfg: DrafterTrainConfig,
                  vocab_map: torch.Tensor | None = None, embeddings_from: str = "") -> Drafter:
    """A drafter of ``target``'s layer shape (``target``: the ``--base`` model where one is named),
    initialised from its layers; its embedding and head shared (frozen) or copied. Its config names
    ``embeddings_from`` (default ``--base``) as where they are borrowed from."""
    mask_id = pick_mask_id(tok, target.cfg.vocab_size, cfg.mask_token_id)
    dcfg = DrafterConfig(block_size=cfg.block_size, mask_token_id=mask_id, target_vocab=target.cfg.vocab_size,
                         shared_embeddings=cfg.shared_embeddings, embeddings_from=cfg.base or embeddings_from,
                         draft_vocab_size=0 if vocab_map is None else vocab_map.numel())
    if not 1 <= cfg.num_layers:
        raise ValueError(f"--num-layers={cfg.num_layers}: must be >= 1")
    model = Transformer(drafter_model_config(target.cfg, cfg.num_layers, dcfg))
    src = model.state_dict()
    if cfg.init_from_target:
        init_from_target_layers(model, target)
    else:
        gen = torch.Generator().manual_seed(cfg.seed)
        for name, p in src.items():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    if cfg.shared_embeddings:  # frozen and shared: the drafter file will not contain them
        model.embed_tokens = target.embed_tokens
        model.lm_head = target.lm_head if vocab_map is None else draft_head(target, vocab_map)
    else:  # the drafter's own copies, starting from the target's
        model.embed_tokens.weight.data.copy_(target.embed_tokens.weight.data)
        if model.lm_head is not None:
            model.lm_head.weight.data.copy_(target.lm_head.weight.data)
    return Drafter(model, dcfg, vocab_map)


def saved_drafter_weights(path: str, cfg: DrafterTrainConfig, mask_id: int
                          ) -> tuple[dict, torch.Tensor | None, str]:
    """The own weights (dequantized when stored as int8), the drafting vocabulary and the ``embeddings_from`` of
    the drafter saved at ``path``: a run that starts from a committed drafter when no training state survives.
    Its shape must be the one ``cfg`` trains."""
    mcfg = ModelConfig.load(path)
    source = f"--init-drafter {path}"
    dcfg = DrafterConfig.from_model_config(mcfg, str(Path(path) / "config.json"))
    theirs = (mcfg.num_hidden_layers, dcfg.block_size, dcfg.draft_vocab_size, dcfg.shared_embeddings, dcfg.mask_token_id)
    ours = (cfg.num_layers, cfg.block_size, cfg.draft_vocab, cfg.shared_embeddings, mask_id)
    if theirs != ours:
        raise ValueError(f"{source}: (layers, block size, drafting vocabulary, shared embeddings, mask id) = {theirs}, "
                         f"but this run trains {ours}: pass the same --num-layers, --block-size, --draft-vocab")
    K = dcfg.draft_vocab_size
    state, extra = read_state(Path(path), mcfg, skip=SHARED_EMBEDDINGS if dcfg.shared_embeddings else (),
                              extra={DRAFT_VOCAB: (K,)} if K else None)
    return {k: v.float() for k, v in state.items()}, extra[DRAFT_VOCAB] if K else None, dcfg.embeddings_from


def initial_drafter(cfg: DrafterTrainConfig, tok: Tokenizer, base: Transformer, log=print
                    ) -> tuple[dict | None, torch.Tensor | None, str]:
    """``--init-drafter``'s weights, drafting vocabulary (None with ``--fresh-vocab``: chosen from this run's data;
    the head rows are the target's, so only which ids are scored changes) and the model its embeddings come from;
    without one (None, None, "")."""
    if not cfg.init_drafter:
        return None, None, ""
    state, vocab_map, lender = saved_drafter_weights(cfg.init_drafter, cfg,
                                                     pick_mask_id(tok, base.cfg.vocab_size, cfg.mask_token_id))
    log(f"starting from the drafter in {cfg.init_drafter} (its weights"
        f"{', a drafting vocabulary chosen afresh' if cfg.fresh_vocab else ' and drafting vocabulary'})")
    return state, None if cfg.fresh_vocab else vocab_map, lender


def check_train_config(cfg: DrafterTrainConfig) -> tuple[str, ...]:
    """Named errors for arguments that do not fit together (before any data is made: that may take
    an hour). Returns the request kinds of ``--requests``."""
    if cfg.block_size < 2 or cfg.gen_len % cfg.block_size or cfg.prompt_len % cfg.block_size:
        raise ValueError(f"--prompt-len ({cfg.prompt_len}) and --gen-len ({cfg.gen_len}) must be multiples of "
                         f"--block-size ({cfg.block_size}) >= 2")
    if cfg.data not in ("windows", "chat", "teacher"):
        raise ValueError(f"--data={cfg.data!r}: expected 'windows', 'chat' or 'teacher'")
    if cfg.data in ("chat", "teacher") and cfg.window % cfg.block_size:
        raise ValueError(f"--window ({cfg.window}) must be a multiple of --block-size ({cfg.block_size})")
    if cfg.soft_labels < 0:
        raise ValueError(f"--soft-labels={cfg.soft_labels}: must be >= 0 (0: hard labels)")
    if cfg.soft_labels and cfg.data == "teacher":
        raise ValueError("--soft-labels needs the target's own text (--data chat or windows), not --data teacher")
    if cfg.extra_functions and cfg.data != "chat":
        raise ValueError("--extra-functions asks about more functions: it needs --data chat")
    kinds = tuple(cfg.requests.split("+"))
    if any(k not in REQUEST_KINDS for k in kinds) or len(set(kinds)) != len(kinds):
        raise ValueError(f"--requests={cfg.requests!r}: expected kinds among {', '.join(REQUEST_KINDS)}, "
                         f"each once, joined by '+' (e.g. code+explain)")
    if (cfg.answers or cfg.also_answers or cfg.requests != "code") and cfg.data != "chat":
        raise ValueError("--answers, --also-answers and --requests are about chat answers: they need --data chat")
    if not 0 < cfg.also_share < 1:
        raise ValueError(f"--also-share={cfg.also_share}: must lie strictly between 0 and 1")
    if cfg.also_answers:  # before any data is made
        from ..data.answers import read_manifest

        read_manifest(cfg.also_answers)
    if cfg.draft_vocab and not cfg.shared_embeddings:
        raise ValueError("--draft-vocab needs the shared (target's) embedding and LM head")
    if cfg.fresh_vocab and not (cfg.init_drafter and cfg.draft_vocab):
        raise ValueError("--fresh-vocab chooses the drafting vocabulary of an --init-drafter afresh: it needs "
                         "--init-drafter and --draft-vocab K")
    if cfg.base is not None:
        from ..fetch import is_real_model

        if not is_real_model(cfg.base):
            raise ValueError(f"--base={cfg.base!r}: expected a real model d3d fetches (python -m d3d fetch --help "
                             f"lists them): the drafter records its name and borrows its embeddings on any machine")
        if not cfg.shared_embeddings:
            raise ValueError("--base lends the drafter its embeddings: it needs shared embeddings, not --own-embeddings")
    return kinds


@dataclass
class TrainingData:
    """Rows ``[N, L]`` of token ids and what the loss sees of them."""

    ids: torch.Tensor
    loss_mask: torch.Tensor  # [N, L] float: 1 where the token is a label
    labels: torch.Tensor | None  # teacher data: [N, L] the target's choice per position (-1: none); else the ids
    soft: tuple[torch.Tensor, torch.Tensor] | None  # --soft-labels k: the target's top-k (ids, probs) per position
    eval_prompts: list[list[int]]  # validation prompts of the τ monitor
    where: Path  # the directory the data is cached in

    @property
    def label_ids(self) -> torch.Tensor:
        return self.ids if self.labels is None else self.labels.clamp(min=0)


def training_data(cfg: DrafterTrainConfig, labeller: Transformer, tok: Tokenizer, kinds: tuple[str, ...],
                  log=print) -> TrainingData:
    """The data of ``cfg.data`` (made by ``labeller``, cached under ``cfg.out``/data or ``--answers``):
    the target's answers to chat requests, teacher-forced windows of training text, or the target's
    continuations of training prompts."""
    out, labels = Path(cfg.out) / "data", None
    if cfg.data == "teacher":
        ids, labels = make_teacher_data(labeller, tok, cfg.corpus, cfg.heldout_fraction, cfg.n_sequences, cfg.window,
                                        cfg.seed, out, log=log)
        loss_mask = (labels >= 0).float()
        eval_prompts = heldout_prompts(tok, cfg.corpus, cfg.heldout_fraction, cfg.eval_prompts, cfg.prompt_len)
    elif cfg.data == "chat":
        out = Path(cfg.answers) if cfg.answers else out / "answers"
        ids, loss_mask = make_chat_training_data(labeller, tok, cfg.corpus, cfg.heldout_fraction, cfg.n_sequences,
                                                 cfg.gen_len, cfg.window, cfg.seed, out, minutes=cfg.data_minutes,
                                                 extra_functions=cfg.extra_functions, kinds=kinds, log=log)
        eval_prompts = chat_prompts(tok, cfg.corpus, cfg.heldout_fraction, cfg.eval_prompts, "validation", seed=1234,
                                    templates=1)
        if cfg.also_answers and not cfg.data_only:
            more = store_rows(cfg.also_answers, cfg.also_share, ids.shape[0], cfg.window,
                              tok.token_id("<|endoftext|>") or 0, cfg.seed)
            log(f"{cfg.also_answers}: {more[0].shape[0]} rows beside the target's {ids.shape[0]}")
            ids, loss_mask = torch.cat([ids, more[0]]), torch.cat([loss_mask, more[1]])
    else:
        ids = make_training_data(labeller, tok, cfg.corpus, cfg.heldout_fraction, cfg.n_sequences, cfg.prompt_len,
                                 cfg.gen_len, cfg.seed, out, log=log)
        loss_mask = (torch.arange(ids.shape[1]) >= cfg.prompt_len).float().expand_as(ids)  # continuations only
        eval_prompts = heldout_prompts(tok, cfg.corpus, cfg.heldout_fraction, cfg.eval_prompts, cfg.prompt_len)
    soft = None
    if cfg.soft_labels:  # a chat row's tokens end with its answer; the right padding after it is never a label
        lengths = (loss_mask * torch.arange(1, ids.shape[1] + 1)).amax(1).long()
        soft = make_soft_labels(labeller, ids, lengths, cfg.soft_labels, Path(cfg.out) / "data", log=log)
    return TrainingData(ids, loss_mask, labels, soft, eval_prompts, out)


def drafting_labels(data: TrainingData, cfg: DrafterTrainConfig, vocab_size: int, vocab_map: torch.Tensor | None,
                    resume: bool, log=print) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``--draft-vocab k``: (the drafting vocabulary: k target ids, chosen from the data unless an
    initial drafter brought one; ``label_map`` [vocab_size]: target id -> drafting id, -1 outside)."""
    if not cfg.draft_vocab:
        return vocab_map, None
    if vocab_map is None:
        vocab_map = drafting_vocabulary(data.label_ids, data.loss_mask, cfg.draft_vocab, vocab_size,
                                        Path(cfg.out) / "draft_vocab.pt", resume, log)
    label_map = torch.full((vocab_size,), -1, dtype=torch.long)
    label_map[vocab_map] = torch.arange(vocab_map.numel())
    covered = (label_map[data.label_ids] >= 0)[data.loss_mask > 0].float().mean().item()
    log(f"drafting vocabulary: {vocab_map.numel()} of {vocab_size} ids cover "
        f"{100 * covered:.2f}% of the supervised training tokens")
    return vocab_map, label_map


def trainable_parameters(model: Transformer, shared_embeddings: bool) -> list[torch.nn.Parameter]:
    """Every parameter but the target's embedding and LM head where they are shared (frozen)."""
    trainable = [p for n, p in model.named_parameters()
                 if not (shared_embeddings and ("embed_tokens" in n or "lm_head" in n))]
    for p in model.parameters():
        p.requires_grad_(False)
    for p in trainable:
        p.requires_grad_(True)
    return trainable


def training_models(cfg: DrafterTrainConfig, tok: Tokenizer, log=print) -> tuple[Transformer, Transformer, Transformer]:
    """(base, target, labeller): the model the drafter is built from (layers, embedding, head rows; fp32
    master weights, a quantized checkpoint dequantized: compute_dtype autocasts the matmuls), the
    target that verifies the τ monitor, and the one that writes the answers (``labelling_model``)."""
    base = load_model(base_dir(cfg, tok, log), weights="float32")
    if cfg.base is None:
        return base, base, labelling_model(cfg.target, base)
    target = load_model(cfg.target)
    if base.cfg.vocab_size != target.cfg.vocab_size:
        raise ValueError(f"--base {cfg.base}: {base.cfg.vocab_size} embedding rows, the target "
                         f"{target.cfg.vocab_size}: a drafter drafts in its target's vocabulary")
    return base, target, target


def train_drafter(cfg: DrafterTrainConfig, resume: bool = False, log=print) -> dict:
    """Make (or reuse) the data, build the drafter (from target layers or ``--init-drafter``), train
    it with the BD3 loss under the τ monitor (``train_loop``), save it and ``train_summary.json``."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    kinds = check_train_config(cfg)
    tok = Tokenizer.load(cfg.target)
    base, target, labeller = training_models(cfg, tok, log)
    init_state, vocab_map, lender = initial_drafter(cfg, tok, base, log)  # before the data: it may take an hour
    data = training_data(cfg, labeller, tok, kinds, log)
    if cfg.data_only:
        log(f"--data-only: {data.ids.shape[0]} rows of training data in {data.where}; no training")
        return {"history": [], "data_rows": data.ids.shape[0]}
    N, L = data.ids.shape
    vocab_map, label_map = drafting_labels(data, cfg, target.cfg.vocab_size, vocab_map, resume, log)
    drafter = build_drafter(base, tok, cfg, vocab_map, lender)
    model = drafter.model
    if init_state is not None:  # a resumed run's training state, loaded by train_loop, overrides these
        missing = [k for k in model.load_state_dict(init_state, strict=False).missing_keys
                   if k not in SHARED_EMBEDDINGS or not cfg.shared_embeddings]
        if missing:
            raise ValueError(f"--init-drafter {cfg.init_drafter}: no weights for {missing[:4]}")
    model.train()
    trainable = trainable_parameters(model, cfg.shared_embeddings)
    optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay)
    n_train = sum(p.numel() for p in trainable)
    log(f"drafter: {cfg.num_layers} layers, {n_train / 1e6:.2f}M trainable parameters; {N} sequences of {L} tokens")

    # Chat rows vary in length (prompt + answer, right-padded): batches of similar rows pad less
    # in the compacted pass (bd3_compact: 320 instead of 404 positions a row on the Qwen data).
    order = length_order(kept_length(data.loss_mask, cfg.block_size), cfg.seed) if cfg.data == "chat" else None
    attn_mask = training_mask(L, cfg.block_size, cfg.clean_mask)

    def loss_fn(step, gen):
        idx = (torch.randint(0, N, (cfg.batch_size,), generator=gen) if order is None
               else grouped_batch(order, cfg.batch_size, gen))
        loss = bd3_loss(model, data.ids[idx], data.loss_mask[idx], attn_mask, cfg.block_size,
                        drafter.dcfg.mask_token_id, cfg.mix, cfg.gamma, gen, label_map,
                        None if data.labels is None else data.labels[idx].clamp(min=0), cfg.teacher_chain,
                        soft=None if data.soft is None else (data.soft[0][idx], data.soft[1][idx]))
        return loss, cfg.batch_size * L

    def held_out(step):
        ev = measure_tau(target, drafter, data.eval_prompts, cfg.eval_new_tokens, cfg.block_size,
                         stop_ids=tok.stop_token_ids() if cfg.data == "chat" else ())
        log(f"  held-out τ (B={cfg.block_size}, greedy, {cfg.eval_prompts} prompts): {ev['tau']:.3f}")
        return {"tau": ev["tau"]}

    run = train_loop(model, optimizer, cfg, out / "training_state.pt", loss_fn, held_out, resume=resume, log=log)
    model.eval().requires_grad_(False)
    save_drafter(drafter, out)
    summary = {"config": asdict(cfg), "trainable_parameters": n_train, "steps_done": run.steps_done,
               "tokens_seen_this_run": run.tokens_seen,
               "train_seconds_this_run": run.seconds, "losses_this_run": run.losses, "history": run.history}
    write_json(out / "train_summary.json", summary)
    return summary


# ----------------------------------------------------------------------------- evaluation + card


def evaluate_drafter(target_dir: str, drafter_dir: str, n_code: int = 16, n_humaneval: int = 16,
                     new_tokens: int = 128, block_size: int = 16, chat: bool = False, log=print) -> dict:
    """τ at T = 0 on held-out code prompts and HumanEval prompts (sync engine, greedy).

    ``chat``: for an instruction-tuned target — "code" becomes chat requests built from held-out
    function snippets, HumanEval is asked in the chat format, and generation stops at end of turn.
    """
    from .. import load_drafter, load_model, load_tokenizer
    from ..data.prompts import load_prompt_set

    target = load_model(target_dir)
    tok = load_tokenizer(target_dir)
    drafter = load_drafter(drafter_dir, target=target)
    stops = tok.stop_token_ids() if chat else ()
    res = {}
    for name, n in (("code", n_code), ("humaneval", n_humaneval)):
        try:
            if chat and name == "code":
                prompts = chat_prompts(tok, None, 0.05, n, "evaluation", seed=1234, templates=1)
            else:
                prompts = load_prompt_set(name, tok, n, chat=chat, corpus=training_corpus(target_dir))
        except FileNotFoundError as e:
            log(f"{name}: unavailable ({e})")
            continue
        res[name] = measure_tau(target, drafter, prompts, new_tokens, block_size, stop_ids=stops)
        res[name]["prompts"] = len(prompts)
        log(f"{name}: τ {res[name]['tau']:.3f} over {res[name]['rounds']} rounds")
    return res
