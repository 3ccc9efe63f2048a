"""The compacted BD3 training pass (d3d/train/bd3_compact.py): the same loss and gradient as the
full x_t ⊕ x_0 pass, fewer positions; length-grouped batches draw every row equally often."""

import pytest
import torch

from d3d.train.bd3_compact import compact_layout, grouped_batch, kept_length, length_order
from d3d.train.drafter import bd3_loss, training_mask

from test_engines import V as V_TEST, random_drafter, tiny_target


def chat_like_rows(L=16):
    """Rows as chat data has them: prompt (unsupervised), answer (supervised), right padding."""
    x0 = torch.randint(0, V_TEST - 1, (5, L), generator=torch.Generator().manual_seed(0))
    loss_mask = torch.zeros(5, L)
    loss_mask[0, 5:11] = 1  # prompt of 5, answer of 6, pad
    loss_mask[1] = 1  # all supervised
    loss_mask[3, 13:] = 1  # long prompt, short answer at the end
    loss_mask[4, 1:3] = 1  # answer within the first block; row 2 has no supervision at all
    return x0, loss_mask


@pytest.mark.parametrize("clean", ["causal", "block"])
@pytest.mark.parametrize("mix", [(0.4, 0.4, 0.2), (0.0, 0.0, 1.0)])
def test_compact_pass_gives_the_full_pass_loss_and_gradient(clean, mix):
    target = tiny_target(seed=5)
    d = random_drafter(target, 4, seed=6)
    d.model.requires_grad_(True)
    x0, loss_mask = chat_like_rows()
    args = (d.model, x0, loss_mask, training_mask(16, 4, clean), 4, V_TEST - 1, mix, 7.0)
    results = []
    for compact in (False, True):
        d.model.zero_grad()
        loss = bd3_loss(*args, torch.Generator().manual_seed(3), compact=compact)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in d.model.parameters() if p.grad is not None]))
    (full, full_grads), (small, small_grads) = results
    torch.testing.assert_close(small, full)
    assert len(full_grads) == len(small_grads) > 0
    for a, b in zip(full_grads, small_grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_compact_layout_keeps_the_supervised_blocks_and_the_clean_text_before_the_last():
    L, B = 12, 4
    x0 = torch.arange(100, 100 + L).view(1, L)
    xt = torch.arange(200, 200 + L).view(1, L)
    weight = torch.zeros(1, L)
    weight[0, 5] = weight[0, 10] = 1  # blocks 1 and 2 supervised, block 0 not
    ids, pos, mask, index = compact_layout(xt, x0, weight, training_mask(L, B), B)
    assert ids.tolist() == [list(range(204, 212)) + list(range(100, 108))]  # x_t blocks 1, 2; x_0 blocks 0, 1
    assert pos.tolist() == [list(range(4, 12)) + list(range(8))]
    assert index.tolist() == [1, 6]
    full = torch.tensor(list(range(4, 12)) + list(range(12, 20)))
    assert torch.equal(mask[0], training_mask(L, B)[full][:, full])
    # rows of different lengths: the shorter is padded with positions that see only themselves
    weight2 = torch.zeros(2, L)
    weight2[0, 5] = weight2[0, 10] = 1
    weight2[1, 1] = 1  # block 0 only: no clean text needed
    ids, pos, mask, index = compact_layout(xt.repeat(2, 1), x0.repeat(2, 1), weight2, training_mask(L, B), B)
    assert ids.shape == (2, 16) and index.tolist() == [1, 6, 16 + 1]
    assert torch.equal(mask[1, 4:, 4:], torch.eye(12, dtype=torch.bool)) and not mask[1, :4, 4:].any()


def test_kept_length_is_what_a_fully_masked_row_keeps():
    x0, loss_mask = chat_like_rows()
    assert kept_length(loss_mask, 4).tolist() == [8 + 8, 16 + 12, 0, 4 + 12, 4]
    for i in (0, 1, 3, 4):  # every supervised position masked: the row keeps exactly that many
        ids, *_ = compact_layout(x0[i:i + 1], x0[i:i + 1], loss_mask[i:i + 1], training_mask(16, 4), 4)
        assert ids.shape[1] == kept_length(loss_mask, 4)[i]


def test_grouped_batches_draw_every_row_equally_often_from_similar_lengths():
    lengths = torch.randint(0, 50, (300,), generator=torch.Generator().manual_seed(1))
    order = length_order(lengths, seed=0)
    assert sorted(order.tolist()) == list(range(300)) and (lengths[order].diff() >= 0).all()
    gen = torch.Generator().manual_seed(2)
    counts = torch.zeros(300)
    rank = torch.empty(300, dtype=torch.long)
    rank[order] = torch.arange(300)
    for _ in range(3000):
        rows = grouped_batch(order, 8, gen, window=32)
        counts += torch.bincount(rows, minlength=300)
        r = rank[rows].sort().values
        gaps = torch.cat([r.diff(), (r[:1] + 300 - r[-1:])])
        assert 300 - gaps.max() < 32  # the rows lie on an arc of 32 neighbours in the (cyclic) order
    # 80 draws expected per row: a multinomial's spread, not a skew toward the middle of the order
    assert counts.min() > 45 and counts.max() < 120
    # ties are broken in a fixed random order, not the file's (consecutive rows are often related)
    assert length_order(torch.zeros(100)).tolist() != list(range(100))


def test_chat_training_draws_length_grouped_batches(tmp_path, monkeypatch):
    """train-drafter --data chat samples rows with grouped_batch and trains through the compacted
    pass (chat data and requests stubbed: the tiny target's tokenizer has no chat format)."""
    import d3d.train.drafter as trainer
    from d3d.train.drafter import DrafterTrainConfig, train_drafter
    from d3d.train.target import train_target
    from test_train_target import tiny_config

    tcfg = tiny_config(tmp_path, steps=5, hidden_size=64, num_heads=4, num_kv_heads=2, num_layers=2,
                       intermediate_size=128, vocab_size=320, max_positions=256)
    train_target(tcfg, log=lambda *_: None)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 300, (40, 32), generator=gen)
    mask = torch.zeros(40, 32)
    for i in range(40):  # answers of different lengths after prompts of different lengths
        start = int(torch.randint(2, 20, (1,), generator=gen))
        mask[i, start: start + int(torch.randint(1, 32 - start, (1,), generator=gen))] = 1
    monkeypatch.setattr(trainer, "make_chat_training_data", lambda *a, **kw: (ids, mask))
    monkeypatch.setattr(trainer, "chat_prompts", lambda *a, **kw: [[11, 12, 13]] * 2)
    drawn = []
    real = trainer.grouped_batch
    monkeypatch.setattr(trainer, "grouped_batch", lambda *a, **kw: drawn.append(real(*a, **kw)) or drawn[-1])
    cfg = DrafterTrainConfig(target=tcfg.out, out=str(tmp_path / "drafter"), corpus=tcfg.corpus, data="chat",
                             heldout_fraction=tcfg.heldout_fraction, num_layers=1, block_size=4, window=32,
                             batch_size=4, steps=6, eval_every=6, eval_prompts=2, eval_new_tokens=8, log_every=100,
                             save_every=100)
    summary = train_drafter(cfg, log=lambda *_: None)
    assert len(drawn) == 6 and all(torch.isfinite(torch.tensor(summary["losses_this_run"])))
