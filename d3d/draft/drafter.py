"""The D3D drafter: a block-diffusion language model that conditions on tokens only.

It is an ordinary ``Transformer`` (Qwen3 architecture) with its own KV cache, run in the
*block-causal* layout: a causal run of clean tokens, then one bidirectional block in which some
positions hold ``mask_token_id``. One pass predicts every masked position at once; with
``denoise_steps = S > 1`` the block is re-run S times, each step committing the most confident
positions (``d3d.kernels.denoise.denoise_step``: threshold or top-k rule).

Two block shapes are used, and the drafter is trained on both (``d3d.train.drafter``):

    anchored   [anchor, mask x (B-1)]   synchronous drafting: the anchor (last committed token)
                                         is known, the B-1 tokens after it are drafted
    all-mask   [mask x B]               asynchronous drafting: the successor block is drafted
                                         while the target still verifies, so even the token at
                                         the block's first position (the bonus) is a guess

The cache only ever keeps *clean* tokens: after a pass the block is cropped away.

Reduced drafting vocabulary (``draft_vocab_size`` = K > 0, EAGLE-3's trick): the drafter's LM
head is the rows of the target's LM head for K chosen target ids (the ids the target emits most
often in the drafter's training data), stored as the int64 tensor ``d3d.draft_vocab`` [K]. The
drafter scores only those K tokens and maps its picks back to target ids, so the head costs
K/V of the full one (16k of 152k ids for Qwen2.5). A token outside the K can never be drafted,
which is lossless (verification decides) but caps acceptance where the target uses rare ids.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..model.cache import KVCache, branches
from ..model.checkpoint import SHARED_EMBEDDINGS, is_quantized_checkpoint, load_embeddings, read_state, save_model
from ..model.config import ModelConfig
from ..kernels.denoise import denoise_step
from ..model.transformer import QuantLinear, Transformer
from ..cpu import hugepages
from ..cpu.quant import is_quantized, quantize
from ..cpu.precision import WeightsChoice, auto_weights

RULES = ("threshold", "topk", "all")


@dataclass
class DrafterConfig:
    """The ``"d3d"`` section of a drafter's ``config.json``."""

    block_size: int = 16
    mask_token_id: int = 0
    target_vocab: int = 0
    denoise_steps: int = 1
    shared_embeddings: bool = False  # embedding and LM head are borrowed (not in the file): the target's, or
    embeddings_from: str = ""  # ... a real model's (``d3d.fetch``), whatever the target: the drafter stands alone
    rule: str = "threshold"  # how multi-step denoising picks positions to commit
    threshold: float = 0.9
    draft_vocab_size: int = 0  # K > 0: the head scores only K target ids (``d3d.draft_vocab``)
    int8_weights: bool = False  # matrices stored as int8 + per-row scale (a quarter of fp32's bytes)

    def __post_init__(self):
        if self.block_size < 2:
            raise ValueError(f"block_size={self.block_size}: must be >= 2")
        if self.denoise_steps < 1:
            raise ValueError(f"denoise_steps={self.denoise_steps}: must be >= 1")
        if self.rule not in RULES:
            raise ValueError(f"rule={self.rule!r}: expected one of {RULES}")
        if not 0 <= self.threshold <= 1:
            raise ValueError(f"threshold={self.threshold}: must be in [0, 1]")
        if self.draft_vocab_size < 0:
            raise ValueError(f"draft_vocab_size={self.draft_vocab_size}: must be >= 0 (0 = the full vocabulary)")
        if self.draft_vocab_size and not self.shared_embeddings:
            raise ValueError("draft_vocab_size needs shared_embeddings (the head is a subset of the target's)")
        if self.embeddings_from and not self.shared_embeddings:
            raise ValueError("embeddings_from needs shared_embeddings (it names where they are borrowed from)")

    @classmethod
    def from_model_config(cls, cfg: ModelConfig, source: str = "config.json") -> "DrafterConfig":
        section = cfg.extra.get("d3d")
        if not isinstance(section, dict):
            raise ValueError(f"{source}: not a drafter config (no 'd3d' section)")
        unknown = set(section) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"{source}: unknown field(s) in the 'd3d' section: {sorted(unknown)}")
        for key in ("mask_token_id", "target_vocab"):
            if key not in section:
                raise ValueError(f"{source}: the 'd3d' section needs {key!r}")
        try:
            dcfg = cls(**section)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{source}: 'd3d' section: {e}") from None
        if not 0 <= dcfg.mask_token_id < cfg.vocab_size:
            raise ValueError(f"{source}: mask_token_id={dcfg.mask_token_id} outside the vocabulary ({cfg.vocab_size})")
        return dcfg


class Drafter:
    """A drafter model plus its drafting procedure. ``model`` is a plain ``Transformer``."""

    def __init__(self, model: Transformer, dcfg: DrafterConfig, vocab_map: torch.Tensor | None = None):
        self.model, self.dcfg = model, dcfg
        self.cfg = model.cfg
        self.vocab_map = vocab_map  # [K] target id of each drafting-vocabulary entry, or None

    @property
    def block_size(self) -> int:
        return self.dcfg.block_size

    def new_cache(self, rows: int, max_len: int) -> KVCache:
        return self.model.new_cache(rows, max_len)

    def num_parameters(self, include_shared: bool = False) -> int:
        shared = self.dcfg.shared_embeddings and not include_shared
        return self.cfg.num_parameters(include_embeddings=not shared)

    def start(self, cache: KVCache, rows: list[int], clean: list[list[int]], blocks: list[list[Block]],
              size: int) -> "DraftJob":
        """Inputs of one drafting pass; run them with ``job.forward()`` (or in a packed pass beside
        the target, ``d3d.decode.packed``), then call ``finish``.

        Row ``rows[i]`` appends ``clean[i]`` as a causal run (kept in the cache), followed by the
        blocks ``blocks[i]``, each of ``size`` tokens: ``Block(seen, lead)`` starts right after the
        first ``seen`` tokens of ``clean[i]`` (at that position, attending to the cache and those
        tokens only, bidirectionally within itself) with ``lead`` (an anchor or a hypothesised
        bonus) or a mask at its first position and masks after it. Sibling blocks ignore each
        other (``reach`` in ``d3d.kernels.attention``); the blocks are cropped away afterwards.
        """
        dev, mask = self.model.device, self.dcfg.mask_token_id
        ids, index, groups, reach, positions, masked_lead = [], [], [], [], [], []
        branching = any(len(b) > 1 or b[0].seen != len(c) for c, b in zip(clean, blocks))
        for row, run, row_blocks in zip(rows, clean, blocks):
            ids.extend(run)
            for blk in row_blocks:
                if not 0 <= blk.seen <= len(run):
                    raise ValueError(f"Block.seen={blk.seen}: must lie in [0, {len(run)}] (the clean run's length)")
                index.extend(range(len(ids), len(ids) + size))
                ids.extend([mask if blk.lead is None else blk.lead] + [mask] * (size - 1))
                masked_lead.append(blk.lead is None)
            g, r, p = branches(cache.lengths[row], len(run), [(blk.seen, size) for blk in row_blocks])
            groups.append(g), reach.append(r), positions.append(p)
        lens = [len(g) for g in groups]
        layout = cache.layout(lens, rows, groups, reach=reach if branching else None,
                              positions=positions if branching else None)
        ids_t = torch.tensor(ids, dtype=torch.long, device=dev)
        index_t = torch.tensor(index, device=dev)
        M = len(masked_lead)
        block = ids_t[index_t].view(M, size)
        masked = torch.ones(M, size, dtype=torch.bool, device=dev)
        masked[:, 0] = torch.tensor(masked_lead, device=dev)
        clean_end = [cache.lengths[r] + len(c) for r, c in zip(rows, clean)]
        block_rows = [row for row, b in zip(rows, blocks) for _ in b]
        return DraftJob(self.model, cache, rows, block_rows, block, masked, torch.zeros(M, size, device=dev),
                        clean_end, ids_t, layout, index_t, branching)

    @torch.inference_mode()
    def finish(self, cache: KVCache, job: "DraftJob", logits: torch.Tensor, temperature: float = 0.0,
               seed: int = 0, steps: int | None = None, top: int = 0) -> "Drafts":
        """Denoise from the first pass's ``logits`` ([M * size, V]); re-run the blocks for later steps.

        ``top`` > 0: also the drafter's ``top`` most probable target ids at every position, and their
        probabilities, from the first pass (what outcome hypotheses are built from)."""
        steps = self.dcfg.denoise_steps if steps is None else steps
        if steps > 1 and job.branching:
            raise ValueError("multi-step denoising re-runs the blocks on top of the whole clean run: "
                             "one block per row that sees all of it (branching blocks need denoise_steps=1)")
        M, size = job.block.shape
        top_ids = top_probs = None
        if top:
            top_probs, top_ids = logits.view(M, size, -1).float().softmax(-1).topk(top, dim=-1)
            if self.vocab_map is not None:
                top_ids = self.vocab_map[top_ids]
        picks = job.block if self.vocab_map is None else torch.zeros_like(job.block)  # what denoise_step writes
        for step in range(steps):
            for r, end in zip(job.rows, job.clean_end):
                cache.crop(r, end)  # only clean tokens stay cached
            last = step == steps - 1
            if last:  # one-step drafting reads nothing back from the device
                rule, k = "all", 1
            else:
                remaining = int(job.masked.sum(dim=1).max())
                rule, k = self.dcfg.rule, max(1, math.ceil(remaining / (steps - step)))
            was_masked = job.masked.clone() if self.vocab_map is not None else None
            denoise_step(logits.view(M, size, -1), picks, job.masked, temperature=temperature,
                         seed=seed * 1009 + step, rule=rule, threshold=self.dcfg.threshold, k=k,
                         confidence=job.confidence)
            if self.vocab_map is not None:  # drafting-vocabulary indices -> target ids
                job.block.copy_(torch.where(was_masked & ~job.masked, self.vocab_map[picks], job.block))
            if last or not bool(job.masked.any()):
                break
            # later steps re-run only the blocks, on top of the cached clean runs
            layout = cache.layout([size] * M, job.rows, [[0] * size] * M)
            logits = self.model(job.block.flatten(), layout, cache)
        return Drafts(job.block, job.confidence, top_ids, top_probs)

    @torch.inference_mode()
    def draft_blocks(self, cache: KVCache, rows: list[int], clean: list[list[int]], blocks: list[list["Block"]],
                     size: int, top: int = 0, temperature: float = 0.0, seed: int = 0) -> "Drafts":
        """``start``, the pass, ``finish``: the blocks of every row drafted in one pass."""
        job = self.start(cache, rows, clean, blocks, size)
        return self.finish(cache, job, job.forward(), temperature, seed, top=top)

    @torch.inference_mode()
    def draft(
        self,
        cache: KVCache,
        rows: list[int],
        clean: list[list[int]],
        anchors: list[int] | None,
        num_masks: int,
        temperature: float = 0.0,
        seed: int = 0,
        steps: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft ``num_masks`` tokens for each sequence in one packed pass (or ``steps`` passes).

        For sequence i (cache row ``rows[i]``) the pass appends ``clean[i]`` as a causal run
        (kept in the cache), then the block ``[anchors[i]] + [mask] * num_masks`` (or only masks
        when ``anchors`` is None), which is cropped away afterwards.
        Returns ``(tokens [N, num_masks] int64, confidence [N, num_masks] float32)``.
        """
        lead = 0 if anchors is None else 1
        heads = [None] * len(rows) if anchors is None else anchors
        job = self.start(cache, rows, clean, [[Block(len(c), a)] for c, a in zip(clean, heads)], lead + num_masks)
        d = self.finish(cache, job, job.forward(), temperature, seed, steps)
        return d.tokens[:, lead:], d.confidence[:, lead:]


@dataclass(frozen=True)
class Block:
    """A block to draft after a row's clean run: it starts after the run's first ``seen`` tokens,
    with ``lead`` (a known token) or a mask (None) at its first position."""

    seen: int
    lead: int | None = None


@dataclass
class Drafts:
    """What a drafting call returns, one row per block (rows' blocks in order)."""

    tokens: torch.Tensor  # [M, size] int64: the lead (if any) at position 0, then the drafted tokens
    confidence: torch.Tensor  # [M, size] float32: the drafter's probability of each drafted token (lead: 0)
    top_ids: torch.Tensor | None = None  # [M, size, top] int64: its most probable target ids (``top`` > 0)
    top_probs: torch.Tensor | None = None  # [M, size, top] float32: their probabilities


@dataclass
class DraftJob:
    """State of one drafting call between its first pass and the denoising steps."""

    model: Transformer
    cache: KVCache
    rows: list[int]
    block_rows: list[int]  # [M] the cache row of each block
    block: torch.Tensor  # [M, size] tokens (mask ids where still masked)
    masked: torch.Tensor  # [M, size] bool
    confidence: torch.Tensor  # [M, size] float32
    clean_end: list[int]  # cache length of each row once the blocks are cropped away
    ids: torch.Tensor  # [T] packed input of the first pass
    layout: object  # PassLayout of the first pass
    index: torch.Tensor  # [M * size] positions of the block tokens in ``ids``
    branching: bool  # some block sees only part of its clean run, or a row has several blocks

    @torch.inference_mode()  # also in a worker thread (inference mode is per thread)
    def forward(self) -> torch.Tensor:
        """The first pass: logits of the block tokens, [M * size, V]."""
        return self.model(self.ids, self.layout, self.cache, logits_index=self.index)


# ----------------------------------------------------------------------------- files


def drafter_model_config(target: ModelConfig, num_layers: int, dcfg: DrafterConfig) -> ModelConfig:
    """Default drafter shape: the target's width and head layout with fewer layers."""
    return target.replace(num_hidden_layers=num_layers, extra={"d3d": asdict(dcfg)})


def load_drafter(path: str | Path, target: Transformer | None = None, dtype=None, device=None,
                 weights: str = "auto") -> Drafter:
    """Load a drafter directory (HF-style ``config.json`` with a ``d3d`` section + safetensors).

    With ``shared_embeddings`` the file holds no embedding/LM head: they are borrowed from the real
    model ``embeddings_from`` names (fetched once where missing; the target's own where it is that
    model), so the drafter fits any target with its vocabulary, or else from the ``target`` (which
    its width must match). The drafter's vocabulary must match the target's.
    weights: the words of ``load_model``'s (``d3d.cpu.precision.WEIGHTS``, read by the same ``auto_weights``);
    ``"auto"`` follows the target: next to a quantized target the drafter's matrices are int4 (``as_int4``),
    next to a dense one dense in the target's dtype. ``dtype`` and ``weights`` must agree, as for ``load_model``.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: not a directory (expected a drafter checkpoint directory)")
    cfg = ModelConfig.load(path)
    source = str(path / "config.json")
    dcfg = DrafterConfig.from_model_config(cfg, source)
    if target is not None:
        if dcfg.target_vocab != target.cfg.vocab_size or cfg.vocab_size != target.cfg.vocab_size:
            raise ValueError(
                f"{source}: drafter vocabulary ({cfg.vocab_size}, target_vocab={dcfg.target_vocab}) does not "
                f"match the target's vocab_size={target.cfg.vocab_size}")
        if dcfg.shared_embeddings and not dcfg.embeddings_from and cfg.hidden_size != target.cfg.hidden_size:
            raise ValueError(f"{source}: shared embeddings need the target's hidden_size "
                             f"{target.cfg.hidden_size}, drafter has {cfg.hidden_size}")
    elif dcfg.shared_embeddings and not dcfg.embeddings_from:
        raise ValueError(f"{source}: this drafter shares the target's embeddings; pass target=")
    device = torch.device(device) if device is not None else (target.device if target is not None else torch.device("cpu"))
    K = dcfg.draft_vocab_size
    choice = auto_weights(weights, dtype, device, cfg, is_quantized_checkpoint(path),
                          follow=target.weights if target is not None else None)
    state, extra = read_state(path, cfg, skip=SHARED_EMBEDDINGS if dcfg.shared_embeddings else (),
                              extra={DRAFT_VOCAB: (K,)} if K else None, keep_quantized=choice.quantized)
    with torch.device("meta"):
        model = Transformer(cfg)
    lender = borrowed_embeddings(dcfg, cfg, target, source) if dcfg.shared_embeddings else None
    if lender is not None:
        model.embed_tokens = lender.embed_tokens
        if not cfg.tie_word_embeddings:  # the target's own head module (packed once), or one over the lender's
            model.lm_head = lender.lm_head if isinstance(lender, Transformer) else head_linear(lender.output_weight())
    vocab_map = None
    if K:
        vocab_map = check_draft_vocab(extra[DRAFT_VOCAB], cfg.vocab_size, f"{source}: tensor {DRAFT_VOCAB!r}").to(device)
        model.lm_head = draft_head(lender, vocab_map)
    model.load_weights(state, choice, dtype, device, strict=False)
    if weights == "auto" and choice.quantized:
        as_int4(model, own_head=bool(K) or not dcfg.shared_embeddings)
    leftover = [n for n, p in model.named_parameters() if p.is_meta]
    if leftover:
        raise ValueError(f"{source}: parameters not loaded: {leftover[:5]}")
    model.source = path.resolve()  # as load_model: the directory it came from
    hugepages.advise_model(model)  # as load_model (what it borrows from the target is there already)
    return Drafter(model, dcfg, vocab_map)


def as_int4(model: Transformer, own_head: bool) -> None:
    """A drafter beside a quantized target: its int8 matrices (its layers, and its head where it is its own, not the
    lender's: ``own_head``) requantized to int4 in groups of 32. Beside the real 0.5B a drafter pass took 0.79x as
    long (0.75x with the AVX2 kernel), τ alone unchanged, sync's validation code and explanations ~3% faster, prose
    even (docs/results/drafter-int4/)."""
    for name, mod in list(model.named_modules()):
        if (isinstance(mod, QuantLinear) and mod.weight.format == "int8"
                and (name.startswith("layers.") or own_head and name == "lm_head")):
            model.set_weight(name + ".weight", quantize(mod.weight.dequantize(), "int4"))
    model.weights_choice = WeightsChoice("int4", f"{model.weights_choice.reason}; int4 beside a quantized target")


DRAFT_VOCAB = "d3d.draft_vocab"


def check_draft_vocab(ids: torch.Tensor, vocab_size: int, what: str) -> torch.Tensor:
    """A drafting vocabulary must be distinct int64 target ids."""
    if ids.dim() != 1 or ids.dtype != torch.int64:
        raise ValueError(f"{what}: expected a 1-d int64 tensor, got {ids.dtype} {tuple(ids.shape)}")
    if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < vocab_size):
        raise ValueError(f"{what}: ids must lie in [0, {vocab_size})")
    if ids.unique().numel() != ids.numel():
        raise ValueError(f"{what}: ids must be distinct")
    return ids


def borrowed_embeddings(dcfg: DrafterConfig, cfg: ModelConfig, target: Transformer | None, source: str):
    """Where a drafter with ``shared_embeddings`` takes its embedding and head rows from: the real model
    ``embeddings_from`` names (the target itself where it was loaded from there), else the target."""
    if not dcfg.embeddings_from:
        if target is not None and cfg.tie_word_embeddings != target.cfg.tie_word_embeddings:
            raise ValueError(f"{source}: tie_word_embeddings must match the target's when sharing embeddings")
        return target
    from ..fetch import fetch, is_real_model

    if not is_real_model(dcfg.embeddings_from):
        raise ValueError(f"{source}: embeddings_from={dcfg.embeddings_from!r} is not a real model d3d knows")
    path = fetch(dcfg.embeddings_from, log=lambda m: print(f"d3d: {m}", file=sys.stderr, flush=True)).resolve()
    lender = target if target is not None and target.source == path else load_embeddings(path)
    width = lender.output_weight().shape[1]
    if width != cfg.hidden_size:
        raise ValueError(f"{source}: {dcfg.embeddings_from}'s embeddings are {width} wide, the drafter "
                         f"{cfg.hidden_size}")
    return lender


def head_linear(w) -> torch.nn.Module:
    """An LM head module over the matrix ``w`` (quantized or dense)."""
    if is_quantized(w):
        return QuantLinear(w)
    head = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
    head.weight = torch.nn.Parameter(w, requires_grad=False)
    return head


def draft_head(lender, vocab_map: torch.Tensor) -> torch.nn.Module:
    """An LM head over the drafting vocabulary: the output rows for ``vocab_map`` (a copy) of the
    model the embeddings are borrowed from (a ``Transformer`` or ``load_embeddings``')."""
    w = lender.output_weight()
    if is_quantized(w):
        return QuantLinear(w.select(vocab_map))
    return head_linear(w.detach()[vocab_map.to(w.device)].clone())


def save_drafter(drafter: Drafter, path: str | Path, dtype=None, int8: bool = False) -> None:
    """Write a drafter directory; shared embeddings are left out of the file. ``int8``: matrices
    as int8 + a per-row scale (``save_model``'s ``int8``: ``d3d.cpu.quant.quantize``); ``load_drafter``
    keeps them quantized beside a quantized target and dequantizes them otherwise (its ``weights``)."""
    path = Path(path)
    save_model(drafter.model, path, dtype=dtype,
               exclude=("model.embed_tokens.weight", "lm_head.weight") if drafter.dcfg.shared_embeddings else (),
               extra={DRAFT_VOCAB: drafter.vocab_map} if drafter.vocab_map is not None else None, int8=int8,
               config_extra={"d3d": {**asdict(drafter.dcfg), "int8_weights": int8}})


__all__ = ["Drafter", "DrafterConfig", "DraftJob", "Block", "Drafts", "load_drafter", "save_drafter", "drafter_model_config",
           "draft_head", "DRAFT_VOCAB"]
