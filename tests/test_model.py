"""The from-scratch decoder against transformers (the oracle): logits, greedy generations, caches."""

import json

import pytest
import torch

import d3d
from d3d.model.checkpoint import load_model, save_model
from d3d.decode.engines import generate

from helpers import make_hf_model, save_hf
from d3d.decode.config import Sampling

CONFIGS = [
    # (kind, kwargs, config layout, sharded)
    ("qwen3", dict(heads=4, kv_heads=4), "new", False),  # MHA (GQA ratio 1)
    ("qwen3", dict(heads=4, kv_heads=2, tied=True), "old", False),  # GQA 2, tied embeddings
    ("qwen3", dict(heads=8, kv_heads=2, head_dim=16, layers=3), "new", True),  # GQA 4, sharded
    ("qwen3", dict(heads=3, kv_heads=1, head_dim=16, hidden=48), "old", False),  # odd head count
    ("qwen2", dict(heads=4, kv_heads=2, hidden=64), "new", False),  # biases, no QK-norm
    ("qwen2", dict(heads=6, kv_heads=2, hidden=96, tied=True), "old", True),
]


@pytest.fixture(params=range(len(CONFIGS)), ids=[f"{c[0]}-{c[2]}{'-sharded' if c[3] else ''}-{i}" for i, c in enumerate(CONFIGS)])
def pair(request, tmp_path):
    kind, kwargs, layout, sharded = CONFIGS[request.param]
    hf = make_hf_model(kind, seed=request.param, **kwargs)
    save_hf(hf, tmp_path, layout=layout, max_shard_size="30KB" if sharded else None)
    if sharded:
        assert (tmp_path / "model.safetensors.index.json").exists()
    return hf, load_model(tmp_path)


def test_logits_match_transformers(pair):
    hf, model = pair
    ids = torch.randint(0, hf.config.vocab_size, (3, 17))
    with torch.no_grad():
        ref = hf(ids).logits
    out = model(ids)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


def test_greedy_batch_of_different_lengths_matches_transformers(pair):
    hf, model = pair
    prompts = [torch.randint(0, hf.config.vocab_size, (n,)).tolist() for n in (5, 12, 1)]
    out = generate(model, prompts, max_new_tokens=24, stop_ids=[])
    for p, mine in zip(prompts, out.tokens):
        ref = hf.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, min_new_tokens=24)[0, len(p):]
        assert mine == ref.tolist()
    assert out.stats.num_generated == [24, 24, 24]
    assert out.stats.target_forwards == 24


def test_cache_crop_rollback_matches_full_forward(pair):
    """Write junk K/V (rejected drafts), crop them away, continue: logits equal a clean full pass."""
    hf, model = pair
    V = hf.config.vocab_size
    prompt, cont = torch.randint(0, V, (9,)), torch.randint(0, V, (6,))
    cache = model.new_cache(rows=2, max_len=40)
    model(prompt[None], cache=cache)
    for junk_len in (4, 1, 7):
        model(torch.randint(0, V, (1, junk_len)), layout=cache.layout([junk_len]), cache=cache)
        cache.crop(0, 9)
    got = model(cont, layout=cache.layout([6]), cache=cache)
    assert cache.lengths[0] == 15
    with torch.no_grad():
        ref = hf(torch.cat([prompt, cont])[None]).logits[0, 9:]
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5)


def test_packed_pass_of_two_rows_matches_separate_passes(pair):
    hf, model = pair
    V = hf.config.vocab_size
    a, b = torch.randint(0, V, (7,)), torch.randint(0, V, (3,))
    cache = model.new_cache(rows=2, max_len=32)
    both = model(torch.cat([a, b]), layout=cache.layout([7, 3]), cache=cache)
    with torch.no_grad():
        ref_a, ref_b = hf(a[None]).logits[0], hf(b[None]).logits[0]
    torch.testing.assert_close(both[:7], ref_a, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(both[7:], ref_b, atol=2e-5, rtol=2e-5)


def test_save_then_load_round_trip(tmp_path):
    hf = make_hf_model("qwen3", tied=False)
    save_hf(hf, tmp_path / "a")
    model = load_model(tmp_path / "a")
    save_model(model, tmp_path / "b", dtype="bfloat16")
    assert json.loads((tmp_path / "b" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    again = load_model(tmp_path / "b")
    assert again.dtype == torch.float32  # fp32 is the CPU default whatever is on disk
    ids = torch.randint(0, 257, (1, 8))
    torch.testing.assert_close(again(ids), model(ids), atol=0.1, rtol=0.05)  # bf16 storage
    save_model(model, tmp_path / "c", max_shard_bytes=20_000)
    assert (tmp_path / "c" / "model.safetensors.index.json").exists()
    torch.testing.assert_close(load_model(tmp_path / "c")(ids), model(ids))
    # what we write, transformers reads
    import transformers
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "c").eval()
    with torch.no_grad():
        torch.testing.assert_close(ref(ids).logits, model(ids), atol=2e-5, rtol=2e-5)


def test_load_dtype_choice(tmp_path):
    save_hf(make_hf_model("qwen3"), tmp_path)
    m16 = d3d.load_model(tmp_path, dtype="bfloat16")
    assert m16.dtype == torch.bfloat16
    assert m16(torch.randint(0, 257, (1, 4))).dtype == torch.bfloat16
    assert not any(p.is_meta for p in m16.parameters())


def test_sampling_is_seeded_and_respects_top_k(tmp_path):
    save_hf(make_hf_model("qwen3"), tmp_path)
    model = load_model(tmp_path)
    a = generate(model, [1, 2, 3], max_new_tokens=16, stop_ids=[], sampling=Sampling(temperature=1.0, seed=7)).tokens
    b = generate(model, [1, 2, 3], max_new_tokens=16, stop_ids=[], sampling=Sampling(temperature=1.0, seed=7)).tokens
    c = generate(model, [1, 2, 3], max_new_tokens=16, stop_ids=[], sampling=Sampling(temperature=1.0, seed=8)).tokens
    assert a == b and a != c
    # top_k=1 is greedy whatever the temperature
    greedy = generate(model, [1, 2, 3], max_new_tokens=16, stop_ids=[]).tokens
    assert generate(model, [1, 2, 3], max_new_tokens=16, stop_ids=[], sampling=Sampling(temperature=2.0, top_k=1)).tokens == greedy
    assert generate(model, [1, 2, 3], max_new_tokens=16, stop_ids=[],
                    sampling=Sampling(temperature=2.0, top_p=1e-6)).tokens == greedy


def test_stop_tokens_and_streaming(tmp_path):
    save_hf(make_hf_model("qwen3"), tmp_path)
    model = load_model(tmp_path)
    free = generate(model, [[5, 6, 7], [9]], max_new_tokens=20, stop_ids=[]).tokens
    stop = free[0][6]
    first = free[0].index(stop)
    seen = {0: [], 1: []}
    out = generate(model, [[5, 6, 7], [9]], max_new_tokens=20, stop_ids=[stop],
                   stream=lambda i, new: seen[i].extend(new))
    assert out.tokens[0] == free[0][: first + 1]
    assert out.stats.stopped[0]
    assert seen[0] == out.tokens[0] and seen[1] == out.tokens[1]
