"""Sampling kernels: batched acceptance and the fused denoising step, torch path vs Triton.

Cases (N sequences or blocks, B positions, vocabulary V):
  accept-greedy     accept() at T = 0                       target logits [N, B, V]
  accept-sample     accept() at T > 0, one-hot drafts
  accept-q          accept() at T > 0 with draft probabilities [N, B-1, V]
  denoise-greedy    denoise_step() at T = 0, threshold rule, all B positions masked
  denoise-sample    denoise_step() at T > 0, threshold rule, all B positions masked

Methods: torch (the torch path, the production path on CPU) and triton (the kernel, CUDA only;
on CPU it would run in the interpreter, which measures nothing useful, so it is left out).
Logits are LLM-like (a bulk of N(0, 2.5^2) and 32 tokens at 25..30 per row): at T > 0 the torch
path draws Gumbel noise only for tokens that can win, which depends on that shape.
GB/s counts one read of the logits (and of the draft probabilities for accept-q): the kernels are
memory-bound, so that is the figure to compare with the device's bandwidth. Accept at T = 0 stops
reading at the first rejection, so its drafts are all correct here (the worst case).

    python -m bench.sampling [--n 1 8 64] [--block 16] [--vocab 151936] [--dtype bf16]
                             [--repeats 20] [--threads N] [--out FILE]
"""

from __future__ import annotations

import argparse
import os

import torch

from d3d.kernels.accept import accept
from d3d.kernels.denoise import denoise_step

from .common import machine, markdown_table, timeit, write_json

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
CASES = ["accept-greedy", "accept-sample", "accept-q", "denoise-greedy", "denoise-sample"]


def make_case(case, N, B, V, dtype, device):
    """A call of the public function for one case (inputs built here, outside timing) and the
    bytes it must read."""
    g = torch.Generator(device="cpu").manual_seed(0)
    # LLM-like rows: a bulk of N(0, 2.5^2) logits and 32 tokens at 25..30.
    logits = torch.randn(N, B, V, generator=g) * 2.5
    hot = torch.randint(0, V, (N, B, 32), generator=g)
    logits.scatter_(-1, hot, 25 + 5 * torch.rand(N, B, 32, generator=g))
    logits = logits.to(device=device, dtype=dtype)
    nbytes = logits.numel() * logits.element_size()
    if case.startswith("accept"):
        draft = logits[:, : B - 1].float().argmax(-1)
        kw = dict(temperature=0.0 if case == "accept-greedy" else 0.8, seed=1,
                  stop_ids=torch.tensor([2], device=device))
        if case == "accept-q":
            kw["draft_probs"] = torch.softmax(logits[:, : B - 1].float(), -1).to(dtype)
            nbytes += kw["draft_probs"].numel() * kw["draft_probs"].element_size()
        return (lambda: accept(draft, logits, **kw)), nbytes
    tokens = torch.zeros(N, B, dtype=torch.long, device=device)
    masked = torch.ones(N, B, dtype=torch.bool, device=device)
    conf = torch.zeros(N, B, device=device)
    temperature = 0.0 if case == "denoise-greedy" else 0.8

    def step():
        masked.fill_(True)  # every step starts from a fully masked block
        denoise_step(logits, tokens, masked, temperature=temperature, seed=1, threshold=0.9,
                     confidence=conf)

    return step, nbytes


def on_backend(backend, fn):
    """``fn`` run with D3D_KERNELS set to ``backend`` (read by the kernels at call time)."""
    def run():
        os.environ["D3D_KERNELS"] = backend
        fn()
    return run


def main(argv=None) -> dict:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", choices=CASES, default=CASES)
    p.add_argument("--n", type=int, nargs="+", default=[1, 8, 64] if cuda else [1, 4])
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--dtype", choices=DTYPES, default="bf16" if cuda else "fp32")
    p.add_argument("--repeats", type=int, default=20 if cuda else 5)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    device = "cuda" if cuda else "cpu"
    if not cuda:
        print("no CUDA device: timing the torch path only; Triton timings need a GPU\n")

    def timed(fn):
        return timeit(fn, a.repeats, sync=torch.cuda.synchronize if cuda else None)

    rows, results = [], []
    for case in a.cases:
        for N in a.n:
            fn, nbytes = make_case(case, N, a.block, a.vocab, DTYPES[a.dtype], device)
            methods = {"torch": on_backend("torch", fn)}
            if cuda:
                methods["triton"] = on_backend("triton", fn)
            for name, fn in methods.items():
                with torch.inference_mode():
                    t = timed(fn)
                sec = t["median"]
                rows.append([case, name, N, sec * 1e3, nbytes / sec / 1e9])
                results.append(dict(case=case, method=name, n=N, block=a.block, vocab=a.vocab, ms=sec * 1e3,
                                    ms_min=t["min"] * 1e3, ms_max=t["max"] * 1e3, gbs=nbytes / sec / 1e9))

    print(f"B={a.block} V={a.vocab} {a.dtype} on {'GPU' if cuda else 'CPU'}, median of {a.repeats}\n")
    os.environ.pop("D3D_KERNELS", None)
    print(markdown_table(["case", "method", "N", "ms", "GB/s (logits read)"], rows))
    payload = dict(bench="sampling", config=vars(a), machine=machine(), results=results)
    write_json(a.out, payload)
    return payload


if __name__ == "__main__":
    main()
