"""The row price as it was at a commit (by default 2fe7efe, before this change), read from git, for the "gate
before" runs (``docs/results/batch-gate/`` reads ad9175a's)."""
import functools
import subprocess
import sys
import types

COMMIT = "2fe7efe"


@functools.cache
def row_price_before(commit: str = COMMIT) -> types.ModuleType:
    source = subprocess.run(["git", "show", f"{commit}:d3d/decode/row_price.py"], check=True,
                            capture_output=True, text=True).stdout
    name = f"row_price_{commit}"
    module = sys.modules[name] = types.ModuleType(name)  # dataclasses look it up
    exec(compile(source, f"{commit}:d3d/decode/row_price.py", "exec"), module.__dict__)
    return module
