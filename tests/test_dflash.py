"""The DFlash baseline: layer-id rule, injected context attention by hand, lossless engine, files."""

import math

import pytest
import torch

from d3d.draft.dflash import DFlashConfig, DFlashDrafter, load_dflash, save_dflash, target_layer_ids
from d3d.decode.engines import generate
from d3d.model.transformer import apply_rope

from test_engines import PROMPTS, reference, tiny_target


@pytest.mark.parametrize("L,n,expected", [
    (36, 5, [1, 9, 17, 25, 33]),  # Qwen3-8B with a 5-layer drafter
    (36, 1, [18]),
    (28, 3, [1, 13, 25]),
    (6, 2, [1, 3]),
    (64, 4, [1, 21, 41, 61]),
])
def test_target_layer_ids(L, n, expected):
    assert target_layer_ids(L, n) == expected


def test_target_layer_ids_rejects_shallow_targets():
    with pytest.raises(ValueError, match="too shallow"):
        target_layer_ids(3, 2)


def make_dflash(target, layers=1, block_size=4, seed=0):
    torch.manual_seed(seed)
    ids = tuple(target_layer_ids(target.cfg.num_hidden_layers, layers)) if target.cfg.num_hidden_layers >= 4 else \
        tuple(range(layers))
    dcfg = DFlashConfig(block_size=block_size, mask_token_id=target.cfg.vocab_size - 1,
                        target_vocab=target.cfg.vocab_size, target_layer_ids=ids)
    d = DFlashDrafter(target.cfg.replace(num_hidden_layers=layers), dcfg, target)
    for name, p in d.named_parameters():
        if not name.startswith("model.embed_tokens"):
            torch.nn.init.normal_(p, std=0.3)
    return d.eval().requires_grad_(False)


def test_injected_attention_matches_a_hand_computation():
    """One drafter layer, 3 context tokens, a block of 2: recompute the layer with explicit loops."""
    target = tiny_target(seed=1)
    d = make_dflash(target, layers=1, block_size=2, seed=2)
    cfg, layer = d.cfg, d.model.layers[0]
    hidden = [torch.randn(3, cfg.hidden_size)]
    cache = d.new_cache(1, 16)
    d.append_context(cache, [0], hidden, [3])
    block = torch.tensor([5, cfg.vocab_size - 1])
    got = d.block_forward(block, _layout(cache), cache.k, cache.v)

    # by hand: context vectors -> k/v; block -> q/k/v; every query sees all 3 + 2 keys
    H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    cos, sin = d.model.rope()
    ctx = d.hidden_norm(d.fc(hidden[0]))
    w = layer.self_attn.qkv_proj.weight
    wq, wk, wv = w[:cfg.q_size], w[cfg.q_size:cfg.q_size + cfg.kv_size], w[cfg.q_size + cfg.kv_size:]
    kc = layer.self_attn.k_norm((ctx @ wk.t()).view(3, Hkv, D))
    kc = apply_rope(kc, cos[:3, None], sin[:3, None])
    vc = (ctx @ wv.t()).view(3, Hkv, D)
    x = d.model.embed_tokens(block)
    h = layer.input_layernorm(x)
    q = apply_rope(layer.self_attn.q_norm((h @ wq.t()).view(2, H, D)), cos[3:5, None], sin[3:5, None])
    kb = apply_rope(layer.self_attn.k_norm((h @ wk.t()).view(2, Hkv, D)), cos[3:5, None], sin[3:5, None])
    vb = (h @ wv.t()).view(2, Hkv, D)
    keys, values = torch.cat([kc, kb]), torch.cat([vc, vb])
    out = torch.zeros(2, H, D)
    for i in range(2):
        for hd in range(H):
            g = hd // (H // Hkv)
            scores = torch.tensor([float(q[i, hd] @ keys[j, g]) / math.sqrt(D) for j in range(5)])
            p = scores.softmax(0)
            out[i, hd] = sum(p[j] * values[j, g] for j in range(5))
    x = x + layer.self_attn.o_proj(out.reshape(2, -1))
    x = x + layer.mlp(layer.post_attention_layernorm(x))
    torch.testing.assert_close(got, d.model.norm(x), atol=1e-5, rtol=1e-5)


def _layout(cache):
    from d3d.model.cache import make_layout

    return make_layout([0], [2], [cache.lengths[0]], "cpu", [[0, 0]])


@pytest.mark.parametrize("block_size", [2, 4, 7])
@pytest.mark.parametrize("layers", [1, 2])
def test_greedy_dflash_equals_ar(block_size, layers):
    target = tiny_target(seed=3)
    d = make_dflash(target, layers=layers, block_size=block_size, seed=4)
    out = generate(target, PROMPTS, max_new_tokens=25, stop_ids=[], drafter=d, spec="dflash")
    assert out.tokens == reference(target, PROMPTS, 25)
    assert out.stats.rounds >= 25 * len(PROMPTS) // block_size
    with pytest.raises(ValueError, match="needs a D3D drafter"):
        generate(target, PROMPTS, max_new_tokens=4, drafter=d, spec="sync")


def test_save_load_round_trip(tmp_path):
    target = tiny_target(seed=5)
    d = make_dflash(target, layers=2, block_size=4, seed=6)
    save_dflash(d, tmp_path)
    again = load_dflash(tmp_path, target)
    assert again.dcfg == d.dcfg
    hidden = [torch.randn(4, target.cfg.hidden_size) for _ in d.dcfg.target_layer_ids]
    torch.testing.assert_close(again.context(hidden), d.context(hidden))
    c1, c2 = d.new_cache(1, 16), again.new_cache(1, 16)
    d.append_context(c1, [0], hidden, [4])
    again.append_context(c2, [0], hidden, [4])
    torch.testing.assert_close(again.draft(c2, [0], [3], 3), d.draft(c1, [0], [3], 3))
    other = tiny_target(seed=5, vocab=50)
    with pytest.raises(ValueError, match="does not match the target"):
        load_dflash(tmp_path, other)


def test_training_form_equals_inference_pass():
    """The dense training computation of a block equals the cached inference pass."""
    from d3d.model.cache import make_layout
    from d3d.train.dflash import block_hidden

    target = tiny_target(seed=7)
    d = make_dflash(target, layers=2, block_size=4, seed=8)
    x0 = torch.randint(0, 40, (1, 20))
    with torch.no_grad():
        _, hidden = target(x0, hidden_layers=d.hidden_layers)
        dense = block_hidden(d, hidden, x0, torch.tensor([[9, 3]]), 4)  # two blocks, anchors 9 and 3
    for j, a in enumerate((9, 3)):
        cache = d.new_cache(1, 32)
        d.append_context(cache, [0], [h[0, :a] for h in hidden], [a])  # context strictly before the anchor
        ids = torch.tensor([int(x0[0, a])] + [d.dcfg.mask_token_id] * 3)
        layout = make_layout([0], [4], [a], "cpu", [[0] * 4])
        with torch.no_grad():
            got = d.block_forward(ids, layout, cache.k, cache.v)
        torch.testing.assert_close(got, dense[0, j], atol=1e-5, rtol=1e-5)


def test_train_dflash_smoke(tmp_path):
    from d3d.train.dflash import DFlashTrainConfig, train_dflash
    from d3d.train.target import train_target
    from test_train_target import tiny_config

    tcfg = tiny_config(tmp_path, steps=10, hidden_size=64, num_heads=4, num_kv_heads=2, num_layers=4,
                       intermediate_size=128, vocab_size=320, max_positions=256)
    train_target(tcfg, log=lambda *_: None)
    cfg = DFlashTrainConfig(target=tcfg.out, out=str(tmp_path / "dflash"), corpus=tcfg.corpus,
                            heldout_fraction=tcfg.heldout_fraction, num_layers=2, block_size=4, n_sequences=16,
                            prompt_len=8, gen_len=24, blocks_per_sequence=3, batch_size=4, steps=6, eval_every=6,
                            eval_prompts=2, eval_new_tokens=8, log_every=100)
    summary = train_dflash(cfg, log=lambda *_: None)
    assert summary["steps_done"] == 6 and len(summary["history"]) == 1
    import d3d
    from d3d.draft.dflash import load_dflash
    from d3d.data.prompts import heldout_prompts
    from d3d.train.dflash import measure_dflash_tau

    target = d3d.load_model(tcfg.out)
    drafter = load_dflash(cfg.out, target)
    # the saved drafter is the one whose τ was logged: re-measured on the same prompts, same value
    prompts = heldout_prompts(d3d.load_tokenizer(tcfg.out), cfg.corpus, cfg.heldout_fraction, cfg.eval_prompts,
                              cfg.prompt_len)
    tau = measure_dflash_tau(target, drafter, prompts, cfg.eval_new_tokens, cfg.block_size)
    assert tau == pytest.approx(summary["history"][0]["tau"])
    assert drafter.dcfg.target_layer_ids == (1, 1)


def test_train_dflash_resumes_exactly(tmp_path):
    """train-dflash runs the shared loop: stopping after 2 steps and resuming gives the run an
    uninterrupted one gives (same batches, same optimizer state)."""
    from d3d.train.dflash import DFlashTrainConfig, train_dflash
    from d3d.train.target import train_target
    from test_train_target import tiny_config

    tcfg = tiny_config(tmp_path, steps=4, hidden_size=32, num_heads=2, num_kv_heads=1, num_layers=2,
                       intermediate_size=64, vocab_size=300, max_positions=128)
    train_target(tcfg, log=lambda *_: None)

    def cfg(out, **kw):
        return DFlashTrainConfig(target=tcfg.out, out=str(tmp_path / out), corpus=tcfg.corpus,
                                 heldout_fraction=tcfg.heldout_fraction, num_layers=1, block_size=4, n_sequences=8,
                                 prompt_len=8, gen_len=12, blocks_per_sequence=2, batch_size=2, steps=4,
                                 eval_every=2, eval_prompts=1, eval_new_tokens=4, log_every=100,
                                 data_dir=str(tmp_path / "data"), **kw)

    full = train_dflash(cfg("full"), log=lambda *_: None)
    train_dflash(cfg("split", stop_after=2), log=lambda *_: None)
    resumed = train_dflash(cfg("split"), resume=True, log=lambda *_: None)
    assert [h["step"] for h in resumed["history"]] == [2, 4]
    assert resumed["history"][-1]["loss"] == pytest.approx(full["history"][-1]["loss"], rel=1e-5)


def test_default_data_and_budget_equal_the_d3d_drafters():
    """`train-dflash --data-dir DRAFTER/data` with default settings reuses the D3D drafter's cached
    continuations (the cache key includes their count) and trains with the same budget."""
    from d3d.train.dflash import DFlashTrainConfig
    from d3d.train.drafter import DrafterTrainConfig

    d3d_cfg, dflash_cfg = DrafterTrainConfig(target="t", out="o"), DFlashTrainConfig(target="t", out="o")
    for name in ("n_sequences", "prompt_len", "gen_len", "seed", "corpus", "heldout_fraction", "block_size",
                 "num_layers", "steps", "batch_size", "lr", "warmup", "gamma"):
        assert getattr(d3d_cfg, name) == getattr(dflash_cfg, name), name
