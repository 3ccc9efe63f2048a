"""docs/results/layers-cpu/passes.py on this CPU standing in for an AVX2-only one (docs/results/avx2-int8/stand_in.py).

    python docs/results/layers-cpu/avx2_passes.py MODEL [REPEATS] [--out FILE]
"""
import runpy, sys
sys.path.insert(0, "docs/results/avx2-int8")
from stand_in import avx2_only
avx2_only()
import d3d.kernels.quant as kq
assert kq._load_vnni()[0] is None, "VNNI still visible"
sys.argv = ["passes.py"] + sys.argv[1:]
runpy.run_path("docs/results/layers-cpu/passes.py", run_name="__main__")
