"""The row price before this change (commit ad9175a), read from git, for the "gate before" runs."""
import functools
import subprocess
import sys
import types

BEFORE = "ad9175a"


@functools.cache
def row_price_before() -> types.ModuleType:
    source = subprocess.run(["git", "show", f"{BEFORE}:d3d/decode/row_price.py"], check=True,
                            capture_output=True, text=True).stdout
    module = sys.modules["row_price_before"] = types.ModuleType("row_price_before")  # dataclasses look it up
    exec(compile(source, f"{BEFORE}:d3d/decode/row_price.py", "exec"), module.__dict__)
    return module
