"""One configuration of decoding: ``SpecConfig`` (how to speculate) and ``Sampling`` (what to sample).

Every knob is a field; ``None`` means the measured default of the device, filled in by ``resolve``
from one table (``defaults``), each entry beside the result that chose it (the figures are in
docs/results.md, "How each default was chosen"). ``resolve`` is the one place a spec becomes what a
round reads: every field concrete, ``block_size`` the drafter's when unset, and the two thresholds
that may be measured as decoding runs ("auto") turned into rules a round calls with its row price
(``d3d.decode.row_price``: ``Fixed``, ``PricedCut``, ``PricedSuccessor``). ``parse`` reads the compact
form the CLI's ``--spec`` and the bench's ``--modes`` share ("sync lookup=3 leaves=2"); ``str`` writes
it back, a resolved spec's too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import torch

from ..kernels import attention_cpu
from .row_price import Fixed, PricedCut, PricedSuccessor, as_cut, as_successor_threshold

if TYPE_CHECKING:
    from .datastore import Datastore
    from ..model.transformer import Transformer

MODES = ("ar", "sync", "async", "dflash")
OBJECTS = ("mode", "datastore", "draft_model")  # fields the compact form leaves out (the mode leads it; objects)
OVERLAPS = ("none", "stream", "packed")


@dataclass(frozen=True)
class Sampling:
    """T = 0 is greedy; at T > 0 every mode samples exactly from the target's distribution at T.
    top_k / top_p apply to ``ar`` only (speculative modes are lossless at T, not at a truncation)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0


@dataclass(frozen=True)
class SpecConfig:
    """How to decode. Every field but ``mode`` may stay None: the device's measured default, set by
    ``resolve``."""

    mode: str = "ar"  # ar, sync (draft then verify), async (D3D: draft ahead beside verification), dflash
    block_size: int | None = None  # tokens per round B (None: the drafter's)
    lookup: int | None = None  # copy the draft from the context after a match of this many tokens; 0 never
    leaves: int | None = None  # the drafter's likeliest bonus tokens verified beside the drafts
    draft_size: int | None = None  # tokens a synchronous drafter pass drafts (None: block_size - 1; copies: all)
    # verify drafts while their joint estimate beats this; "auto" (resolved: Fixed or PricedCut)
    verify_min_prob: "float | str | Fixed | PricedCut | None" = None
    hypotheses: int | None = None  # async: outcomes (accept length, bonus) drafted ahead per round
    fanout: int | None = None  # async: bonus candidates per accept length
    # async: least estimated hit probability worth drafting ahead; "auto" (resolved: Fixed or PricedSuccessor)
    successor_threshold: "float | str | Fixed | PricedSuccessor | None" = None
    overlap: str | None = None  # async: how the draft-ahead pass runs beside verification (OVERLAPS)
    exact: bool | None = None  # verify attention one row at a time (bit-exact low precision; None: auto)
    datastore: "Datastore | None" = field(default=None, compare=False)  # retrieved drafts (REST)
    draft_model: "Transformer | None" = field(default=None, compare=False)  # a smaller model's chains (draft_model.py)

    @classmethod
    def parse(cls, text: str) -> "SpecConfig":
        """``"sync lookup=3 leaves=2"`` (spaces or commas between items) -> SpecConfig; every error
        names the item and what is allowed."""
        items = text.replace(",", " ").split()
        if not items or "=" in items[0]:
            raise ValueError(f"spec {text!r}: must start with a mode, one of {', '.join(MODES)}")
        known = {f.name: f for f in fields(cls) if f.name not in OBJECTS}
        values: dict = {"mode": items[0]}
        for item in items[1:]:
            name, eq, raw = item.partition("=")
            name = name.replace("-", "_")
            if not eq or name not in known:
                raise ValueError(f"spec {text!r}: {item!r} is not NAME=VALUE with NAME one of {', '.join(known)}")
            try:
                values[name] = parse_value(name, raw)
            except ValueError as e:
                raise ValueError(f"spec {text!r}: {e}") from None
        spec = cls(**values)
        spec.check()
        return spec

    def __str__(self) -> str:
        """The compact form ``parse`` reads: the mode, then every field that is set."""
        parts = [self.mode] + [f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                               if f.name not in OBJECTS and getattr(self, f.name) is not None]
        return " ".join(parts)

    def replace(self, **changes) -> "SpecConfig":
        return dataclasses.replace(self, **changes)

    def check(self) -> None:
        """Every set value is of its kind, or a ValueError names the field."""
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r}: expected one of {', '.join(MODES)}")
        for name, least in (("block_size", 2), ("hypotheses", 1), ("fanout", 1), ("leaves", 0), ("lookup", 0),
                            ("draft_size", 1)):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < least):
                raise ValueError(f"{name}={value!r}: must be an integer >= {least}")
        p = self.verify_min_prob
        p = p.value if isinstance(p, Fixed) else "auto" if isinstance(p, PricedCut) else p  # resolved
        if p is not None and p != "auto" and not (_real(p) and 0 <= p <= 1):
            raise ValueError(f"verify_min_prob={p!r}: must be a probability in [0, 1] or 'auto' (measured as it runs)")
        t = self.successor_threshold
        t = t.value if isinstance(t, Fixed) else "auto" if isinstance(t, PricedSuccessor) else t
        if t is not None and t != "auto" and not (_real(t) and t >= 0):
            raise ValueError(f"successor_threshold={t!r}: must be a number >= 0 (above 1: never draft ahead) or 'auto'")
        if self.overlap is not None and self.overlap not in OVERLAPS:
            raise ValueError(f"overlap={self.overlap!r}: expected one of {', '.join(OVERLAPS)}")
        if self.exact is not None and not isinstance(self.exact, bool):
            raise ValueError(f"exact={self.exact!r}: must be True, False or None")
        if self.datastore is not None:
            from .datastore import Datastore

            if not isinstance(self.datastore, Datastore):
                raise ValueError(f"datastore: expected a d3d.decode.datastore.Datastore (d3d.load_datastore), got "
                                 f"{type(self.datastore).__name__}")
            if self.mode not in ("sync", "async"):
                raise ValueError(f"datastore with mode={self.mode!r}: datastore drafts are for the D3D modes, "
                                 "sync and async")
        if self.draft_model is not None:
            from ..model.transformer import Transformer

            if not isinstance(self.draft_model, Transformer):
                raise ValueError(f"draft_model: expected a d3d Transformer (d3d.load_model), got "
                                 f"{type(self.draft_model).__name__}")
            if self.mode != "sync":
                raise ValueError(f"draft_model with mode={self.mode!r}: a draft model's chains are a source of sync "
                                 "rounds (async drafts ahead with the block drafter alone)")

    def resolve(self, device: torch.device, int8_activations: bool = False, row_invariant: bool = False,
                drafter_block_size: int | None = None) -> "SpecConfig":
        """What a round reads: every unset field filled with the device's default (``defaults``) and
        ``block_size`` with the drafter's (``drafter_block_size``; left unset only where no drafter is
        named, as in doctor's report), the thresholds as the rules a round calls (module docstring),
        then checked as a whole. ``row_invariant``: the target's decoding attention rounds every row as
        a one-token step does whatever the layout (``d3d.kernels.attention_cpu``), so verification is
        exact by itself, leaves and packed passes included. Else ``int8_activations`` (the target's
        weights multiply int8 activations) turns ``exact`` on, and exact verification attends one row
        at a time."""
        self.check()
        exact_auto = self.exact is None and int8_activations and not row_invariant
        exact = (int8_activations or row_invariant) if self.exact is None else self.exact
        table = defaults(device, self.mode, exact and not row_invariant, int8_activations)
        spec = self.replace(exact=exact, block_size=self.block_size or drafter_block_size,
                            **{k: v for k, v in table.items() if getattr(self, k) is None})
        if spec.block_size is not None:  # the drafter's block: at most B - 1 masks, all of them where unmeasured
            spec = spec.replace(draft_size=min(spec.draft_size or spec.block_size - 1, spec.block_size - 1))
        spec = spec.replace(verify_min_prob=as_cut(spec.verify_min_prob, gate=spec.mode != "async"),
                            successor_threshold=as_successor_threshold(spec.successor_threshold))
        if spec.exact and spec.leaves and not row_invariant:
            why = (f"leaves={spec.leaves} with a target with int8 activations (its speculative modes verify with "
                   "exact=True; d3d/cpu/quant.py)" if exact_auto else f"exact=True with leaves={spec.leaves}")
            raise ValueError(f"{why}: a leaf attends through a mask, not as a one-token step does, so its output "
                             "could part from ar in low precision; use leaves=0"
                             + (", or D3D_QUANT_ACTIVATIONS=fp32" if exact_auto else ""))
        if spec.exact and spec.mode == "async" and spec.overlap == "packed" and not row_invariant:
            raise ValueError("exact=True needs the target's own verification pass: use overlap='none', "
                             "not 'packed' (its joint pass attends all rows at once)")
        return spec


# what each knob does, for --help (the CLI's flags are made from the fields: d3d/__main__.py)
HELP = {
    "block_size": "tokens per round B (default: the drafter's, 16)",
    "lookup": "sync/async: when the last N tokens occurred earlier in the prompt or output, copy what followed "
              "them as the draft instead of asking the drafter (prompt lookup; lossless); 0 = never",
    "draft_size": "sync/async: tokens the drafter drafts in a synchronous pass (its block: the anchor and this "
                  "many masks; at most block_size - 1, which copied drafts still reach). Where rows cost time a "
                  "shorter block costs the drafter less and the cut verifies few drafts anyway",
    "leaves": "sync/async: verify also the L likeliest bonus tokens the draft proposed (the drafter's, a datastore's "
              "or a draft model's runners-up), one target row each: a round whose bonus is one of them commits one "
              "more token (lossless; not with exact unless every row is attended alone)",
    "verify_min_prob": "sync/async: verify only the leading drafts the drafter believes in jointly with probability "
                       ">= P (0 = all; lossless): fewer rows where each costs time. auto: P measured as it runs, "
                       "tokens per second x the seconds one more row costs (d3d/decode/row_price.py)",
    "hypotheses": "async: K, successor blocks drafted per round for the K likeliest verification outcomes "
                  "(accept length, bonus token)",
    "fanout": "async: F, bonus candidates per accept length (the drafter's F likeliest tokens but its draft)",
    "successor_threshold": "async: draft ahead only when the drafter's estimate that a hypothesis hits is at least "
                           "this (0 = always). auto: the seconds a hypotheses pass adds to the round over those of "
                           "the synchronous draft a hit saves, measured as it runs (d3d/decode/row_price.py)",
    "overlap": "async: how the draft-ahead pass runs beside verification: none (right after it), stream (a second "
               "CUDA stream), packed (one joint pass of both models)",
    "exact": "sync/async/dflash: verify with row-invariant attention, so that greedy output equals ar token for "
             "token in bf16 too; on by itself on a CPU with d3d's attention kernel (free there: every row is "
             "computed alone) and where weights multiply int8 activations (elsewhere slower verification)",
}


def defaults(device: torch.device, mode: str, exact: bool = False, int8_activations: bool = False) -> dict:
    """The measured default of every knob for a device and mode. Each was chosen on validation
    requests; the JSON that chose it is named beside it, the figures are in docs/results.md."""
    cuda = device.type == "cuda"
    return {
        "lookup": 0 if mode == "async" else 3,  # docs/results/lookup/validation_choice*.json; async: unmeasured
        # sync on a CPU: blocks of 4 + 1 beat 15 + 1 on code and explanations (docs/results/draft-size/); else all
        "draft_size": 4 if mode == "sync" and not cuda else None,  # None: block_size - 1
        # sync: docs/results/leaves/ (bf16), docs/results/quant/ (quantized), docs/results/panels/ab.txt and
        # docs/results/leaves/validation_fp32_onednn_auto.json (fp32); the row price drops those not worth a row
        # exact (one row at a time) refuses leaves; int8 activations (the real model's GGUF): 2 leaves were no
        # gain on code and a loss on prose (docs/results/attention-cpu/validation_after_*.json)
        "leaves": 0 if mode == "async" or exact or int8_activations else 2,
        "verify_min_prob": 0.0 if cuda else "auto",  # docs/results/copy-length/validation*_*.json; CUDA: unmeasured
        # async on a CPU: rare, very likely hypotheses (docs/results/async-hypotheses/validation_*.json);
        # on CUDA SSD's K = 8, F = 3 on a second stream, unmeasured until `python -m bench gpu`
        "hypotheses": 8 if cuda else 1,
        "fanout": 3 if cuda else 1,
        # CPU: the pass's seconds over the sync draft's, measured (docs/results/async-hypotheses/validation_threshold_auto_*.json)
        "successor_threshold": 0.0 if cuda else "auto",
        "overlap": "stream" if cuda else "none",  # d3d/decode/overlap.py; docs/results.md, "How each default was chosen"
    }


def as_spec(spec: "SpecConfig | str | None") -> SpecConfig:
    """``generate``'s ``spec`` argument: None (ar), a mode or compact string, or a SpecConfig."""
    if spec is None:
        return SpecConfig()
    if isinstance(spec, str):
        return SpecConfig.parse(spec)
    if not isinstance(spec, SpecConfig):
        raise TypeError(f"spec: expected a SpecConfig, a string such as 'sync lookup=3', or None; "
                        f"got {type(spec).__name__}")
    return spec


def resolved_spec(target, drafter, spec: SpecConfig) -> SpecConfig:
    """A speculative ``spec`` resolved for ``target`` and ``drafter`` (checked to fit it): the one call
    ``generate`` and the server's groups make, so a spec passes this file once on its way to a round."""
    check_drafter(target, drafter, spec)
    return spec.resolve(target.device, target.int8_activations,
                        attention_cpu.row_invariant(target.device, target.cfg), drafter.block_size)


def check_drafter(target, drafter, spec: SpecConfig) -> None:
    """The drafter a speculative ``spec`` needs, of the right kind and vocabulary (errors name it)."""
    from ..draft.dflash import DFlashDrafter

    if drafter is None:
        raise ValueError(f"mode={spec.mode!r} needs a drafter (see d3d.load_drafter / d3d.draft.dflash.load_dflash)")
    if (spec.mode == "dflash") != isinstance(drafter, DFlashDrafter):
        raise ValueError(f"mode={spec.mode!r} needs a {'DFlash' if spec.mode == 'dflash' else 'D3D'} drafter, got "
                         f"{type(drafter).__name__}")
    if drafter.cfg.vocab_size != target.cfg.vocab_size:
        raise ValueError(f"drafter vocab_size={drafter.cfg.vocab_size} differs from the target's "
                         f"{target.cfg.vocab_size}")


def _real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def parse_value(name: str, raw: str):
    """One value of field ``name`` from its text (the CLI's flags, ``parse``, the bench's modes)."""
    if name == "overlap":
        return raw
    if name == "exact":
        if raw.lower() not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            raise ValueError(f"exact={raw!r}: expected true or false")
        return raw.lower() in ("true", "1", "yes", "on")
    if name in ("verify_min_prob", "successor_threshold") and raw == "auto":
        return raw
    try:
        return float(raw) if name in ("verify_min_prob", "successor_threshold") else int(raw)
    except ValueError:
        what = {"verify_min_prob": "a probability in [0, 1] or auto", "successor_threshold": "a number or auto"}.get(
            name, "a number")
        raise ValueError(f"{name}={raw!r}: expected {what}") from None


__all__ = ["SpecConfig", "Sampling", "MODES", "OVERLAPS", "HELP", "defaults", "as_spec",
           "parse_value", "resolved_spec", "check_drafter"]
