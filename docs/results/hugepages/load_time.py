"""load_model's time and peak memory with D3D_HUGEPAGES=auto (the default) and off, in fresh processes taking turns.

    python docs/results/hugepages/load_time.py qwen2.5-coder-1.5b 3 > docs/results/hugepages/load_time_1.5b.txt
"""
import os
import subprocess
import sys

CHILD = """
import resource, time
import d3d
from d3d.fetch import resolve_model
start = time.perf_counter()
model = d3d.load_model(resolve_model({name!r}), weights="auto")  # kept: its arena stays mapped
seconds = time.perf_counter() - start
huge = [line.split()[1] for line in open("/proc/self/smaps_rollup") if line.startswith("AnonHugePages")]
print(f"{{seconds:.2f}} {{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10}} {{int(huge[0]) >> 10}}")
"""


def main():
    name, turns = sys.argv[1], int(sys.argv[2])
    print(f"{name}: load_model in a fresh process, D3D_HUGEPAGES auto / off taking turns")
    for turn in range(turns):
        for setting in ("auto", "off"):
            out = subprocess.run([sys.executable, "-c", CHILD.format(name=name)], capture_output=True, text=True,
                                 env={**os.environ, "D3D_HUGEPAGES": setting}, check=True).stdout.split()
            print(f"turn {turn + 1} {setting:4s}: {out[0]} s, peak RSS {out[1]} MB, in huge pages {out[2]} MB",
                  flush=True)


if __name__ == "__main__":
    main()
