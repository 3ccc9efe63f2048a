"""The command line: generate (json, explain, modes), init, and clear errors."""

import json
import re
import subprocess
import sys

import pytest

from d3d.__main__ import main
from d3d.assets import BUNDLED_DFLASH, BUNDLED_DRAFTER, models_dir

HAS_DRAFTER = (models_dir() / BUNDLED_DRAFTER / "config.json").exists()


def run_cli(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_help_works():
    res = subprocess.run([sys.executable, "-m", "d3d", "--help"], capture_output=True, text=True)
    assert res.returncode == 0 and "generate" in res.stdout and "train-drafter" in res.stdout


def test_generate_json_ar(capsys):
    code, out, _ = run_cli(["generate", "--mode", "ar", "--prompt", "def add(a, b):", "--max-new-tokens", "8",
                            "--json"], capsys)
    assert code == 0
    obj = json.loads(out)
    assert set(obj) >= {"text", "token_ids", "num_prompt_tokens", "stats", "weights", "matmul"}
    assert 1 <= len(obj["token_ids"]) <= 8 and obj["stats"]["tokens_per_second"] > 0


@pytest.mark.skipif(not HAS_DRAFTER, reason="bundled drafter not trained yet")
def test_generate_default_is_the_devices_mode_and_explain(capsys):
    """On a CPU the default with a D3D drafter is sync (async measured slower there); --explain
    prints every round, and for async its outcome hypotheses."""
    code, out, err = run_cli(["generate", "--prompt", "import os\n", "--max-new-tokens", "24"], capsys)
    assert code == 0 and "[sync]" in err and "τ" in err
    code, out, _ = run_cli(["generate", "--prompt", "import os\n", "--max-new-tokens", "24", "--explain",
                            "--mode", "async", "--hypotheses", "3", "--fanout", "2", "--successor-threshold", "0"],
                           capsys)
    assert code == 0 and "round 0:" in out and "bonus <" in out and "verify" in out
    # count line starts: a rejected draft printed in the round may itself contain "round " (CI did)
    rounds, hyps = re.findall(r"^round \d+:", out, re.M), re.findall(r"^  hypotheses a=", out, re.M)
    assert hyps and len(hyps) == len(rounds)
    code, out, _ = run_cli(["generate", "--prompt", "import os\n", "--max-new-tokens", "24", "--json",
                            "--mode", "sync", "--block-size", "8"], capsys)
    stats = json.loads(out)["stats"]
    assert stats["block_size"] == 8 and stats["rounds"] >= 1 and stats["tau"] > 1.5, stats["tau"]


@pytest.mark.skipif(not HAS_DRAFTER, reason="bundled drafter not trained yet")
def test_generate_leaves_and_lookup_explained_and_checked(capsys):
    """--leaves L / --lookup N: --explain marks the rounds whose bonus was a verified leaf and the
    rounds whose draft was copied; bad values are refused."""
    code, out, _ = run_cli(["generate", "--prompt", "import os\n", "--max-new-tokens", "48", "--explain",
                            "--mode", "sync", "--leaves", "4", "--verify-min-prob", "0"], capsys)  # every round drafts
    assert code == 0 and re.search(r"^round \d+: accepted \d+/\d+ \+ leaf \d", out, re.M)
    assert re.search(r"\{[^}]*\} then <", out)  # the leaf, then the bonus after it
    code, out, _ = run_cli(["generate", "--prompt", "import os\nimport sys\nimport os", "--max-new-tokens", "48",
                            "--explain", "--mode", "sync", "--lookup", "1"], capsys)
    assert code == 0 and "(copied from the context)" in out
    code, out, _ = run_cli(["generate", "--prompt", "import os\n", "--max-new-tokens", "24", "--explain",
                            "--mode", "sync", "--verify-min-prob", "auto"], capsys)
    assert code == 0 and "(drafts cut where their joint estimate < 0.05)" in out  # the prior, before measuring
    with pytest.raises(SystemExit) as e:
        main(["generate", "--prompt", "x", "--mode", "sync", "--verify-min-prob", "sometimes"])
    assert e.value.code == 2 and "verify_min_prob='sometimes': expected a probability in [0, 1] or auto" in capsys.readouterr().err
    for bad, what in ((["--leaves", "-1"], "leaves=-1"), (["--lookup", "-2"], "lookup=-2")):
        try:  # a bad value is refused by the flag's parser (SystemExit 2) or by the engine (exit status 2)
            code = main(["generate", "--prompt", "x", "--mode", "sync", "--max-new-tokens", "4", *bad])
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err
        assert code == 2 and what in err, err
    code, out, _ = run_cli(["generate", "--prompt", "import os\n", "--max-new-tokens", "12", "--json",
                            "--spec", "sync lookup=0 leaves=0", "--leaves", "1"], capsys)
    assert code == 0 and json.loads(out)["spec"] == "sync lookup=0 leaves=1"  # a flag overrides --spec's knob
    code, _, err = run_cli(["generate", "--prompt", "x", "--spec", "sync", "--mode", "async"], capsys)
    assert code == 2 and "name different modes" in err


@pytest.mark.skipif(not HAS_DRAFTER, reason="bundled drafter not trained yet")
def test_generate_with_a_datastore(capsys, tmp_path):
    """--datastore DIR: an answer store of the model's own text drafts rounds (--explain says so); the
    output equals ar; a directory that is not an answer store is named."""
    import torch

    import d3d
    from d3d.assets import BUNDLED_TARGET
    from d3d.data.answers import AnswerStore, target_fingerprint

    target = d3d.load_model(models_dir() / BUNDLED_TARGET)
    tok = d3d.load_tokenizer(models_dir() / BUNDLED_TARGET)
    prompt = tok.encode("def add(a, b):")
    answer = d3d.generate(target, prompt, max_new_tokens=24, stop_ids=[]).tokens[0]
    store = AnswerStore(tmp_path / "store", target_fingerprint(target), 24)
    store.prepare()
    torch.save([[("code", prompt, prompt + answer)]], store.pending_path)
    store.seal(None, "float32")
    args = ["generate", "--prompt", "def add(a, b):", "--max-new-tokens", "24", "--mode", "sync", "--lookup", "0"]
    ar = json.loads(run_cli(["generate", "--prompt", "def add(a, b):", "--max-new-tokens", "24", "--mode", "ar",
                             "--json"], capsys)[1])["token_ids"]
    code, out, _ = run_cli(args + ["--json", "--datastore", str(tmp_path / "store")], capsys)
    assert code == 0 and json.loads(out)["token_ids"] == ar
    code, out, _ = run_cli(args + ["--explain", "--datastore", str(tmp_path / "store")], capsys)
    assert code == 0 and "(looked up in the datastore)" in out
    code, _, err = run_cli(args + ["--datastore", str(tmp_path)], capsys)
    assert code == 2 and "manifest.json: not a readable answer-store manifest" in err


def test_clear_errors(capsys, tmp_path):
    code, _, err = run_cli(["generate", "--model", str(tmp_path / "nope"), "--prompt", "x", "--mode", "ar"], capsys)
    assert code == 2 and "nope" in err
    code, _, err = run_cli(["generate", "--mode", "ar", "--prompt", "x", "--temperature", "-1"], capsys)
    assert code == 2 and "temperature" in err
    with pytest.raises(SystemExit):
        main(["generate", "--prompt", "x", "--max-new-tokens", "0"])


def test_init_writes_a_loadable_checkpoint(capsys, tmp_path):
    code, out, _ = run_cli(["init", str(tmp_path / "rnd"), "--preset", "qwen3-tiny", "--dtype", "bfloat16"], capsys)
    assert code == 0 and (tmp_path / "rnd" / "tokenizer.json").exists()
    code, out, _ = run_cli(["generate", "--model", str(tmp_path / "rnd"), "--mode", "ar", "--prompt", "hello",
                            "--max-new-tokens", "3", "--json"], capsys)
    assert code == 0 and len(json.loads(out)["token_ids"]) == 3


@pytest.mark.skipif(not HAS_DRAFTER, reason="bundled drafter not trained yet")
def test_foreign_model_falls_back_to_ar_and_says_so(capsys, tmp_path):
    """A model the bundled drafter does not fit decodes autoregressively by default (no error about
    a file the user never named); asking for a speculative mode explicitly names what is missing."""
    assert run_cli(["init", str(tmp_path / "m"), "--preset", "qwen3-tiny"], capsys)[0] == 0
    code, _, err = run_cli(["generate", "--model", str(tmp_path / "m"), "--prompt", "x = 1",
                            "--max-new-tokens", "4"], capsys)
    assert code == 0 and "[ar]" in err and "no bundled drafter fits" in err
    code, _, err = run_cli(["generate", "--model", str(tmp_path / "m"), "--prompt", "x = 1", "--mode", "sync"], capsys)
    assert code != 0 and "--mode sync needs a D3D drafter" in err and "--drafter DIR" in err
    assert f"models/{BUNDLED_DRAFTER} does not fit" in err
    code, _, err = run_cli(["generate", "--model", str(tmp_path / "m"), "--prompt", "x = 1", "--mode", "dflash"], capsys)
    assert code != 0 and f"models/{BUNDLED_DFLASH} does not fit" in err and "--drafter DIR" in err


def test_dflash_from_the_cli(capsys):
    dflash = str(models_dir() / BUNDLED_DFLASH)
    code, out, _ = run_cli(["generate", "--prompt", "import os\n", "--max-new-tokens", "24", "--drafter", dflash,
                            "--json"], capsys)
    obj = json.loads(out)
    assert code == 0 and obj["mode"] == "dflash" and obj["stats"]["rounds"] >= 1
    ar = json.loads(run_cli(["generate", "--prompt", "import os\n", "--max-new-tokens", "24", "--mode", "ar",
                             "--json"], capsys)[1])
    assert obj["token_ids"] == ar["token_ids"]  # lossless (fp32 in the tests)
    code, _, err = run_cli(["generate", "--prompt", "x", "--mode", "sync", "--drafter", dflash], capsys)
    assert code != 0 and "DFlash drafter" in err
    # on the bundled target, --mode dflash takes the bundled DFlash drafter with no other flag
    code, out, _ = run_cli(["generate", "--prompt", "import os\n", "--max-new-tokens", "24", "--mode", "dflash",
                            "--json"], capsys)
    assert code == 0 and json.loads(out)["mode"] == "dflash" and json.loads(out)["token_ids"] == ar["token_ids"]


def _broken_copies(root):
    """The bundled target, broken in the ways a user's checkpoint gets broken: from a one-file
    fp32 copy (the bundled one may be stored in shards), and a sharded copy missing a shard."""
    import shutil

    import safetensors.torch as st

    import d3d
    from d3d.assets import BUNDLED_TARGET

    bundled, src = models_dir() / BUNDLED_TARGET, root / "one-file"
    model = d3d.load_model(bundled, dtype="float32")
    shutil.copytree(bundled, src, ignore=shutil.ignore_patterns("model*.safetensors*"))
    d3d.save_model(model, src)
    weights = (src / "model.safetensors").read_bytes()
    sharded = root / "missing-shard"
    shutil.copytree(bundled, sharded, ignore=shutil.ignore_patterns("model*.safetensors*"))
    d3d.save_model(model, sharded, max_shard_bytes=len(weights) // 2)
    sorted(sharded.glob("model-*.safetensors"))[-1].unlink()

    def copy(name):
        shutil.copytree(src, root / name)
        return root / name

    def edit_config(name, **changes):
        cfg = json.loads((copy(name) / "config.json").read_text())
        cfg.update(changes)
        (root / name / "config.json").write_text(json.dumps(cfg))

    (copy("truncated") / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    (copy("garbage") / "model.safetensors").write_bytes(b"\x00garbage" * 64)
    (copy("bad-json") / "config.json").write_text('{"model_type": "qwen3",')
    edit_config("unknown-type", model_type="llama9")
    edit_config("wrong-shape", intermediate_size=1000)
    tensors = st.load_file(str(src / "model.safetensors"))
    tensors.pop("model.layers.0.mlp.up_proj.weight")
    st.save_file(tensors, str(copy("missing-tensor") / "model.safetensors"), metadata={"format": "pt"})


BAD_MODELS = {"truncated": "not a readable safetensors", "garbage": "not a readable safetensors",
              "bad-json": "not valid JSON", "unknown-type": "unknown model_type 'llama9'",
              "wrong-shape": "has shape", "missing-tensor": "missing tensor", "no-such-dir": "not a directory",
              "missing-shard": "model-00002-of-"}


def test_bad_input_ends_in_one_clear_line(capsys, tmp_path):
    """Twelve kinds of bad input: each one error line naming the problem, non-zero exit, no traceback."""
    _broken_copies(tmp_path)
    for name, message in BAD_MODELS.items():
        code, _, err = run_cli(["generate", "--model", str(tmp_path / name), "--prompt", "x", "--mode", "ar"], capsys)
        assert code != 0 and message in err and name in err and "Traceback" not in err, (name, err)
        assert len(err.strip().splitlines()) == 1, (name, err)
    long_prompt = "x = 1\n" * 3000
    for args, message in ((["--prompt", ""], "--prompt is empty"),
                          (["--prompt", long_prompt], "exceeds the model's max_position_embeddings"),
                          (["--prompt", "x", "--temperature", "-1"], "temperature")):
        try:
            code, _, err = run_cli(["generate", "--mode", "ar", *args], capsys)
        except SystemExit as e:  # errors found before any work end with SystemExit("error: ...")
            code, err = 2, str(e.code)
        assert code != 0 and message in err and "Traceback" not in err, (args, err)
    with pytest.raises(SystemExit) as e:  # argparse: usage + one error line, exit status 2
        main(["generate", "--prompt", "x", "--max-new-tokens", "-3"])
    assert e.value.code == 2 and "--max-new-tokens: must be a positive integer" in capsys.readouterr().err


def test_every_training_setting_is_a_flag():
    """train-target / train-drafter / train-dflash offer a flag for every field of their config."""
    import dataclasses

    from d3d.__main__ import build_parser, config_from_args
    from d3d.train.dflash import DFlashTrainConfig
    from d3d.train.drafter import DrafterTrainConfig
    from d3d.train.target import TargetTrainConfig

    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction)).choices
    for command, cls, api_only in (("train-target", TargetTrainConfig, {"extra"}),
                                   ("train-drafter", DrafterTrainConfig, {"shared_embeddings"}),  # --own-embeddings
                                   ("train-dflash", DFlashTrainConfig, set())):
        flags = subs[command]._option_string_actions
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.name not in api_only and "--" + f.name.replace("_", "-") not in flags]
        assert not missing, (command, missing)
    args = parser.parse_args(["train-drafter", "--target", "t", "--out", "o", "--mix", "0.5", "0.5", "0",
                              "--clean-mask", "causal", "--stop-after", "7", "--no-init-from-target"])
    cfg = config_from_args(DrafterTrainConfig, args)
    assert cfg.mix == (0.5, 0.5, 0.0) and cfg.stop_after == 7 and cfg.init_from_target is False
    assert parser.parse_args(["train-dflash", "--target", "t", "--out", "o", "--resume"]).resume


@pytest.mark.skipif(not HAS_DRAFTER, reason="bundled drafter not trained yet")
def test_demo_compares_with_ar_in_one_line(capsys):
    code, out, err = run_cli(["demo", "--max-new-tokens", "24"], capsys)
    last = out.strip().splitlines()[-1]
    assert code == 0 and re.match(r"sync: \d+ tokens at [\d.]+ tok/s, τ [\d.]+ \| ar: \d+ tokens at [\d.]+ tok/s \| "
                                  r"[\d.]+x ar, identical to ar: yes$", last), last
    assert "loading the target" in err and "decoding with sync" in err
    code, out, _ = run_cli(["demo", "--max-new-tokens", "16", "--mode", "dflash"], capsys)
    assert code == 0 and out.strip().splitlines()[-1].startswith("dflash: ")


def test_demo_refuses_a_model_without_a_drafter(capsys, tmp_path):
    assert run_cli(["init", str(tmp_path / "m"), "--preset", "qwen3-tiny"], capsys)[0] == 0
    code, _, err = run_cli(["demo", "--model", str(tmp_path / "m")], capsys)
    assert code != 0 and "needs a D3D drafter for this model" in err and "--drafter DIR" in err


def test_doctor_and_build_kernels(capsys):
    from d3d.doctor import KERNELS

    code, out, _ = run_cli(["doctor"], capsys)
    assert code == 0
    for needed in ("machine", "flags", "GB/s", "policy    dtype auto ->", "skinny_gemm.cpp", "models/target-16m",
                   "ninja", "  sync    drafter", "  dflash  drafter"):
        assert needed in out, needed
    code, out, _ = run_cli(["build-kernels"], capsys)
    lines = out.strip().splitlines()
    assert code in (0, 1) and len(lines) == 1 + len(KERNELS) and all(".cpp" in line for line in lines[1:])


def test_a_kernel_build_says_when_it_starts_and_ends(monkeypatch, capsys, tmp_path):
    """A load that takes longer than NOTICE_AFTER_S is a compile: one line when it starts, one when it ends."""
    import os
    import threading
    import time

    import torch.utils.cpp_extension as ext

    from d3d.kernels import cpp

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setattr(cpp, "NOTICE_AFTER_S", 0.05)
    monkeypatch.setattr(ext, "load", lambda **kw: time.sleep(0.3) or "module")
    monkeypatch.setattr(cpp, "cpu_flags", lambda: {"avx2", "fma"})
    source = tmp_path / "k.cpp"
    source.write_text("")
    assert cpp.build("d3d_test_slow", source, []) == ("module", None)
    err = capsys.readouterr().err
    assert "building the CPU kernel k.cpp once" in err and "built k.cpp in" in err
    monkeypatch.setattr(ext, "load", lambda **kw: "module")  # a cached load: nothing said
    assert cpp.build("d3d_test_fast", source, []) == ("module", None)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(ext, "load", lambda **kw: (_ for _ in ()).throw(RuntimeError("Ninja is required")))
    module, why = cpp.build("d3d_test_fail", source, [])
    assert module is None and "building k.cpp failed" in why and "Ninja is required" in why
    lock = cpp.build_directory("d3d_test_fast") / "lock"  # a killed build's lock: torch would wait forever
    lock.write_text("")
    os.utime(lock, (time.time() - 2 * cpp.STALE_LOCK_S,) * 2)
    monkeypatch.setattr(ext, "load", lambda **kw: "module")
    assert cpp.build("d3d_test_fast", source, []) == ("module", None)
    assert not lock.exists() and "left" in capsys.readouterr().err
    lock.write_text("")  # a young lock: another process builds; its end is waited for, and said
    threading.Timer(0.3, lock.unlink).start()
    assert cpp.build("d3d_test_fast", source, []) == ("module", None)
    assert "waiting for another process's build" in capsys.readouterr().err
    lock.write_text("")  # a young lock that grows stale while waited on (its build was killed)
    monkeypatch.setattr(cpp, "STALE_LOCK_S", 0.5)
    assert cpp.build("d3d_test_fast", source, []) == ("module", None)
    assert not lock.exists() and "left" in capsys.readouterr().err


def test_each_python_environment_builds_a_kernel_in_a_directory_of_its_own(tmp_path, monkeypatch):
    """Another environment's include paths change ninja's command and so rebuild a kernel: each environment keeps
    its builds apart, and one environment finds the same directory each time."""
    import sys

    from d3d.kernels import cpp

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    here = cpp.build_directory("d3d_k")
    assert here == cpp.build_directory("d3d_k") and here.is_dir() and here.name.startswith("d3d_k-")
    assert tmp_path / "ext" in here.parents and cpp.build_directory("d3d_other") != here
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "another-venv"))
    other = cpp.build_directory("d3d_k")
    assert other != here and other.parent == here.parent


def test_a_kernel_builds_from_one_staged_copy_of_its_files(tmp_path):
    """Two checkouts of the same kernel stage it at one path, rewriting nothing: ninja finds nothing to rebuild.
    A changed file is rewritten, the others left as they were."""
    import os

    from d3d.kernels import cpp

    for tree, text in (("a", "int x;"), ("b", "int x;")):
        (tmp_path / tree).mkdir()
        (tmp_path / tree / "k.cpp").write_text("#include \"k.h\"\n")
        (tmp_path / tree / "k.h").write_text(text)
    into = tmp_path / "build" / "src"
    staged = cpp.stage(tmp_path / "a" / "k.cpp", into)
    assert staged == into / "k.cpp" and (into / "k.h").read_text() == "int x;"
    os.utime(into / "k.cpp", (1, 1))
    os.utime(into / "k.h", (1, 1))
    cpp.stage(tmp_path / "b" / "k.cpp", into)  # the same bytes from another checkout
    assert (into / "k.cpp").stat().st_mtime == 1 and (into / "k.h").stat().st_mtime == 1
    (tmp_path / "b" / "k.h").write_text("int y;")
    cpp.stage(tmp_path / "b" / "k.cpp", into)
    assert (into / "k.h").read_text() == "int y;" and (into / "k.cpp").stat().st_mtime == 1


@pytest.mark.skipif(not HAS_DRAFTER, reason="bundled drafter not trained yet")
def test_generate_with_a_draft_model(capsys, tmp_path, monkeypatch):
    """--draft-model: the summary counts the rounds it drafted, the output is ar's; named errors for another mode
    and for a directory that is not a checkpoint."""
    from d3d.decode import draft_model
    from d3d.draft import pick

    monkeypatch.setattr(draft_model, "START_ROUNDS", 0)  # chains from the first round, whatever the drafter commits
    monkeypatch.setattr(draft_model, "START_TAU", float("inf"))
    base = ["generate", "--prompt", "import os\n", "--max-new-tokens", "24"]
    target = str(models_dir() / "target-16m")
    code, _, err = run_cli(base + ["--draft-model", target], capsys)
    assert code == 0 and "[sync]" in err and re.search(r"[1-9]\d* drafted by the draft model", err)
    _, ar, _ = run_cli(base + ["--mode", "ar"], capsys)
    _, chained, _ = run_cli(base + ["--draft-model", target], capsys)
    assert chained == ar
    with pytest.raises(SystemExit, match="--draft-model drafts in sync rounds; this run decodes another mode"):
        main(base + ["--draft-model", target, "--mode", "async"])
    with pytest.raises(SystemExit, match="--draft-model drafts in sync rounds; this run decodes another mode"):
        main(["serve", "--draft-model", target, "--mode", "async", "--port", "0"])  # refused before it listens
    code, _, err = run_cli(base + ["--draft-model", str(tmp_path)], capsys)
    assert code != 0 and f"--draft-model {tmp_path}: no config.json there" in err
    monkeypatch.setattr(pick, "default_draft_model", lambda model: target)
    code, by_default, err = run_cli(base, capsys)  # a target whose catalogue entry names a draft model
    assert code == 0 and f"draft model: {target}" in err and re.search(r"[1-9]\d* drafted by the draft model", err)
    assert by_default == ar
    code, _, err = run_cli(base + ["--draft-model", "none"], capsys)
    assert code == 0 and "draft model" not in err
