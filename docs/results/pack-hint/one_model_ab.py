"""One model, the layout of its 1-row passes switched per run. It ran against a change that was
tried and reverted, never committed (``d3d.cpu.linear.PackedWeight`` keeping a second copy packed for
1 row, used for 1-row fp32 passes while ``cpu_linear.SINGLE_ROW[torch.float32]`` is True; README.md
here): it records that run and does not run on main, which has no ``SINGLE_ROW``.
3 validation chat requests x 48 tokens, fp32, alternating.

    python docs/results/pack-hint/one_model_ab.py TARGET_DIR
"""
import sys
import time

import d3d
import d3d.cpu.linear as cl
from d3d.data.corpus import training_corpus
from d3d.model.tokenizer import load_tokenizer
from d3d.train.chat_data import chat_prompts

T = sys.argv[1]
tok = load_tokenizer(T)
prompts = chat_prompts(tok, training_corpus(T), 0.05, 3, "validation", seed=1234, templates=1)
m = d3d.load_model(T, dtype="float32")
for flag in (True, False):
    cl.SINGLE_ROW[d3d.cpu.precision.DTYPES["float32"]] = flag
    d3d.generate(m, prompts[0][:20], max_new_tokens=4, stop_ids=[])
for rep in range(2):
    for flag in (True, False):
        cl.SINGLE_ROW[d3d.cpu.precision.DTYPES["float32"]] = flag
        t = time.perf_counter()
        n = sum(len(d3d.generate(m, p, max_new_tokens=48, stop_ids=[]).tokens[0]) for p in prompts)
        print("single-row", flag, f"{n / (time.perf_counter() - t):.2f} tok/s", flush=True)
