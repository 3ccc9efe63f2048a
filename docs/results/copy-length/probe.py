"""Offline probe: how far are copied drafts (lookup=3) accepted, and what would cutting them save?

The target's greedy answers in the answer store (chunks 7..9: requests about functions the shipped
drafter trained on least) are walked as the engine meets them: at each round the committed tokens are
prompt + answer[:p]; where the context holds a copy (lookup_chain, n = 3..8) the round proposes up to
15 copied tokens and accepts the longest prefix equal to the real continuation, then a bonus. Other
rounds are stepped over (p += 1; not counted). Prints, by match length n, the rounds, the mean accepted,
and P(position k accepted | k-1 accepted); then, with a CPU cost model (a verification of w drafts costs
STEP + ROW * w, the AVX2 fp32 figures of `bench passes`), tokens per second of the copied rounds if a
copy is cut at w, for fixed w and for a cut where the estimated chance of reaching a position falls
below a threshold.

    PYTHONPATH=. python docs/results/copy-length/probe.py [STORE [EVERY]] > docs/results/copy-length/probe.txt
"""
import sys
import time
from collections import defaultdict
from pathlib import Path

from d3d.data.answers import read_chunk, read_manifest

STORE = Path(sys.argv[1] if len(sys.argv) > 1 else "data/qwen2.5-coder-answers")
DEPTH, STEP, ROW = 15, 129.0, 9.3  # ms: bench passes on AVX2 fp32, T=1 129 ms, T=16 278 ms
chunks = read_manifest(STORE)["chunks"]
rows = [a for c in chunks[7:10] for a in read_chunk(STORE / c["file"])][::int(sys.argv[2]) if len(sys.argv) > 2 else 4]


BUCKETS = (3, 4, 8, 16)  # extended match length: bucket b holds lengths [b, next b)


def longest_match(ctx: list[int], min_n: int = 3, max_n: int = 8):
    """(bucket of the match length, start of the continuation) of lookup_chain's occurrence: the most
    recent one of the longest suffix of n <= max_n tokens, its match then extended backwards (cap 16)."""
    L = len(ctx)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        tail = ctx[L - n:]
        for s in range(L - n - 1, -1, -1):
            if ctx[s:s + n] == tail:
                m = n
                while m < 16 and s - (m - n) - 1 >= 0 and ctx[s - (m - n) - 1] == ctx[L - m - 1]:
                    m += 1
                return max(b for b in BUCKETS if b <= m), s + n
    return None


def rounds_of(a, cut):
    """The copied rounds of one answer walked with copies cut by ``cut(n, chain)`` -> w: (n, w, accepted) each."""
    out, p = [], 0
    while p < len(a.answer):
        ctx = a.prompt + a.answer[:p]
        m = longest_match(ctx)
        if m is None:
            p += 1
            continue
        n, s = m
        chain = ctx[s:s + DEPTH]
        truth = a.answer[p:p + DEPTH]
        acc = next((i for i, (x, y) in enumerate(zip(chain, truth)) if x != y), min(len(chain), len(truth)))
        w = min(len(chain), cut(n, chain))
        acc = min(acc, w)
        out.append((n, w, acc, len(chain)))
        p += acc + 1
    return out


t0 = time.perf_counter()
full = [r for a in rows for r in rounds_of(a, lambda n, c: DEPTH)]
print(f"{len(rows)} answers, {len(full)} copied rounds, {time.perf_counter() - t0:.0f} s")
reach, ok = defaultdict(lambda: [0] * (DEPTH + 1)), defaultdict(lambda: [0] * (DEPTH + 1))
for n, w, acc, length in full:
    for k in range(1, length + 1):
        reach[n][k] += 1
        ok[n][k] += acc >= k
        if acc < k:
            break
print("estimates (smoothed: (accepted + 1) / (reached + 2), positions reached under 20 times take the bucket's pooled rate):")
for n in sorted(reach):
    pooled = (sum(ok[n][1:]) + 1) / (sum(reach[n][1:]) + 2)
    row = [(ok[n][k] + 1) / (reach[n][k] + 2) if reach[n][k] >= 20 else pooled for k in range(1, DEPTH + 1)]
    print(f"    {n}: ({', '.join(f'{c:.2f}' for c in row)}),")
print("n, rounds, mean accepted, P(k accepted | k-1 accepted) for k = 1..15")
for n in sorted(reach):
    cond = [ok[n][k] / reach[n][k] if reach[n][k] else float("nan") for k in range(1, DEPTH + 1)]
    m = [r for r in full if r[0] == n]
    print(f"{n}: {len(m):5d} {sum(r[2] for r in m) / len(m):5.2f}  " + " ".join(f"{c:.2f}" for c in cond))
est = {n: [ok[n][k] / max(1, reach[n][k]) for k in range(1, DEPTH + 1)] for n in reach}


def rate(rs):
    tokens = sum(acc + 1 for _, _, acc, _ in rs)
    ms = sum(STEP + ROW * w for _, w, _, _ in rs)
    return tokens, ms, tokens / ms * 1000


print(f"\ncost model: STEP {STEP} ms + ROW {ROW} ms per draft; copied rounds only")
print("rule, rounds, tokens, tok/s")
for w in (15, 12, 10, 8, 6, 4):
    rs = [r for a in rows for r in rounds_of(a, lambda n, c, w=w: w)]
    t, ms, r = rate(rs)
    print(f"fixed w={w:2d}: {len(rs):5d} {t:6d} {r:6.1f}")


def by_estimate(min_prob):
    def cut(n, chain):
        p, w = 1.0, 0
        for c in est[n][:len(chain)]:
            p *= c
            if p < min_prob:
                break
            w += 1
        return max(w, 1)
    return cut


for mp in (0.05, 0.1, 0.2, 0.3, 0.4):
    rs = [r for a in rows for r in rounds_of(a, by_estimate(mp))]
    t, ms, r = rate(rs)
    print(f"estimate >= {mp:.2f}: {len(rs):5d} {t:6d} {r:6.1f}  (mean w {sum(x[1] for x in rs) / len(rs):.1f})")
