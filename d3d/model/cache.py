"""KV cache: preallocated per layer, per-sequence lengths, rollback.

Layout: ``k[layer]`` is ``[rows, num_kv_heads, max_len, head_dim]`` — one row per sequence, so
``k[layer][row, :, :n]`` is a contiguous-enough view that attention reads without copying.

Speculative decoding writes K/V for drafts that may be rejected; ``crop(row, n)`` rolls a row
back to its first ``n`` positions. Nothing is freed or reallocated: a crop only moves the length,
later writes overwrite the stale entries.

The lengths live on the host (plain ints): every decision about them is made by the decoding
loop, which already knows the accept lengths, so keeping them on the host costs no sync.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .config import ModelConfig
from ..kernels import attention_cpu
from ..kernels.attention import SeqPlan, torch_plan

# Up to this many sequences a pass writes its new K/V with one slice copy per sequence; beyond it
# one index_put per tensor is fewer calls. Profile of a 1-token bundled-target pass: copy_ ~0.4 us
# and index_put ~5.5 us per call.
_SLICE_WRITES_UP_TO = 4


@dataclass
class PassLayout:
    """Everything one forward pass needs to know about where its new tokens go.

    A pass appends ``lens[i]`` new tokens to cache row ``rows[i]`` for each of its N sequences.
    Tensors live on the model's device; the ``*_host`` lists are the same numbers on the host.
    """

    rows: torch.Tensor  # [N] int32, cache row of each sequence
    cu_seqlens: torch.Tensor  # [N+1] int32, offsets of each sequence's new tokens
    cache_lens: torch.Tensor  # [N] int32, tokens cached before this pass
    group_ids: torch.Tensor  # [T] int32, attention groups (see d3d.kernels.attention)
    positions: torch.Tensor  # [T] int64, absolute positions (RoPE)
    write_rows: torch.Tensor  # [T] int64, cache row each new token is written to
    slots: torch.Tensor  # [T] int64, cache index each new token is written to (c, c+1, ...; = positions by default)
    max_seqlen: int
    rows_host: list[int]
    lens_host: list[int]
    cache_lens_host: list[int]
    row_invariant: bool = False  # torch path: causal runs attend one row at a time (see torch_plan)
    reach: torch.Tensor | None = None  # [T] int32: sibling blocks (d3d.kernels.attention); None = groups rule
    _plan: list[SeqPlan] | attention_cpu.CpuPlan | None = field(default=None, repr=False)
    _sdpa_plan: list[SeqPlan] | None = field(default=None, repr=False)

    @property
    def num_tokens(self) -> int:
        return sum(self.lens_host)

    def offsets_host(self) -> list[int]:
        """``cu_seqlens`` on the host, [N+1] (reading the tensor back would be a device sync)."""
        cu = [0]
        for n in self.lens_host:
            cu.append(cu[-1] + n)
        return cu

    def plan(self) -> list[SeqPlan] | attention_cpu.CpuPlan:
        """The CPU attention's arguments, built on first use and shared by every layer of the pass:
        the row-invariant kernel's per-query plan (``d3d.kernels.attention_cpu``) for decoding passes
        where it is built, else the torch path's per-sequence SDPA arguments (masks included)."""
        if self._plan is None:
            if (self.max_seqlen <= attention_cpu.MAX_QUERIES and self.group_ids.device.type == "cpu"
                    and attention_cpu.available()):
                self._plan = attention_cpu.cpu_plan(self.offsets_host(), self.cache_lens_host, self.rows_host,
                                                    self.group_ids, reach=self.reach)
            else:
                self._plan = self.sdpa_plan()
        return self._plan

    def sdpa_plan(self) -> list[SeqPlan]:
        """The torch path's per-sequence SDPA arguments (``attend_torch``; also for keys that are not
        all in the cache, as the DFlash drafter's), built on first use."""
        if self._sdpa_plan is None:
            self._sdpa_plan = torch_plan(self.offsets_host(), self.cache_lens_host, self.rows_host, self.group_ids,
                                         row_invariant=self.row_invariant, reach=self.reach)
        return self._sdpa_plan

    def write(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Write the pass's new keys or values ``src`` [T, Hkv, D] into a cache layer ``dst``
        [R, Hkv, Lmax, D] at each sequence's row and positions (contiguous: slice copies)."""
        if len(self.rows_host) > _SLICE_WRITES_UP_TO:
            dst[self.write_rows, :, self.slots] = src.to(dst.dtype)
            return
        start = 0
        for row, n, c in zip(self.rows_host, self.lens_host, self.cache_lens_host):
            dst[row, :, c:c + n].copy_(src[start:start + n].transpose(0, 1))
            start += n

    def last_token_index(self) -> torch.Tensor:
        """Index (into the packed tokens) of each sequence's last new token, [N]."""
        return (self.cu_seqlens[1:] - 1).long()


def branches(cached: int, run: int, attached: list[tuple[int, int]]) -> tuple[list[int], list[int], list[int]]:
    """``make_layout``'s groups, reach and positions for one row: a causal run of ``run`` tokens after
    ``cached`` ones, then branches ``(seen, size)``: ``size`` tokens (one group, bidirectional) that
    attend to the cache, the first ``seen`` tokens of the run and themselves, at the positions after
    those ``seen`` (drafter blocks off a clean run, leaves off the verified drafts)."""
    groups, reach, positions = list(range(run)), list(range(run)), list(range(cached, cached + run))
    for b, (seen, size) in enumerate(attached):
        groups += [run + b] * size
        reach += [seen] * size
        positions += range(cached + seen, cached + seen + size)
    return groups, reach, positions


def make_layout(
    rows: list[int],
    lens: list[int],
    cache_lens: list[int],
    device: torch.device | str = "cpu",
    groups: list[list[int]] | None = None,
    reach: list[list[int]] | None = None,
    positions: list[list[int]] | None = None,
) -> PassLayout:
    """Layout for appending ``lens[i]`` tokens to row ``rows[i]`` which holds ``cache_lens[i]``.

    ``groups[i]`` gives the attention groups of sequence i's new tokens (non-decreasing); the
    default is causal (each token its own group). ``reach[i]`` (with groups) lets sibling blocks
    branch off a causal run (``d3d.kernels.attention``). ``positions[i]``: the RoPE positions of the
    new tokens when they are not ``cache_lens[i], cache_lens[i] + 1, ...`` (a block placed after a
    prefix of the run before it); the tokens still go to the next cache slots.
    """
    if not (len(rows) == len(lens) == len(cache_lens)):
        raise ValueError("rows, lens and cache_lens must have one entry per sequence")
    if any(n <= 0 for n in lens):
        raise ValueError(f"every sequence needs at least one new token, got lens={lens}")
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    pos, grp, wrows, rch = [], [], [], []
    for i, (row, n, c) in enumerate(zip(rows, lens, cache_lens)):
        pos.extend(range(c, c + n))
        wrows.extend([row] * n)
        if reach is not None:
            if groups is None or len(reach[i]) != n:
                raise ValueError(f"reach[{i}] needs groups and one entry per new token ({n})")
            rch.extend(reach[i])
        if groups is None:
            grp.extend(range(n))
        else:
            g = list(groups[i])
            if len(g) != n:
                raise ValueError(f"groups[{i}] has {len(g)} entries for {n} new tokens")
            grp.extend(g)
    i32 = dict(dtype=torch.int32, device=device)
    slots = torch.tensor(pos, dtype=torch.long, device=device)
    if positions is not None:
        if [len(p) for p in positions] != list(lens):
            raise ValueError(f"positions: expected {list(lens)} entries per sequence, got {[len(p) for p in positions]}")
        pos = [p for seq in positions for p in seq]
    return PassLayout(
        rows=torch.tensor(rows, **i32),
        cu_seqlens=torch.tensor(cu, **i32),
        cache_lens=torch.tensor(cache_lens, **i32),
        group_ids=torch.tensor(grp, **i32),
        positions=slots if positions is None else torch.tensor(pos, dtype=torch.long, device=device),
        write_rows=torch.tensor(wrows, dtype=torch.long, device=device),
        slots=slots,
        max_seqlen=max(lens),
        rows_host=list(rows),
        lens_host=list(lens),
        cache_lens_host=list(cache_lens),
        reach=None if reach is None else torch.tensor(rch, **i32),
    )


class KVCache:
    """Static K/V storage for ``rows`` sequences of at most ``max_len`` tokens each."""

    def __init__(
        self,
        cfg: ModelConfig,
        rows: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        num_layers: int | None = None,
    ):
        if rows <= 0 or max_len <= 0:
            raise ValueError(f"KVCache needs rows > 0 and max_len > 0, got rows={rows}, max_len={max_len}")
        layers = cfg.num_hidden_layers if num_layers is None else num_layers
        shape = (rows, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.lengths = [0] * rows
        self.max_len = max_len
        self.device = torch.device(device)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def crop(self, row: int, length: int) -> None:
        """Roll ``row`` back to its first ``length`` positions (rejected drafts are forgotten)."""
        if not 0 <= length <= self.lengths[row]:
            raise ValueError(
                f"crop(row={row}, length={length}): length must be in [0, {self.lengths[row]}]"
            )
        self.lengths[row] = length

    def append_slot(self, row: int, slot: int) -> None:
        """Append the K/V stored at ``slot`` (written by the last pass beyond the row's length: a
        verified leaf, ``d3d.decode.speculative``) to ``row``: one position copied per layer."""
        n = self.lengths[row]
        if not n <= slot < self.max_len:
            raise ValueError(f"append_slot(row={row}, slot={slot}): slot must be in [{n}, {self.max_len})")
        if slot > n:  # slot == n: already in place
            for t in self.k + self.v:
                t[row, :, n].copy_(t[row, :, slot])
        self.lengths[row] = n + 1

    def share_prefix(self, src: int, dst: int, length: int) -> None:
        """Make ``row dst`` hold the first ``length`` positions of ``row src`` (a prompt prefix
        computed once and given to many sequences, ``d3d.decode.continuous``): K/V copied, nothing recomputed."""
        if src == dst or not 0 <= length <= self.lengths[src]:
            raise ValueError(f"share_prefix(src={src}, dst={dst}, length={length}): needs two rows and "
                             f"length in [0, {self.lengths[src]}]")
        for t in self.k + self.v:
            t[dst, :, :length].copy_(t[src, :, :length])
        self.lengths[dst] = length

    def reset(self) -> None:
        self.lengths = [0] * self.rows

    def layout(
        self,
        lens: list[int],
        rows: list[int] | None = None,
        groups: list[list[int]] | None = None,
        row_invariant: bool = False,
        reach: list[list[int]] | None = None,
        positions: list[list[int]] | None = None,
    ) -> PassLayout:
        """Layout that appends ``lens[i]`` tokens to row ``rows[i]`` (default: rows 0..N-1).

        ``row_invariant``: on the torch path each query row of a causal run is attended alone,
        exactly as a one-token step would (bit-identical verification in low precision, at the
        cost of one attention call per row: docs/results.md, "Measurements behind the code")."""
        rows = list(range(len(lens))) if rows is None else list(rows)
        if len(set(rows)) != len(rows):
            raise ValueError(f"rows must be distinct when writing to the cache, got {rows}")
        for r, n in zip(rows, lens):
            if not 0 <= r < self.rows:
                raise ValueError(f"cache row {r} out of range (cache has {self.rows} rows)")
            if self.lengths[r] + n > self.max_len:
                raise ValueError(
                    f"cache row {r} holds {self.lengths[r]} tokens; {n} more exceed max_len={self.max_len}"
                )
        layout = make_layout(rows, lens, [self.lengths[r] for r in rows], self.device, groups, reach, positions)
        layout.row_invariant = row_invariant
        return layout

    def advance(self, layout: PassLayout) -> None:
        """Record that ``layout``'s tokens were written (called by the model after a pass)."""
        for r, n in zip(layout.rows_host, layout.lens_host):
            self.lengths[r] += n
