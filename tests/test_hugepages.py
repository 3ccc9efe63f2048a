"""d3d/cpu/hugepages.py: a model's matrices moved into one arena advised for 2 MB pages, with their values, their
sharing and the kernels' results unchanged; D3D_HUGEPAGES=off, or no huge pages offered, leaves them where they are."""

import mmap

import pytest
import torch

from d3d.cpu import hugepages
from d3d.cpu.quant import QuantWeight, Stacked

needs_advice = pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="this platform's mmap has no "
                                  "MADV_HUGEPAGE (not Linux): advise leaves every tensor where it is")


@pytest.fixture
def offered(monkeypatch):
    """Huge pages offered whatever this machine's setting (the moves, not the kernel's pages, are under test)."""
    monkeypatch.setattr(hugepages, "mode", lambda: "madvise")
    monkeypatch.delenv("D3D_HUGEPAGES", raising=False)


@needs_advice
def test_arena_starts_on_a_huge_page_and_its_pieces_outlive_the_mapping_object():
    area, start = hugepages.arena(3 * hugepages.HUGE + 5)
    whole = hugepages.piece(area, start, 3 * hugepages.HUGE + 5)
    assert whole.dtype == torch.uint8 and whole.data_ptr() % hugepages.HUGE == 0
    part = hugepages.piece(area, start + 64, 1000)
    assert part.untyped_storage().nbytes() == 1000  # a storage of its own: a copy or a save takes these bytes only
    whole.fill_(7)
    del area, whole
    assert int(part.sum()) == 7 * 1000
    assert hugepages.arena(0) is None


def two_matrices():
    """A module holding a 4 MB int8 QuantWeight twice (a tied head) and in a Stacked beside a small one, and a 4 MB
    dense parameter."""
    q = torch.randint(-128, 128, (2048, 2048), dtype=torch.int8)
    w = QuantWeight(q, torch.rand(2048, 2048 // 32) / 100)
    model = torch.nn.Module()
    model.a, model.b, model.c, model.d = (torch.nn.Module() for _ in range(4))
    model.a.weight = model.b.weight = w
    model.c.weight = Stacked([w, QuantWeight(q[:16].contiguous(), torch.rand(16, 64))])
    model.d.weight = torch.nn.Parameter(torch.randn(1024, 1024), requires_grad=False)
    return model, w


@needs_advice
def test_advise_model_moves_every_matrix_once_and_keeps_the_products(offered):
    model, w = two_matrices()
    small = model.c.weight.parts[1]
    x = torch.randn(3, 2048)
    before, dense, small_before = w.linear(x), model.d.weight.clone(), small.linear(x)
    expected = sum(t.numel() * t.element_size() for t in (w.q, w.scale, small.q, small.scale, model.d.weight))
    moved = hugepages.advise_model(model)
    assert moved == expected  # every tensor once: the shared matrix's, the small one's, the dense parameter
    assert w.q.data_ptr() % hugepages.ALIGN == 0 and small.q.data_ptr() % hugepages.ALIGN == 0
    first = min(getattr(o, n).data_ptr() for o, n in hugepages.matrix_tensors(model))
    assert first % hugepages.HUGE == 0  # one arena from a huge page's start, the tensors one after another
    assert model.a.weight is w and model.c.weight.parts[0] is w  # the shared matrix moved once, still shared
    assert torch.equal(w.linear(x), before) and torch.equal(small.linear(x), small_before)
    assert torch.equal(model.d.weight, dense) and isinstance(model.d.weight, torch.nn.Parameter)
    assert small.q.untyped_storage().nbytes() == small.q.numel()  # not the arena's: deepcopy and torch.save stay small


@needs_advice
def test_a_second_model_borrowing_moved_matrices_leaves_them(offered):
    model, w = two_matrices()
    hugepages.advise_model(model)
    where = w.q.data_ptr(), model.d.weight.data_ptr()
    other = torch.nn.Module()
    other.head, other.dense = torch.nn.Module(), torch.nn.Module()
    other.head.weight = w  # borrowed, as a drafter borrows its target's embedding
    other.dense.weight = torch.nn.Parameter(torch.randn(8, 8), requires_grad=False)
    assert hugepages.advise_model(other) == 8 * 8 * 4  # only its own
    assert (w.q.data_ptr(), model.d.weight.data_ptr()) == where
    assert hugepages.advise_model(model) == 0  # twice: nothing moves again


def test_off_leaves_the_model(offered, monkeypatch):
    monkeypatch.setenv("D3D_HUGEPAGES", "off")
    model, w = two_matrices()
    where = w.q.data_ptr()
    assert not hugepages.wanted() and hugepages.advise_model(model) == 0 and w.q.data_ptr() == where


def test_never_offered_leaves_the_model(monkeypatch):
    monkeypatch.setattr(hugepages, "mode", lambda: "never")
    monkeypatch.delenv("D3D_HUGEPAGES", raising=False)
    model, w = two_matrices()
    assert hugepages.advise_model(model) == 0


def test_bad_setting_is_named(monkeypatch):
    monkeypatch.setenv("D3D_HUGEPAGES", "yes")
    with pytest.raises(ValueError, match="D3D_HUGEPAGES"):
        hugepages.wanted()
