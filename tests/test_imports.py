"""What the run-time package imports: no Triton needed on the CPU path, no training code at run time."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent('''
    import os, sys

    class NoTriton:  # make "import triton" fail as on a machine without it
        def find_spec(self, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                raise ImportError("No module named 'triton' (blocked by the test)")

    sys.meta_path.insert(0, NoTriton())
    import torch
    import d3d
    from d3d.model.config import preset
    from d3d.draft.drafter import Drafter, DrafterConfig, drafter_model_config
    from d3d.kernels import HAVE_TRITON
    from d3d.kernels.attention import packed_attention
    from d3d.model.transformer import Transformer

    assert not HAVE_TRITON
    torch.manual_seed(0)
    target = Transformer(preset("qwen3-tiny")).eval()
    dcfg = DrafterConfig(block_size=4, mask_token_id=3, target_vocab=8192)
    drafter = Drafter(Transformer(drafter_model_config(target.cfg, 1, dcfg)).eval(), dcfg)
    ar = d3d.generate(target, [1, 2, 3], max_new_tokens=12, stop_ids=[])
    for mode in ("sync", "async"):
        out = d3d.generate(target, [1, 2, 3], max_new_tokens=12, stop_ids=[], spec=mode, drafter=drafter)
        assert out.tokens == ar.tokens, mode
    os.environ["D3D_KERNELS"] = "triton"
    q = torch.randn(2, 4, 16)
    try:
        packed_attention(q, q[:, :2], q[:, :2], None, None, torch.tensor([0, 2]), torch.tensor([0]),
                         torch.tensor([0, 1]))
    except RuntimeError as e:
        assert "Triton is not installed" in str(e), e
        print("OK")
''')


def test_cpu_path_without_triton():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-2000:]


def test_run_time_package_does_not_import_training_code():
    """Prompt sets (run time) and training data share d3d/data/corpus.py; d3d.data.prompts never pulls in d3d.train."""
    script = textwrap.dedent('''
        import sys
        import d3d
        from d3d.assets import BUNDLED_TARGET, bundled
        from d3d.data.prompts import code_prompts
        prompts = code_prompts(d3d.load_tokenizer(bundled(BUNDLED_TARGET)), 2, 16)
        assert len(prompts) == 2 and all(len(p) == 16 for p in prompts)
        loaded = sorted(m for m in sys.modules if m.startswith("d3d.train"))
        assert not loaded, loaded
        print("OK")
    ''')
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-2000:]


def _imports(path: Path, top_level_only: bool) -> set[str]:
    """The d3d modules ``path`` imports (relative imports resolved; ``from pkg import sub`` counts sub)."""
    import ast

    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts[:-1]
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + (node.module.split(".") if node.module else []))
            for alias in node.names:
                sub = f"{mod}.{alias.name}"
                out.add(sub if (ROOT / (sub.replace(".", "/") + ".py")).exists() else mod)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m == "d3d" or m.startswith("d3d.")}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_run_time_module_imports_training_code():
    """Static: no module outside d3d/train/ (the CLI's training commands aside) imports d3d.train, even lazily."""
    offenders = []
    for path in sorted((ROOT / "d3d").rglob("*.py")):
        mod = _module(path)
        if mod.startswith("d3d.train") or mod == "d3d.__main__":
            continue
        offenders += [f"{mod} -> {m}" for m in _imports(path, top_level_only=False) if m.startswith("d3d.train")]
    assert not offenders, offenders


def test_imports_have_no_cycle():
    """No module imports one that imports it back, however indirectly; imports inside functions count
    (a cycle hidden by a lazy import is still a cycle)."""
    graph = {_module(p): _imports(p, top_level_only=False) for p in (ROOT / "d3d").rglob("*.py")}
    state: dict[str, int] = {}

    def visit(m, trail):
        if state.get(m) == 1:
            raise AssertionError("import cycle: " + " -> ".join(trail[trail.index(m):] + [m]))
        if state.get(m) == 2 or m not in graph:
            return
        state[m] = 1
        for n in sorted(graph[m]):
            if n != m and not m.startswith(n + "."):  # a submodule importing its own package's __init__ is fine
                visit(n, trail + [m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])


# The rooms of d3d/ (a folder, or a module at the top; "d3d" is the public API in d3d/__init__.py) by
# floor, lowest first. A room imports only rooms on lower floors: no arrow up, none sideways, so no
# circle between folders. A new room gets a floor here.
FLOORS = (
    ("env",),  # the environment variables d3d reads
    ("files", "assets", "hardware"),  # atomic writes, where models live, what the CPU offers
    ("kernels",),  # attention, acceptance, denoising, CPU matmul kernels
    ("cpu",),  # the precision policy, prepacked and quantized matrices
    ("model",),  # what a checkpoint is
    ("fetch",),  # real models fetched by name (and converted)
    ("data", "draft"),  # prompt sets and answer stores; the drafters
    ("decode",),  # the decoders
    ("d3d", "serve", "demo", "doctor"),  # the public API and its users
    ("train",),  # training reads the public API
    ("__main__",),  # the CLI
)


def _room(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def test_folders_import_only_lower_floors():
    """Every import between rooms of d3d/ goes down a floor (imports inside functions count)."""
    floor = {room: i for i, rooms in enumerate(FLOORS) for room in rooms}
    modules = {_module(p): p for p in (ROOT / "d3d").rglob("*.py")}
    unplaced = sorted({_room(m) for m in modules} - set(floor))
    assert not unplaced, f"rooms with no floor in FLOORS: {unplaced}"
    wrong = []
    for m, path in sorted(modules.items()):
        for n in sorted(_imports(path, top_level_only=False)):
            a, b = _room(m), _room(n)
            if a != b and floor[b] >= floor[a]:
                wrong.append(f"{m} -> {n} ({a}: floor {floor[a]}, {b}: floor {floor[b]})")
    assert not wrong, "imports that do not go down a floor:\n" + "\n".join(wrong)


def test_readme_layout_tree_names_every_module():
    """The README's architecture tree is kept true: every module under d3d/ (train/ summarised on one line)
    is listed in its folder, and every listed file exists."""
    import re

    text = (ROOT / "README.md").read_text()
    block = re.search(r"```\nd3d/\n(.*?)```", text, re.S).group(1)
    listed, stack = set(), []
    for line in block.splitlines():
        m = re.match(r"( *)(\S+)", line)
        if not m:
            continue
        depth, name = len(m.group(1)) // 2, m.group(2)
        if depth == 0:  # models/, bench/, ... after the d3d tree
            break
        stack = stack[: depth - 1]
        if name.endswith("/"):
            stack.append(name[:-1])
        elif name.endswith((".py", ".cpp", ".h")) and "(" not in name:
            listed.add("/".join(["d3d"] + stack + [name]))
    for path in sorted(listed):
        assert (ROOT / path).is_file(), f"README lists {path}, which does not exist"
    actual = {str(p.relative_to(ROOT)) for p in (ROOT / "d3d").rglob("*.py")
              if "train" not in p.parts and not (p.name == "__init__.py" and p.parent.name not in ("d3d", "kernels"))}
    missing = sorted(actual - listed)
    assert not missing, f"README's architecture tree misses {missing}"
