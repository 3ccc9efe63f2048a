"""Which drafter a target gets: the directory asked for, or the first bundled drafter that fits.

``generate``, ``demo`` and the server share this, so every mode runs on the bundled pair with no
flag, and a missing or mismatched drafter is named with what would fit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..assets import BUNDLED_DFLASH, BUNDLED_DRAFTER, BUNDLED_QWEN_DRAFTER, models_dir

if TYPE_CHECKING:
    import torch

BUNDLED = {"d3d": (BUNDLED_DRAFTER, BUNDLED_QWEN_DRAFTER), "dflash": (BUNDLED_DFLASH,)}


def default_mode(device: torch.device) -> str:
    """The speculative mode used with a D3D drafter when none is asked for: async on CUDA, sync on a
    CPU, where async measured slower than sync in every setting (docs/results/async-hypotheses/)."""
    return "async" if device.type == "cuda" else "sync"


def decide_mode(asked: str | None, device: "torch.device | None" = None, kind: str | None = None,
                default: str | None = None, sampling=None) -> str:
    """The mode a run or a request decodes in, decided here alone (a library call without a spec is
    ``SpecConfig``'s ar). ``sampling`` with a truncation (top_k or top_p at T > 0) decodes ar whatever
    was asked: speculative modes are lossless at T, not at a truncation. Else the mode ``asked`` for;
    else ``default`` (a server's mode, for a request that names none); else the drafter's: dflash for a
    DFlash drafter (``kind``), ``default_mode`` of the device for a D3D one, ar without one."""
    if sampling is not None and sampling.temperature > 0 and (sampling.top_k, sampling.top_p) != (None, None):
        return "ar"
    if asked or default:
        return asked or default
    if kind is None:
        return "ar"
    return "dflash" if kind == "dflash" else default_mode(device)


def default_draft_model(model) -> str | None:
    """The draft model (``d3d.decode.draft_model``) sync decodes ``model`` with when none is named: the smaller real
    model its catalogue entry names (``d3d.fetch``), where fetched (the 1.5B's: the 0.5B, whose embeddings the
    drafter borrows anyway). Chosen on validation requests, three runs: prose ~4% faster on average (the last:
    explanations 1.06x -> 1.20x of ar, MT-Bench 1.20x -> 1.26x, free writing 0.96x -> 1.06x), code even (the chain
    does not start there): docs/results/draft-model/start/."""
    from ..fetch import is_fetched, lookup, real_model_name

    name = real_model_name(getattr(model, "source", None))
    sibling = lookup(name).draft_model if name else None
    return sibling if sibling and is_fetched(sibling) else None


def drafter_kind(path: Path) -> str:
    """'d3d' or 'dflash', from the drafter directory's config.json (named in every error)."""
    config = path / "config.json"
    try:
        raw = json.loads(config.read_text())
    except FileNotFoundError:
        raise ValueError(f"--drafter {path}: no config.json there (expected a drafter directory)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{config}: cannot read it as JSON ({e})") from None
    kinds = [k for k in ("d3d", "dflash") if isinstance(raw, dict) and isinstance(raw.get(k), dict)]
    if len(kinds) != 1:
        raise ValueError(f"{config}: not a drafter config (needs a 'd3d' or a 'dflash' section)")
    return kinds[0]


def load_any(path: Path, kind: str, model):
    from .dflash import load_dflash
    from .drafter import load_drafter

    return load_dflash(path, model) if kind == "dflash" else load_drafter(path, target=model)


def pick_drafter(model, mode: str | None, drafter: str | Path | None = None):
    """``(mode, drafter or None, note)``, the mode by ``decide_mode``. An explicit ``drafter`` directory
    decides the drafter and its kind the default mode (D3D: ``default_mode`` of the device, sync on a
    CPU and async on CUDA; DFlash: dflash); an explicit ``mode`` must fit it. Without one, the first
    bundled drafter of the mode's kind that fits ``model`` is used; where none fits, the default is ar
    and ``note`` says why, and an explicit speculative ``mode`` is an error that names what is missing."""
    if mode == "ar":
        return mode, None, ""
    if drafter:
        path = Path(drafter)
        kind = drafter_kind(path)
        mode = decide_mode(mode, model.device, kind)
        if (mode == "dflash") != (kind == "dflash"):
            raise ValueError(f"--mode {mode} needs a {'DFlash' if mode == 'dflash' else 'D3D'} drafter; "
                             f"{path / 'config.json'} is a {'DFlash' if kind == 'dflash' else 'D3D'} drafter")
        return mode, load_any(path, kind, model), ""
    kind = "dflash" if mode == "dflash" else "d3d"
    why = []
    for name in BUNDLED[kind]:
        path = models_dir() / name
        if not (path / "config.json").is_file():
            why.append(f"models/{name} is not there")
            continue
        try:
            loaded = load_any(path, kind, model)
        except ValueError as e:
            why.append(f"models/{name} does not fit it ({str(e).split(': ', 1)[-1]})")
            continue
        note = "" if name in (BUNDLED_DRAFTER, BUNDLED_DFLASH) else f"drafter: the bundled models/{name}"
        return decide_mode(mode, model.device, kind), loaded, note
    if mode:  # a speculative mode asked for explicitly: say what is missing
        raise ValueError(f"--mode {mode} needs a {'DFlash' if kind == 'dflash' else 'D3D'} drafter for this model: "
                         + "; ".join(why) + "; pass --drafter DIR")
    note = "autoregressive: no bundled drafter fits this model; pass --drafter DIR"
    return decide_mode(mode, model.device), None, note
