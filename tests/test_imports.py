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
    from d3d.config import preset
    from d3d.drafter import Drafter, DrafterConfig, drafter_model_config
    from d3d.kernels import HAVE_TRITON
    from d3d.kernels.attention import packed_attention
    from d3d.model import Transformer

    assert not HAVE_TRITON
    torch.manual_seed(0)
    target = Transformer(preset("qwen3-tiny")).eval()
    dcfg = DrafterConfig(block_size=4, mask_token_id=3, target_vocab=8192)
    drafter = Drafter(Transformer(drafter_model_config(target.cfg, 1, dcfg)).eval(), dcfg)
    ar = d3d.generate(target, [1, 2, 3], max_new_tokens=12, stop_ids=[])
    for mode in ("sync", "async"):
        out = d3d.generate(target, [1, 2, 3], max_new_tokens=12, stop_ids=[], mode=mode, drafter=drafter)
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
    """Prompt sets (run time) and training data share d3d/corpus.py; d3d.prompts never pulls in d3d.train."""
    script = textwrap.dedent('''
        import sys
        import d3d
        from d3d.assets import BUNDLED_TARGET, bundled
        from d3d.prompts import code_prompts
        prompts = code_prompts(d3d.load_tokenizer(bundled(BUNDLED_TARGET)), 2, 16)
        assert len(prompts) == 2 and all(len(p) == 16 for p in prompts)
        loaded = sorted(m for m in sys.modules if m.startswith("d3d.train"))
        assert not loaded, loaded
        print("OK")
    ''')
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-2000:]
