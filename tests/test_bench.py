"""Timing-free smoke tests of every benchmark command on tiny inputs; the JSON follows the schema."""

import json
import os
import statistics

import pytest
import torch

import d3d
from d3d.assets import BUNDLED_TARGET, models_dir
from d3d.model.config import preset
from d3d.draft.drafter import Drafter, DrafterConfig, drafter_model_config, save_drafter
from d3d.model.transformer import Transformer

from bench import schema
from bench.run import main as bench_main, readme_table


def bench_main_payload(argv):
    """Run a bench command and return its payload (run.main returns only an exit code)."""
    from bench import gpu

    assert argv[0] == "gpu"
    return gpu.main(argv[1:])


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """A random tiny target with the bundled tokenizer, and a random drafter of its shape."""
    root = tmp_path_factory.mktemp("pair")
    torch.manual_seed(0)
    target = Transformer(preset("qwen3-tiny", eos_token_id=0)).eval()
    d3d.save_model(target, root / "target")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (root / "target" / name).write_bytes((models_dir() / BUNDLED_TARGET / name).read_bytes())
    dcfg = DrafterConfig(block_size=4, mask_token_id=3, target_vocab=8192)
    save_drafter(Drafter(Transformer(drafter_model_config(target.cfg, 1, dcfg)).eval(), dcfg), root / "drafter")
    return root


def test_speculative_smoke(tiny_pair, tmp_path):
    out = tmp_path / "spec.json"
    bench_main(["speculative", "--target", str(tiny_pair / "target"), "--drafter", str(tiny_pair / "drafter"),
                "--n", "1", "--new-tokens", "6", "--block-size", "4", "--modes", "ar", "ar-fp32", "sync", "async",
                "async,overlap=none,successor_threshold=0,hypotheses=3,fanout=2", "sync,verify_min_prob=1",
                "sync,verify_min_prob=auto", "sync,verify_min_prob=0,lookup=0,leaves=3", "--sets", "code", "humaneval", "mtbench", "docs", "--out", str(out), "--plots", str(tmp_path / "plots")])
    payload = json.loads(out.read_text())
    schema.validate(payload)
    # every requested set is either measured or reported missing with a reason; none vanishes
    assert set(payload["results"]) | set(payload["missing_sets"]) == {"code", "humaneval", "mtbench", "docs"}
    assert "code" in payload["results"] and set(payload["results"]["code"]) == {
        "ar", "ar-fp32", "sync", "async", "async,overlap=none,successor_threshold=0,hypotheses=3,fanout=2",
        "sync,verify_min_prob=1", "sync,verify_min_prob=auto", "sync,verify_min_prob=0,lookup=0,leaves=3"}
    code = payload["results"]["code"]
    fastest = max(code["ar"]["tok_s"], code["ar-fp32"]["tok_s"])
    assert code["sync"]["speedup_vs_fastest_ar"] == pytest.approx(code["sync"]["tok_s"] / fastest)
    k3 = payload["results"]["code"]["async,overlap=none,successor_threshold=0,hypotheses=3,fanout=2"]
    assert 0 < k3["hypotheses_per_round"] <= 3 and len(k3["hit_rate_by_accept"]) == 4
    flags = payload["results"]["code"]["sync,verify_min_prob=0,lookup=0,leaves=3"]
    assert flags["verified_drafts_per_round"] == 3 and flags["leaves_per_round"] == 3 and flags["lookup_rate"] == 0
    assert payload["results"]["code"]["sync"]["verified_drafts_per_round"] <= 3  # B - 1, less after short copies
    assert all(reason for reason in payload["missing_sets"].values())
    assert "| code | sync |" in readme_table(str(out))
    bench_main(["speculative", "--target", str(tiny_pair / "target"), "--drafter", str(tiny_pair / "drafter"),
                "--n", "1", "--new-tokens", "4", "--block-size", "4", "--modes", "ar", "sync", "--sets", "code",
                "--compare", str(out)])


def test_decode_smoke(tmp_path, capsys):
    out = tmp_path / "decode.json"
    bench_main(["decode", "--sizes", "qwen3-tiny", "--new-tokens", "4", "--repeats", "1", "--prompt-len", "4",
                "--bandwidth-bytes", str(1 << 20), "--out", str(out)])
    payload = json.loads(out.read_text())
    schema.validate(payload)
    assert payload["results"][0]["model"] == "qwen3-tiny" and "transformers" in payload["results"][0]
    bench_main(["decode", "--sizes", "qwen3-tiny", "--new-tokens", "4", "--repeats", "1", "--prompt-len", "4",
                "--bandwidth-bytes", str(1 << 20), "--no-transformers", "--compare", str(out)])
    assert "vs previous run" in capsys.readouterr().out


def test_kernels_smoke(tmp_path):
    out = tmp_path / "kernels.json"
    bench_main(["kernels", "--quick", "--out", str(out)])
    schema.validate(json.loads(out.read_text()))
    bench_main(["kernels", "--quick", "--compare", str(out)])


def test_schema_rejects_bad_payloads():
    with pytest.raises(ValueError, match="missing 'machine'"):
        schema.validate({"bench": "decode"})
    m = {"cpu": "x", "cores": 2, "torch": "2", "python": "3", "platform": "p", "torch_threads": 1}
    with pytest.raises(ValueError, match=r"\$.results.code: missing the 'ar' baseline"):
        schema.validate({"bench": "speculative", "machine": m, "config": {}, "results": {"code": {}},
                         "missing_sets": {}, "target_parameters": 1, "drafter_parameters": 1})
    with pytest.raises(ValueError, match="unknown benchmark"):
        schema.validate({"bench": "nope", "machine": m})


def test_speculative_chat_smoke(tiny_pair, tmp_path):
    out = tmp_path / "spec_chat.json"
    bench_main(["speculative", "--target", str(tiny_pair / "target"), "--drafter", str(tiny_pair / "drafter"),
                "--n", "1", "--new-tokens", "5", "--block-size", "4", "--modes", "ar", "sync", "--chat",
                "--sets", "humaneval", "--out", str(out)])
    payload = json.loads(out.read_text())
    schema.validate(payload)
    assert payload["config"]["chat"] and set(payload["results"]) | set(payload["missing_sets"]) == {"humaneval"}
    for sets in (["code"], ["explain"]):  # raw text is not chat; explain is validation only
        with pytest.raises(SystemExit):
            bench_main(["speculative", "--target", str(tiny_pair / "target"), "--drafter", str(tiny_pair / "drafter"),
                        "--chat", "--sets", *sets])


def test_answers_smoke(tiny_pair, tmp_path, capsys):
    """Both generation modes answer the same requests alike (fp32), and the JSON validates."""
    out = tmp_path / "answers.json"
    bench_main(["answers", "--target", str(tiny_pair / "target"), "--n", "5", "--gen-len", "6", "--dtype", "float32",
                "--modes", "batch:2", "continuous:2", "whole:3", "--out", str(out)])
    payload = json.loads(out.read_text())
    schema.validate(payload)
    assert [r["mode"] for r in payload["results"]] == ["batch:2", "continuous:2", "whole:3"]
    assert [r["same_answers"] for r in payload["results"]] == [5, 5, 5]
    assert "answer tok/s" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench_main(["answers", "--target", str(tiny_pair / "target"), "--modes", "continuous:0"])


def test_parity_smoke(tiny_pair, tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "parity.json"
    bench_main(["parity", "--model", str(tiny_pair / "target"), "--new-tokens", "4", "--out", str(out)])
    payload = json.loads(out.read_text())
    schema.validate(payload)
    assert all(r["greedy_identical"] and r["max_abs_logit_diff"] < 1e-3 for r in payload["results"])
    payload["results"][0]["greedy_identical"] = "yes"
    with pytest.raises(ValueError, match=r"results\[0\].greedy_identical"):
        schema.validate(payload)


def test_gpu_script_dry_run(tmp_path):
    """python -m bench gpu --dry-run: every stage of the GPU plan runs (CPU, toy sizes) and reports."""
    payload = bench_main_payload(["gpu", "--dry-run", "--out", str(tmp_path / "gpu")])
    schema.validate(payload)
    assert list(payload["stages"]) == ["kernel-tests", "kernels-4k", "passes", "speculative", "hypotheses", "quant",
                                       "kernels-1k", "kernels-8k"]
    failed = {n: r["last_lines"] for n, r in payload["stages"].items() if r["status"] != "ok"}
    assert not failed, failed
    for name in ("kernels_4k.json", "passes.json", "speculative.json", "hypotheses.json", "quantmm.json", "gpu.json",
                 "summary.md"):
        assert (tmp_path / "gpu" / name).is_file(), name
    schema.validate(json.loads((tmp_path / "gpu" / "passes.json").read_text()))


def test_gpu_script_refuses_a_cpu_without_dry_run(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(SystemExit, match="no CUDA device"):
        bench_main(["gpu", "--out", str(tmp_path)])


def test_passes_smoke(tmp_path):
    out = tmp_path / "passes.json"
    bench_main(["passes", "--preset", "qwen3-tiny", "--T", "1", "3", "--repeats", "2", "--out", str(out)])
    payload = json.loads(out.read_text())
    schema.validate(payload)
    assert {r["T"] for r in payload["results"]} == {1, 3}
    assert all(r["ms_min"] <= r["ms"] <= r["ms_max"] for r in payload["results"])  # medians of the repeats
    assert payload["machine"]["dtype_policy"]["dtype"] in ("float32", "bfloat16")


def test_passes_each_configuration_reads_its_own_bytes(tmp_path):
    """Several dtypes in one run: each row's GB/s is over the bytes its own configuration holds (the last
    one's had served them all)."""
    out = tmp_path / "passes.json"
    bench_main(["passes", "--preset", "qwen3-tiny", "--T", "1", "--repeats", "2", "--dtypes", "float32", "bfloat16",
                "--out", str(out)])
    rows = {r["dtype"]: r for r in json.loads(out.read_text())["results"]}
    assert rows["float32"]["streamed_bytes"] == 2 * rows["bfloat16"]["streamed_bytes"]


def test_passes_floor_is_the_slower_of_memory_and_multiply_adds():
    from bench.passes import floor_ms

    assert floor_ms(400_000_000, 500_000_000, 1, 40.0, 1e12) == pytest.approx(10.0)  # 400 MB at 40 GB/s
    assert floor_ms(400_000_000, 500_000_000, 32, 40.0, 1e12) == pytest.approx(16.0)  # 32 x 0.5 G at 1 T/s


def test_passes_times_fp32_matmuls_side_by_side(tmp_path, monkeypatch):
    monkeypatch.delenv("D3D_CPU_MATMUL", raising=False)
    out = tmp_path / "passes.json"
    bench_main(["passes", "--preset", "qwen3-tiny", "--T", "1", "4", "--repeats", "2", "--dtypes", "float32",
                "--cpu-matmul", "panels", "onednn", "--out", str(out)])
    rows = json.loads(out.read_text())["results"]
    assert sorted((r["cpu_matmul"], r["T"]) for r in rows) == [("onednn", 1), ("onednn", 4),
                                                              ("panels", 1), ("panels", 4)]
    assert {r["vs_T1"] for r in rows if r["T"] == 1} == {1.0}  # each layout against its own 1-token pass
    assert "D3D_CPU_MATMUL" not in os.environ  # the choice is restored after loading


def test_target_quality_smoke(tiny_pair, tmp_path):
    out = tmp_path / "target.json"
    bench_main(["target", "--model", str(tiny_pair / "target"), "--n", "2", "--max-new-tokens", "8",
                "--max-tokens", "3000", "--out", str(out)])
    payload = json.loads(out.read_text())
    schema.validate(payload)
    assert set(payload["bits_per_byte"]) == {"stdlib_evaluation", "numpy"}
    assert payload["completions"]["n"] == 2 and payload["bits_per_byte"]["numpy"]["bits_per_byte"] > 1  # random


def test_target_completion_cut_and_parse_rules():
    from bench.target import cut_function, has_statement

    head = 'def f(x):\n    """Double."""\n'
    body, ended = cut_function("    y = 2 * x\n    return y\n\ndef g():\n    pass\n")
    assert ended and body == "    y = 2 * x\n    return y\n\n"
    body, ended = cut_function("    y = 2 * x\n    return y<|endoftext|>def g")
    assert ended and body == "    y = 2 * x\n    return y"
    body, ended = cut_function("    y = 2 * x\n    return (y +")  # the budget cut the last line
    assert not ended and body == "    y = 2 * x\n"
    assert has_statement(head, "    return 2 * x\n")
    assert not has_statement(head, "\n")  # a docstring alone wrote no code
    assert not has_statement(head, "    return (\n")


def test_target_completions_that_loop_are_counted():
    """A greedy loop can parse; it is counted as looping and is not sensible."""
    from bench.target import completion_rates, loops

    loop = "    if x is None:\n        x = 0\n" * 4
    assert loops(loop) and not loops("    y = 2 * x\n    return y\n")
    assert not loops("    return 0\n" * 5)  # too short to call a loop
    rows = [{"parses": True, "ended": True, "completion": "    return 2 * x\n"},
            {"parses": True, "ended": False, "completion": loop},
            {"parses": False, "ended": True, "completion": "    return (\n"},
            {"parses": True, "ended": True, "completion": loop}]
    assert completion_rates(rows) == {"parse_rate": 0.75, "loop_rate": 0.5, "sensible_rate": 0.25}


def test_agreement_smoke(tiny_pair, tmp_path):
    out = tmp_path / "agree.json"
    bench_main(["agreement", "--target", str(tiny_pair / "target"), "--drafter", str(tiny_pair / "drafter"),
                "--n", "1", "--new-tokens", "5", "--sets", "code", "--modes", "sync", "--dtype", "float32",
                "--out", str(out)])
    payload = json.loads(out.read_text())
    schema.validate(payload)
    assert payload["summary"]["sync"] == {"prompts": 1, "identical": 1, "agreement": 1.0}  # fp32: equal to ar
    with pytest.raises(SystemExit):  # raw-text sets cannot be asked as chat turns
        bench_main(["agreement", "--target", str(tiny_pair / "target"), "--drafter", str(tiny_pair / "drafter"),
                    "--chat", "--sets", "code"])


def test_speculative_store_modes(tiny_pair, tmp_path):
    """+storeN drafts from --datastore (an answer store of this target); a store holding the target's
    own continuation of the prompt drafts every round it can; +store without --datastore is refused."""
    from d3d.data.corpus import training_corpus
    from d3d.data.prompts import load_prompt_set
    from d3d.data.answers import AnswerStore, target_fingerprint

    target = d3d.load_model(tiny_pair / "target", dtype="float32")
    tok = d3d.load_tokenizer(tiny_pair / "target")
    prompt = load_prompt_set("code", tok, 1, 64, corpus=training_corpus(tiny_pair / "target"))[0]
    answer = d3d.generate(target, prompt, max_new_tokens=12, stop_ids=[]).tokens[0]
    store = AnswerStore(tmp_path / "store", target_fingerprint(target), 12)
    store.prepare()
    torch.save([[("code", prompt, prompt[-8:] + answer)]], store.pending_path)
    store.seal(None, "float32")
    out = tmp_path / "spec.json"
    common = ["speculative", "--target", str(tiny_pair / "target"), "--drafter", str(tiny_pair / "drafter"), "--n", "1",
              "--new-tokens", "12", "--block-size", "4", "--sets", "code", "--dtype", "float32"]
    bench_main(common + ["--modes", "ar", "sync,lookup=0", "sync,lookup=0,store=0", "sync,lookup=0,store=10",
                         "--datastore", str(tmp_path / "store"), "--out", str(out)])
    payload = json.loads(out.read_text())
    schema.validate(payload)
    res = payload["results"]["code"]
    assert res["sync,lookup=0"]["datastore_rate"] == 0 < res["sync,lookup=0,store=0"]["datastore_rate"]
    assert res["sync,lookup=0,store=0"]["tau"] > res["sync,lookup=0"]["tau"]
    assert all(r["identical_to_ar"] == 1 for r in res.values())
    with pytest.raises(SystemExit):
        bench_main(common + ["--modes", "ar", "sync,store=0"])


def test_bench_serve_smoke(tmp_path):
    """``python -m bench serve`` on the bundled pair: a server process, one client, two tiny requests per
    mode, a short RSS run; every request completes and the JSON follows the schema."""
    out = tmp_path / "serve.json"
    assert bench_main(["serve", "--clients", "1,2", "--requests", "2", "--max-tokens", "4", "--rss", "100",
                       "--out", str(out)]) == 0
    payload = json.loads(out.read_text())
    schema.validate(payload)
    assert [(r["mode"], r["clients"]) for r in payload["results"]] == [("sync", 1), ("sync", 2), ("ar", 1), ("ar", 2)]
    assert all(r["completed"] == 2 and not r["errors"] and r["tokens"] >= 2 for r in payload["results"])
    assert payload["rss"]["requests"] == 100 and len(payload["rss"]["samples"]) == 1


def test_target_takes_a_directory_a_real_models_name_or_nothing(tmp_path, monkeypatch, capsys):
    """``--target`` of passes, speculative and agreement: a directory as given, a real model's name
    through ``d3d fetch`` (fetched once, said on stderr), nothing for the bundled target."""
    import d3d.fetch
    from bench.common import target_dir
    from d3d.assets import bundled

    def fake_fetch(name, log=print):
        log(f"{name}: already converted")
        return tmp_path / name

    monkeypatch.setattr(d3d.fetch, "fetch", fake_fetch)
    assert target_dir(None, "passes") == bundled(BUNDLED_TARGET)
    assert target_dir(str(tmp_path), "passes") == tmp_path
    assert target_dir("qwen2.5-coder-1.5b", "speculative") == tmp_path / "qwen2.5-coder-1.5b"
    assert "bench speculative: qwen2.5-coder-1.5b: already converted" in capsys.readouterr().err


def test_llamacpp_side_by_side_with_a_datastore(tiny_pair, tmp_path, monkeypatch):
    """``bench llamacpp`` with stand-ins for llama.cpp's binaries (their timing lines, the target's texts not
    needed): every engine answers every request, d3d's speculative engines equal d3d-ar, and ``--datastore``
    adds the d3d-store engine, the defaults drafting from the target's answer stores, ``--draft-model`` the
    d3d-model engine, the defaults drafting with a smaller model's chains (here the target's own)."""
    from bench import llamacpp
    from d3d.data.answers import AnswerStore, target_fingerprint
    from d3d.decode import draft_model

    bins = tmp_path / "bin"
    bins.mkdir()
    timings = {"llama-completion": "prompt eval time =      10.00 ms /     5 tokens\n"
                                   "       eval time =     100.00 ms /     7 runs\n",
               "llama-lookup": "encoded    5 tokens in    0.010 seconds\ndecoded    8 tokens in    0.050 seconds\n",
               "llama-speculative-simple": "encoded    5 tokens in    0.010 seconds\n"
                                           "decoded    8 tokens in    0.080 seconds\n"}
    for name, err in timings.items():
        (bins / name).write_text(f"#!/bin/sh\necho 'some text'\nprintf '{err}' >&2\n")
        (bins / name).chmod(0o755)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    target = d3d.load_model(tiny_pair / "target", dtype="float32")
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14]]
    store = AnswerStore(tmp_path / "store", target_fingerprint(target), 12)
    store.prepare()
    torch.save([[("chat", p, p + d3d.generate(target, p, max_new_tokens=12, stop_ids=[]).tokens[0])
                 for p in prompts]], store.pending_path)
    store.seal(None, "float32")
    monkeypatch.setattr(llamacpp, "load_prompt_set", lambda name, tok, n, chat: prompts[:n])
    monkeypatch.setattr(llamacpp, "request_sets", lambda tok, path, names: {"library": [[15, 16, 17, 18, 19]] * 8})
    monkeypatch.setattr(draft_model, "START_ROUNDS", 0)  # chains from the first round, whatever the drafter commits
    payload = llamacpp.main(["--target", str(tiny_pair / "target"), "--gguf", str(tmp_path / "m.gguf"),
                             "--llama-bin", str(bins), "--drafter", str(tiny_pair / "drafter"), "--weights", "float32",
                             "--n-code", "2", "--n-library", "1", "--n-prose", "1", "--new-tokens", "12",
                             "--llama-draft", str(tmp_path / "m.gguf"), "--datastore", str(tmp_path / "store"),
                             "--draft-model", str(tiny_pair / "target"), "--out", str(tmp_path / "l.json")])
    engines = {"llama-ar", "llama-lookup", "llama-spec", "d3d-ar", "d3d-alone", "d3d", "d3d-store", "d3d-model"}
    assert set(payload["tok_s"]["code"]) == engines and len(payload["tok_s"]["code"]["d3d-store"]) == 2
    assert len(payload["tok_s"]["library"]["d3d"]) == 1  # held-out library functions, a set of their own
    assert payload["speculative_equal_to_ar"] == "4/4" and payload["config"]["datastore"] == [str(tmp_path / "store")]
    assert payload["tok_s"]["code"]["llama-ar"] == [8 / 0.11] * 2  # 7 runs + the prompt pass's token, 110 ms
    assert json.loads((tmp_path / "l.json").read_text())["median_tok_s"]["prose"]["d3d-store"] > 0
    code = payload["tok_s"]["code"]
    ratios = [a / b for a, b in zip(code["d3d"], code["d3d-ar"])]  # per request, over d3d's own ar
    assert payload["vs_d3d_ar"]["code"]["d3d"] == {"median": statistics.median(ratios), "worst": min(ratios)}
    assert set(payload["vs_d3d_ar"]["prose"]) == {"d3d-alone", "d3d", "d3d-store", "d3d-model"}
    assert payload["tau"]["code"]["d3d-model"] > 1  # the target drafting for itself: its chains are accepted
