"""Layer pruning for drafters: drop layers by index, or search greedily by measured τ.

Removing a layer keeps every other weight as it is (no retraining). The greedy search removes one
layer at a time, each time the one whose removal keeps the highest τ on the given prompts.
"""

from __future__ import annotations

import copy

from torch import nn

from ..draft.drafter import Drafter
from ..model.transformer import Transformer


def drop_layers(drafter: Drafter, drop: list[int]) -> Drafter:
    """A new drafter without the layers in ``drop`` (indices into the current layers)."""
    n = drafter.cfg.num_hidden_layers
    bad = [i for i in drop if not 0 <= i < n]
    if bad:
        raise ValueError(f"--drop {bad}: layer indices must be in [0, {n})")
    if len(set(drop)) >= n:
        raise ValueError(f"cannot drop all {n} layers")
    keep = [i for i in range(n) if i not in set(drop)]
    src = drafter.model
    cfg = src.cfg.replace(num_hidden_layers=len(keep))
    model = Transformer.__new__(Transformer)
    nn.Module.__init__(model)
    model.cfg = cfg
    model.embed_tokens = src.embed_tokens  # shared, whether or not the file holds it
    model.layers = nn.ModuleList(copy.deepcopy(src.layers[i]) for i in keep)
    model.norm = copy.deepcopy(src.norm)
    model.lm_head = src.lm_head
    model._rope = None
    return Drafter(model.eval(), drafter.dcfg)


def layer_importance(drafter: Drafter, measure) -> list[dict]:
    """τ with each single layer removed. ``measure(drafter) -> τ``."""
    return [{"dropped": i, "tau": measure(drop_layers(drafter, [i]))} for i in range(drafter.cfg.num_hidden_layers)]


def greedy_prune(drafter: Drafter, n_remove: int, measure, log=print) -> tuple[Drafter, list[int], list[dict]]:
    """Remove ``n_remove`` layers one at a time, each time the least harmful by ``measure``.

    Returns the pruned drafter, the removed layer indices (in the original numbering) and the
    search trace.
    """
    if not 0 < n_remove < drafter.cfg.num_hidden_layers:
        raise ValueError(f"n_remove={n_remove}: must be in [1, {drafter.cfg.num_hidden_layers - 1}]")
    original = list(range(drafter.cfg.num_hidden_layers))
    current, removed, trace = drafter, [], []
    for _ in range(n_remove):
        scores = layer_importance(current, measure)
        best = max(scores, key=lambda r: r["tau"])
        removed.append(original.pop(best["dropped"]))
        current = drop_layers(current, [best["dropped"]])
        trace.append({"removed_original_layer": removed[-1], "tau": best["tau"], "candidates": scores})
        log(f"removed layer {removed[-1]} (τ {best['tau']:.3f})")
    return current, removed, trace
