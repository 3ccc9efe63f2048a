"""A loaded model's matrices in 2 MB pages: Linux's transparent huge pages, asked for by ``madvise``.

Why: a decoding step streams every matrix once (~1 GB for the 1.5B), and in 4 KB pages that is a TLB miss and a
page walk every 64 cache lines, where a 2 MB page covers 32,768 of them. Where Linux hands out huge pages only on
request (``/sys/kernel/mm/transparent_hugepage/enabled`` = madvise, the common default), torch's allocations get
none. Whole passes of the real models, the same weights in 4 KB pages and in 2 MB pages taking turns in one process,
on a Zen 4: 1.03-1.09x (0.5B) and 1.03-1.10x (1.5B) at 1-16 rows, the drafter's 1.04-1.09x; the load takes ~1 s
longer for the 1.5B (docs/results/hugepages/). ``load_model`` and ``load_drafter`` call ``advise_model``.

``advise_model`` copies every tensor a matrix holds (a ``QuantWeight``'s panels, scales and high bits; dense
parameters) one after another into one arena of fresh memory, aligned to 2 MB and advised ``MADV_HUGEPAGE`` before it
is written, so the kernel backs it with huge pages as it is filled: small matrices share pages with their
neighbours (most of the 0.5B's are under 2 MB). The values are the same; only where they live changes.
``D3D_HUGEPAGES=off`` leaves them where they are.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from pathlib import Path

import torch

from .. import env
from .quant import QuantWeight, Stacked

HUGE = 2 << 20  # bytes in a huge page (x86-64, arm64 with 4 KB base pages)
SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
# the arena is faulted in stretches this long by torch's threads (zero_), the heap trimmed before each: faults met by
# one thread's copies had cost 1-2 s a GB (docs/results/hugepages/README.md); stretches keep a load's peak memory
# within one of its own
CHUNK = 256 << 20
ALIGN = 64  # each tensor's start in the arena (torch's own alignment)
_ARENAS: list[tuple[int, int]] = []  # the address ranges of the arenas made so far (a freed one's range is harmless)
PARTS = ("q", "high", "scale", "min", "scale_d", "min_d")  # a QuantWeight's tensors (d3d.cpu.quant)


def mode() -> str | None:
    """Linux's transparent huge page setting (``always``, ``madvise`` or ``never``), None where there is none."""
    try:
        text = SETTING.read_text()
    except OSError:
        return None
    chosen = [w[1:-1] for w in text.split() if w.startswith("[")]
    return chosen[0] if chosen else None


def wanted() -> bool:
    """Whether ``advise_model`` moves matrices: ``D3D_HUGEPAGES`` auto (the default) where Linux offers huge pages."""
    return env.read("D3D_HUGEPAGES") == "auto" and sys.platform.startswith("linux") and mode() in ("always", "madvise")


def arena(nbytes: int) -> tuple[mmap.mmap, int] | None:
    """``nbytes`` of fresh anonymous memory advised ``MADV_HUGEPAGE`` before anything is written to it: the mapping and
    the offset in it where those bytes start, on a 2 MB boundary; None where the platform or Linux refuses. Fresh
    ``mmap`` memory, not torch's allocator: glibc serves large blocks from pages a load already touched once it has
    freed blocks as large, and advice does not turn touched pages into huge ones."""
    if nbytes <= 0 or not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    area = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE)  # anonymous; pages before the start stay untouched
    start = -piece(area, 0, 1).data_ptr() % HUGE
    try:
        area.madvise(mmap.MADV_HUGEPAGE, start, nbytes + HUGE - start)
    except OSError:
        return None
    base = piece(area, start, 1).data_ptr()
    _ARENAS.append((base, base + nbytes))
    return area, start


def in_arena(t: torch.Tensor) -> bool:
    """Whether ``t``'s memory lies in an arena already."""
    return any(lo <= t.data_ptr() < hi for lo, hi in _ARENAS)


def piece(area: mmap.mmap, offset: int, nbytes: int) -> torch.Tensor:
    """Bytes ``offset`` .. ``offset + nbytes`` of ``area`` as a uint8 tensor with a storage of its own (a copy or a
    ``torch.save`` of it takes these bytes, not the whole area); the tensor keeps the mapping open."""
    return torch.frombuffer(area, dtype=torch.uint8, count=nbytes, offset=offset)


def trim_heap() -> None:
    """Hand the heap's freed pages back to the system (glibc's malloc_trim; elsewhere nothing): loading converts
    each matrix through temporaries, and moving them here frees their old homes, whose pages would otherwise stay."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def matrix_tensors(model: torch.nn.Module) -> list[tuple[object, str]]:
    """(owner, attribute) of every tensor a matrix of ``model`` holds: a ``QuantWeight``'s parts and the modules'
    own parameters, each matrix once (a tied head is the embedding's)."""
    out, seen = [], set()
    for m in model.modules():
        w = getattr(m, "weight", None)
        for part in w.parts if isinstance(w, Stacked) else [w]:
            if isinstance(part, QuantWeight) and id(part) not in seen:
                seen.add(id(part))
                out += [(part, name) for name in PARTS if getattr(part, name) is not None]
        out += [(p, "data") for p in m.parameters(recurse=False)]
    return out


def advise_model(model: torch.nn.Module) -> int:
    """Every contiguous CPU tensor of ``model``'s matrices (``matrix_tensors``) moved into one ``arena``, in order, each
    on a 64-byte boundary and with a storage of its own (``piece``), before any kernel binds to them (``load_model``
    calls it); tensors shared by several matrices stay shared. Returns the bytes moved (0 where ``wanted`` says no or
    no arena was given)."""
    if not wanted():
        return 0
    places, slots, total = [], {}, 0
    for owner, name in matrix_tensors(model):
        t = getattr(owner, name)
        if t.device.type != "cpu" or not t.is_contiguous() or t.numel() == 0 or in_arena(t):
            continue  # a piece already (a drafter borrowing its target's embedding) stays where it is
        key = (t.data_ptr(), t.dtype, tuple(t.shape))
        if key not in slots:
            slots[key] = total
            total += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
        places.append((owner, name, key))
    got = arena(total)
    if got is None:
        return 0
    area, start = got
    moved, faulted = {}, 0
    for owner, name, key in places:
        if key not in moved:
            t = getattr(owner, name)
            n = t.numel() * t.element_size()
            if slots[key] + n > faulted:  # the next stretch: the old homes so far back to the system, new pages in
                trim_heap()
                end = min(total, max(slots[key] + n, faulted + CHUNK))
                piece(area, start + faulted, end - faulted).zero_()
                faulted = end
            moved[key] = piece(area, start + slots[key], n).view(t.dtype).view(t.shape).copy_(t)
        setattr(owner, name, moved[key])
    return sum(t.numel() * t.element_size() for t in moved.values())


__all__ = ["arena", "piece", "in_arena", "advise_model", "matrix_tensors", "trim_heap", "mode", "wanted", "HUGE"]
