"""Offline probe: would drafts looked up in the target's own answers (REST-style) beat the drafter?

Index: the answers of the store's chunks 0..6 (the target's greedy answers to training requests).
Probe: the answers of chunks 7..8 (requests about other functions), position by position, as the
engine would meet them: at each round the committed tokens are prompt + answer[:p]; if the context
copy (lookup=3) has a chain, that round is a context round (not counted); else the store proposes a
chain after the longest k-gram of the committed tokens it holds (k in KS), and the round accepts
the longest prefix of that chain equal to the real continuation (the target's greedy tokens), then
a bonus. Rounds walk forward by accepted + 1. Prints, per kind: the share of non-context rounds the
store proposes for, the mean accepted of its chains, and accepted by first-token confidence.

    PYTHONPATH=. python docs/results/datastore/probe.py [STORE] > docs/results/datastore/probe.txt
"""
import sys
import time
from collections import defaultdict

import numpy as np

from d3d.decode.lookup import lookup_chain
from d3d.data.answers import read_chunk, read_manifest
from pathlib import Path

STORE = Path(sys.argv[1] if len(sys.argv) > 1 else "data/qwen2.5-coder-answers")
KS, DEPTH, SAMPLE = (8, 6, 4, 3), 15, 256
chunks = read_manifest(STORE)["chunks"]
index_rows = [a for c in chunks[:7] for a in read_chunk(STORE / c["file"])]
probe_rows = [a for c in chunks[7:9] for a in read_chunk(STORE / c["file"])]  # as first run, before chunk 9

t0 = time.perf_counter()
toks = np.concatenate([np.array(a.answer + [-1], dtype=np.int64) for a in index_rows])
MUL = np.uint64(0x9E3779B97F4A7C15)


def kgram_hash(arr: np.ndarray, k: int) -> np.ndarray:
    """hash of arr[p-k+1..p] for p >= k-1 (uint64, wrapping)."""
    h = np.zeros(len(arr) - k + 1, dtype=np.uint64)
    a = arr.astype(np.uint64)
    for j in range(k):
        h = h * MUL + a[j:len(arr) - k + 1 + j]
    return h


index = {}
for k in KS:
    h = kgram_hash(toks, k)
    end = np.arange(k - 1, len(toks))  # position of the k-gram's last token
    bad = np.zeros(len(h), dtype=bool)
    for j in range(k):
        bad |= toks[j:len(toks) - k + 1 + j] < 0
    h, end = h[~bad], end[~bad]
    order = np.argsort(h, kind="stable")
    index[k] = (h[order], end[order])
print(f"index: {len(index_rows)} answers, {len(toks)} tokens, k {KS}, built in {time.perf_counter() - t0:.1f} s")


def store_chain(ctx: list[int]):
    for k in KS:
        if len(ctx) < k:
            continue
        key = kgram_hash(np.array(ctx[-k:], dtype=np.int64), k)[0]
        keys, ends = index[k]
        lo, hi = np.searchsorted(keys, key), np.searchsorted(keys, key, side="right")
        if hi - lo == 0:
            continue
        pos = ends[lo:hi]
        if len(pos) > SAMPLE:
            pos = pos[np.linspace(0, len(pos) - 1, SAMPLE).astype(np.int64)]
        cont = toks[np.minimum(pos[:, None] + 1 + np.arange(DEPTH), len(toks) - 1)]
        chain, conf, rows = [], [], np.arange(len(pos))
        for d in range(DEPTH):
            col = cont[rows, d]
            col = col[col >= 0]
            if len(col) == 0:
                break
            vals, counts = np.unique(col, return_counts=True)
            t = vals[counts.argmax()]
            chain.append(int(t))
            conf.append(counts.max() / len(rows))
            rows = rows[cont[rows, d] == t]
        if chain:
            return k, hi - lo, chain, conf
    return None


stats = defaultdict(lambda: defaultdict(float))
by_conf = defaultdict(lambda: [0, 0.0])
t0 = time.perf_counter()
for a in probe_rows[::3]:  # every 3rd probe answer (kinds alternate in pairs or fours): ~850 answers
    s = stats[a.kind]
    p = 0
    while p < len(a.answer):
        ctx = a.prompt + a.answer[:p]
        truth = a.answer[p:p + DEPTH]
        s["rounds"] += 1
        if lookup_chain(ctx, 3, DEPTH):
            s["context"] += 1
            c = lookup_chain(ctx, 3, DEPTH)
            acc = next((i for i, (x, y) in enumerate(zip(c, truth)) if x != y), min(len(c), len(truth)))
            p += acc + 1
            continue
        found = store_chain(ctx)
        if not found:
            s["none"] += 1
            p += 1
            continue
        k, m, chain, conf = found
        acc = next((i for i, (x, y) in enumerate(zip(chain, truth)) if x != y), min(len(chain), len(truth)))
        s["store"] += 1
        s["store_acc"] += acc
        b = min(int(conf[0] * 10), 9)
        by_conf[b][0] += 1
        by_conf[b][1] += acc
        s[f"k{k}"] += 1
        p += acc + 1
print(f"probe: {sum(s['rounds'] for s in stats.values()):.0f} rounds in {time.perf_counter() - t0:.0f} s")
for kind, s in stats.items():
    n = s["rounds"] - s["context"]
    print(f"{kind}: rounds {s['rounds']:.0f}, context {s['context'] / s['rounds']:.0%}; of the others the store "
          f"proposes in {s['store'] / n:.0%} (k8 {s['k8'] / max(1, s['store']):.0%}, k6 {s['k6'] / max(1, s['store']):.0%}, "
          f"k4 {s['k4'] / max(1, s['store']):.0%}, k3 {s['k3'] / max(1, s['store']):.0%}), accepting "
          f"{s['store_acc'] / max(1, s['store']):.2f} drafts a round there")
print("store rounds by first-token confidence: bucket, rounds, mean accepted")
for b in sorted(by_conf):
    print(f"  {b / 10:.1f}-{(b + 1) / 10:.1f}: {by_conf[b][0]}, {by_conf[b][1] / by_conf[b][0]:.2f}")
