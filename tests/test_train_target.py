"""Target pretraining: it learns, it resumes exactly, it refuses bad input."""

from pathlib import Path

import pytest
import torch

from d3d.train.target import TargetTrainConfig, train_target

SNIPPET = '''def add(a, b):
    """Return the sum of a and b."""
    return a + b


class Counter:
    def __init__(self):
        self.count = 0

    def increment(self, step=1):
        self.count += step
        return self.count
'''


def make_corpus(root, n_files=24):
    """Files of the same shape, every line carrying the file's own number: a repetitive,
    learnable corpus whose held-out windows still share no 80-character slice with training
    files (d3d.data.prompts drops windows that do)."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        text = (SNIPPET.replace("add", f"add_{i}").replace("Counter", f"Counter{i}").replace("count", f"count_{i}")
                .replace("increment", f"increment_{i}").replace("__init__(self)", f"__init__(self, n{i}=None)")
                .replace("a and b.", f"a and b ({i}).").replace("step=1", f"step={i}"))
        (root / f"mod_{i}.py").write_text(text * 3)
    return root


def tiny_config(tmp_path, **kw):
    base = dict(out=str(tmp_path / "out"), corpus=str(make_corpus(tmp_path / "corpus")), heldout_fraction=0.2,
                vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                intermediate_size=64, max_positions=128, seq_len=32, batch_size=8, steps=40, lr=5e-3,
                warmup=5, eval_every=20, eval_windows=8, save_every=20, log_every=20, save_dtype="float32")
    base.update(kw)
    return TargetTrainConfig(**base)


def test_training_reduces_loss(tmp_path):
    summary = train_target(tiny_config(tmp_path), log=lambda *_: None)
    losses = summary["losses_this_run"]
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5
    assert summary["heldout"]["loss"] < losses[0]
    assert summary["history"][-1]["val_loss"] < summary["history"][0]["val_loss"] or len(summary["history"]) == 1
    # the result is a HF-layout checkpoint that loads and generates
    import d3d

    model, tok = d3d.load_model(tmp_path / "out"), d3d.load_tokenizer(tmp_path / "out")
    ids = tok.encode("def add_3(a, b):")
    out = d3d.generate(model, ids, max_new_tokens=8)
    assert len(out.tokens[0]) == 8 or out.stats.stopped[0]
    import torch

    with torch.no_grad():  # the saved checkpoint's greedy token is the dense forward's argmax
        assert out.tokens[0][0] == int(model(torch.tensor([ids]))[0, -1].argmax())


def test_resume_matches_uninterrupted_run(tmp_path):
    full = train_target(tiny_config(tmp_path / "a", steps=8, save_every=100), log=lambda *_: None)
    cfg = tiny_config(tmp_path / "b", steps=8, save_every=100, stop_after=5)
    first = train_target(cfg, log=lambda *_: None)
    assert len(first["losses_this_run"]) == 5
    cfg.stop_after = None
    rest = train_target(cfg, resume=True, log=lambda *_: None)
    resumed = first["losses_this_run"] + rest["losses_this_run"]
    assert len(resumed) == 8
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(full["losses_this_run"]), rtol=1e-5, atol=1e-5)


def test_stop_after_minutes_ends_the_chunk_with_a_saved_state(tmp_path):
    """A wall-time chunk (0 minutes: the first step is past it) stops after one step, evaluates its
    monitor windows and saves, and --resume continues from there on the same batches."""
    cfg = tiny_config(tmp_path / "b", steps=4, save_every=100, eval_every=100, stop_after_minutes=0.0)
    first = train_target(cfg, log=lambda *_: None)
    assert len(first["losses_this_run"]) == 1 and first["history"][-1]["step"] == 1
    assert torch.load(Path(cfg.out) / "training_state.pt", weights_only=False)["step"] == 1
    assert first["heldout"] is None  # the evaluation of every held-out token waits for the last chunk
    cfg.stop_after_minutes = None
    rest = train_target(cfg, resume=True, log=lambda *_: None)
    assert len(rest["losses_this_run"]) == 3 and rest["steps_done"] == 4 and rest["heldout"]["tokens"] > 0


def test_warm_restart_schedule():
    """schedule_start = 0 is the usual schedule; schedule_start = s warms up again from step s to the
    peak, then anneals to the floor by `steps`."""
    from d3d.train.common import cosine_lr
    from d3d.train.loop import schedule_lr

    usual = TargetTrainConfig(out="x", steps=100, lr=1e-3, warmup=10)
    restart = TargetTrainConfig(out="x", steps=100, lr=1e-3, warmup=10, schedule_start=60)
    assert [schedule_lr(s, usual) for s in range(100)] == [cosine_lr(s, 100, 1e-3, 10) for s in range(100)]
    assert schedule_lr(60, restart) == pytest.approx(1e-4)  # first warm-up step: peak / warmup
    assert schedule_lr(69, restart) == pytest.approx(1e-3)  # warm-up done: the peak again
    assert schedule_lr(99, restart) == pytest.approx(1e-4, rel=0.05)  # annealed to the floor by the last step
    assert schedule_lr(80, usual) < 2.5e-4  # the one cosine would be at a fifth of the peak by 80%


def test_warm_restart_resume_notes_the_new_schedule(tmp_path):
    cfg = tiny_config(tmp_path / "w", steps=6, save_every=100, eval_every=100, stop_after=3)
    train_target(cfg, log=lambda *_: None)
    cfg.stop_after, cfg.schedule_start = None, 3
    logs = []
    rest = train_target(cfg, resume=True, log=logs.append)
    assert rest["steps_done"] == 6 and len(rest["losses_this_run"]) == 3
    assert "note: resuming with changed settings: schedule_start" in logs


def test_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="schedule_start=8: must be in"):
        train_target(tiny_config(tmp_path / "s", steps=8, schedule_start=8), log=lambda *_: None)
    with pytest.raises(ValueError, match="schedule_start=3: after step 0, where this run starts"):
        train_target(tiny_config(tmp_path / "s", steps=8, schedule_start=3), log=lambda *_: None)
    with pytest.raises(FileNotFoundError, match="no such directory"):
        train_target(tiny_config(tmp_path, corpus=str(tmp_path / "missing")), log=lambda *_: None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no non-empty .py files"):
        train_target(tiny_config(tmp_path, corpus=str(tmp_path / "empty")), log=lambda *_: None)
    with pytest.raises(ValueError, match="vocab_size=200 is too small"):
        train_target(tiny_config(tmp_path, vocab_size=200), log=lambda *_: None)
    with pytest.raises(FileNotFoundError, match="no training checkpoint"):
        train_target(tiny_config(tmp_path, out=str(tmp_path / "fresh")), resume=True, log=lambda *_: None)


def test_bf16_autocast_training_learns(tmp_path):
    """compute_dtype="bfloat16": matmuls under autocast (fp32 master weights); it still learns,
    and it really ran in bf16 (the losses differ from an fp32 run of the same batches)."""
    bf16 = train_target(tiny_config(tmp_path / "a", compute_dtype="bfloat16"), log=lambda *_: None)
    losses = bf16["losses_this_run"]
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5
    fp32 = train_target(tiny_config(tmp_path / "b", compute_dtype="float32"), log=lambda *_: None)
    assert losses != fp32["losses_this_run"]
    torch.testing.assert_close(torch.tensor(losses[:3]), torch.tensor(fp32["losses_this_run"][:3]), rtol=0.05, atol=0.05)


def test_sigterm_saves_the_state_and_stops(tmp_path):
    """SIGTERM (or Ctrl-C) mid-run: the loop finishes its step, saves, stops; --resume continues."""
    import os
    import signal

    from d3d.train import loop

    cfg = tiny_config(tmp_path, steps=6, save_every=100, eval_every=100)
    sent = []

    def loss_then_signal(original):
        def wrapped(step, gen):
            if step == 2 and not sent:
                sent.append(step)
                os.kill(os.getpid(), signal.SIGTERM)
            return original(step, gen)
        return wrapped

    real_loop = loop.train_loop

    def patched(model, optimizer, cfg_, state_path, loss_fn, *a, **kw):
        return real_loop(model, optimizer, cfg_, state_path, loss_then_signal(loss_fn), *a, **kw)

    import d3d.train.target as target_mod

    target_mod.train_loop, old = patched, target_mod.train_loop
    try:
        first = train_target(cfg, log=lambda *_: None)
    finally:
        target_mod.train_loop = old
    assert len(first["losses_this_run"]) == 3  # steps 0, 1, 2: the signalled step completes
    assert torch.load(Path(cfg.out) / "training_state.pt", weights_only=False)["step"] == 3
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is removed again
    rest = train_target(cfg, resume=True, log=lambda *_: None)
    assert len(rest["losses_this_run"]) == 3
