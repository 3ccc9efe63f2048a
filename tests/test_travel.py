"""python -m bench travel: what a GPU call sends stays under the device's 64 MiB, and --prepare / --restore
leave the index and .git/info/exclude exactly as they were."""

import subprocess
from pathlib import Path

import pytest

from bench import travel

ROOT = Path(__file__).resolve().parent.parent


def sh(root, *args):
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "big").mkdir(parents=True)
    (root / "big" / "a.bin").write_bytes(b"x" * 5000)
    (root / "big" / "b.bin").write_bytes(b"y" * 3000)
    (root / "keep.txt").write_text("kept\n")
    (root / ".gitignore").write_text("/.whl/\n")
    sh(root, "init", "-q")
    sh(root, "-c", "user.email=t@t", "-c", "user.name=t", "add", "-A")
    sh(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "files")
    (root / "new.txt").write_text("untracked, not ignored\n")
    (root / ".whl").mkdir()
    (root / ".whl" / "w.whl").write_bytes(b"w" * 700)  # ignored: carried, counted by prepare
    exclude = travel.git_path(root, "info/exclude")
    exclude.write_text("# an earlier line\n*.tmp\n")
    return root


def test_travelling_counts_tracked_and_untracked_not_ignored(repo):
    sizes = travel.travelling(repo)
    assert sizes == {".gitignore": 7, "big/a.bin": 5000, "big/b.bin": 3000, "keep.txt": 5, "new.txt": 23}
    assert travel.bytes_without(repo, ("big",)) == 35


def test_prepare_then_restore_leaves_everything_as_it_was(repo):
    exclude = travel.git_path(repo, "info/exclude")
    before_exclude, before_status = exclude.read_text(), sh(repo, "status", "--porcelain")
    total = travel.prepare(repo, ("big",), ())
    assert total == 35 + 700  # the big folder no longer travels; the carried wheel does
    assert "big/a.bin" not in travel.travelling(repo) and (repo / "big" / "a.bin").is_file()  # still on disk
    with pytest.raises(SystemExit, match="--restore first"):
        travel.prepare(repo, ("big",), ())
    (repo / "keep.txt").write_text("changed\n")
    refused = subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "x"], cwd=repo,
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "--restore before committing" in refused.stderr  # would delete big/
    (repo / "keep.txt").write_text("kept\n")
    travel.restore(repo)
    assert not travel.git_path(repo, "hooks/pre-commit").exists()
    assert exclude.read_text() == before_exclude
    assert sh(repo, "status", "--porcelain") == before_status
    assert not travel.git_path(repo, travel.RECORD).exists()
    travel.restore(repo)  # nothing in place: says so, changes nothing
    assert sh(repo, "status", "--porcelain") == before_status


def test_prepare_refuses_paths_with_changes(repo):
    (repo / "big" / "a.bin").write_bytes(b"changed")
    with pytest.raises(SystemExit, match="must have no changes"):
        travel.prepare(repo, ("big",), ())
    assert "D " not in sh(repo, "status", "--porcelain")


def test_this_checkout_fits_a_gpu_call_once_prepared():
    """The tracked files bench gpu reads (all but GPU_HIDDEN) and a margin for the wheels fit the device's limit;
    a large file added outside GPU_HIDDEN fails here, before a GPU call is refused for it."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    assert travel.bytes_without(ROOT, travel.GPU_HIDDEN) + (1 << 20) <= travel.LIMIT
    for hidden in travel.GPU_HIDDEN:
        assert (ROOT / hidden).exists(), hidden


def test_the_device_command_packs_bench_gpus_results_into_one_file(tmp_path):
    """bench/gpu_device.sh (the call's command): bench gpu's files come back as $OUT/gpu.tgz (a call returns at most
    8 files); here one dry-run stage."""
    import os
    import sys
    import tarfile

    out, results = tmp_path / "out", tmp_path / "gpu"
    out.mkdir()
    env = dict(os.environ, OUT=str(out), GPU_RESULTS=str(results),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    done = subprocess.run(["bash", "bench/gpu_device.sh", "--dry-run", "--stages", "quant"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    with tarfile.open(out / "gpu.tgz") as t:
        names = {Path(n).name for n in t.getnames()}
    assert {"gpu.json", "summary.md", "quantmm.json", "quant.log"} <= names
