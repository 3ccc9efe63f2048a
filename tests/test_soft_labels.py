"""Soft labels (d3d/train/soft_labels.py): the target's top-k distribution at every position, cached
and resumable, and the loss that trains on it (equal to the hard loss on one-hot labels)."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import d3d
from d3d.train.drafter import DrafterTrainConfig, bd3_loss, train_drafter, training_mask
from d3d.train.soft_labels import make_soft_labels, soft_cross_entropy, teacher_topk
from d3d.train.target import train_target

from test_engines import V as V_TEST, random_drafter, tiny_target
from test_train_target import tiny_config


def test_teacher_topk_is_the_targets_distribution_after_each_prefix():
    target = tiny_target(seed=7)
    rows = torch.randint(0, V_TEST, (3, 9), generator=torch.Generator().manual_seed(0))
    ids, probs = teacher_topk(target, rows, 4, lengths=torch.tensor([9, 5, 9]))
    assert ids.shape == probs.shape == (3, 9, 4) and ids.dtype == torch.int32 and probs.dtype == torch.float16
    assert (ids[:, 0] == -1).all() and (probs[:, 0] == 0).all()
    for i in range(3):
        for j in range(1, 9):
            p = F.softmax(target(rows[i: i + 1, :j])[0, -1].float(), -1)
            top = p.topk(4)
            assert ids[i, j].tolist() == top.indices.tolist()
            torch.testing.assert_close(probs[i, j].float(), top.values, rtol=2e-3, atol=1e-3)
    ids, _ = teacher_topk(target, rows, 2, lengths=torch.tensor([4, 3, 2]))
    assert (ids[:, 4:] == -1).all() and (ids[:, 1:4] >= 0).all()  # the pass stops at the longest row


def test_soft_cross_entropy_renormalises_over_the_scored_ids():
    logits = torch.randn(5, 7, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 3, 6, 2, 2])
    one_hot = soft_cross_entropy(logits, labels.view(-1, 1).int(), torch.ones(5, 1))
    torch.testing.assert_close(one_hot, F.cross_entropy(logits, labels, reduction="none"))
    # target ids 10..16 scored by head rows 0..6; id 20 is outside the reduced vocabulary: its mass
    # is dropped and the rest renormalised
    label_map = torch.full((30,), -1)
    label_map[10:17] = torch.arange(7)
    ids = torch.tensor([[10, 13, 20]] * 5, dtype=torch.int32)
    probs = torch.tensor([[0.3, 0.1, 0.6]] * 5)
    want = -(0.75 * F.log_softmax(logits, -1)[:, 0] + 0.25 * F.log_softmax(logits, -1)[:, 3])
    torch.testing.assert_close(soft_cross_entropy(logits, ids, probs, label_map), want)


def test_bd3_loss_on_one_hot_soft_labels_is_the_hard_loss():
    target = tiny_target(seed=8)
    d = random_drafter(target, 4, seed=9)
    x0 = torch.randint(0, V_TEST - 1, (3, 12), generator=torch.Generator().manual_seed(2))
    args = (d.model, x0, torch.ones(3, 12), training_mask(12, 4), 4, V_TEST - 1, (0.4, 0.4, 0.2), 7.0)
    hard = bd3_loss(*args, torch.Generator().manual_seed(3))
    soft = (x0.unsqueeze(-1).int(), torch.ones(3, 12, 1, dtype=torch.float16))
    torch.testing.assert_close(bd3_loss(*args, torch.Generator().manual_seed(3), soft=soft), hard)
    spread = (torch.stack([x0, (x0 + 1) % (V_TEST - 1)], -1).int(), torch.tensor([0.5, 0.5]).expand(3, 12, 2))
    assert bd3_loss(*args, torch.Generator().manual_seed(3), soft=spread) > hard  # other labels: other loss


def test_soft_labels_are_cached_resumable_and_in_row_order(tmp_path):
    target = tiny_target(seed=10)
    rows = torch.randint(0, V_TEST, (11, 8), generator=torch.Generator().manual_seed(4))
    lengths = torch.tensor([8, 3, 5, 8, 2, 7, 8, 4, 6, 8, 1])
    calls = []
    real = target.forward

    def killed_on_tenth_pass(*a, **kw):
        calls.append(1)
        if len(calls) == 10:
            raise KeyboardInterrupt
        return real(*a, **kw)

    target.forward = killed_on_tenth_pass  # one row per pass, 8 rows per saved chunk
    with pytest.raises(KeyboardInterrupt):
        make_soft_labels(target, rows, lengths, 3, tmp_path, batch=1, log=lambda *_: None)
    assert len(list(tmp_path.glob("*.partial.pt"))) == 1
    calls.clear()
    target.forward = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    ids, probs = make_soft_labels(target, rows, lengths, 3, tmp_path, batch=1, log=lambda *_: None)
    assert len(calls) == 3  # only the rows the killed job had not saved
    target.forward = real
    for i in range(11):  # each row labelled as when alone, up to its length; nothing past it
        want_ids, want_probs = teacher_topk(target, rows[i: i + 1], 3, lengths[i: i + 1])
        assert torch.equal(ids[i], want_ids[0])
        torch.testing.assert_close(probs[i], want_probs[0], rtol=2e-3, atol=1e-3)
    assert not list(tmp_path.glob("*.partial.pt"))
    seen = []
    again = make_soft_labels(target, rows, lengths, 3, tmp_path, log=seen.append)
    assert torch.equal(again[0], ids) and "using cached soft labels" in seen[0]
    with pytest.raises(ValueError, match="--soft-labels=0"):
        make_soft_labels(target, rows, lengths, 0, tmp_path)


def test_pipeline_trains_on_soft_labels(tmp_path):
    tcfg = tiny_config(tmp_path, steps=20, hidden_size=64, num_heads=4, num_kv_heads=2, num_layers=2,
                       intermediate_size=128, vocab_size=320, max_positions=256)
    train_target(tcfg, log=lambda *_: None)
    cfg = DrafterTrainConfig(target=tcfg.out, out=str(tmp_path / "drafter"), corpus=tcfg.corpus,
                             heldout_fraction=tcfg.heldout_fraction, num_layers=1, block_size=4, n_sequences=32,
                             prompt_len=16, gen_len=32, batch_size=8, steps=60, lr=3e-3, warmup=5, eval_every=60,
                             eval_prompts=2, eval_new_tokens=16, log_every=1000, save_every=1000, soft_labels=4)
    summary = train_drafter(cfg, log=lambda *_: None)
    losses = summary["losses_this_run"]
    assert sum(losses[-10:]) < 0.8 * sum(losses[:10])
    assert list((Path(cfg.out) / "data").glob("soft-labels-*.pt"))
    target = d3d.load_model(tcfg.out)
    drafter = d3d.load_drafter(cfg.out, target=target)
    prompt = d3d.load_tokenizer(tcfg.out).encode("def add_5(a, b):\n")
    out = d3d.generate(target, prompt, max_new_tokens=24, stop_ids=[], drafter=drafter, spec="sync")
    assert out.tokens == d3d.generate(target, prompt, max_new_tokens=24, stop_ids=[]).tokens
    with pytest.raises(ValueError, match="--soft-labels needs"):
        train_drafter(DrafterTrainConfig(**{**cfg.__dict__, "data": "teacher", "out": str(tmp_path / "t")}),
                      log=lambda *_: None)
