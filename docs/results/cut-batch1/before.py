"""The row price as it was before this change (commit 2fe7efe), read from git, for the "gate before" runs."""
import functools
import subprocess
import sys
import types

COMMIT = "2fe7efe"


@functools.cache
def row_price_before() -> types.ModuleType:
    source = subprocess.run(["git", "show", f"{COMMIT}:d3d/decode/row_price.py"], check=True,
                            capture_output=True, text=True).stdout
    module = sys.modules["row_price_before"] = types.ModuleType("row_price_before")  # dataclasses look it up
    exec(compile(source, f"{COMMIT}:d3d/decode/row_price.py", "exec"), module.__dict__)
    return module
