"""How far to believe a datastore chain: observed acceptance against the share of agreeing occurrences.

The same split as probe.py (index: chunks 0..6 of the answer store, training answers only; probe: every
3rd answer of chunks 7..8, other functions), walked the same way. For every drafted position d of every
store chain: n (occurrences that agreed up to d), c (those among them that continue with d's token)
and whether d was accepted given d_1..d_(d-1) were. Prints acceptance by (n, c/n) and the squared error
of the estimate c / (n + a) for a few a, the chosen smoothing (``Datastore(prior=)``).

    PYTHONPATH=. python docs/results/datastore/calibrate.py > docs/results/datastore/calibrate.txt
"""
from collections import defaultdict
from pathlib import Path

from d3d.decode.datastore import Datastore
from d3d.decode.lookup import lookup_chain
from d3d.data.answers import read_chunk, read_manifest

STORE = Path("data/qwen2.5-coder-answers")
chunks = read_manifest(STORE)["chunks"]
index = Datastore([a.answer for c in chunks[:7] for a in read_chunk(STORE / c["file"])], prior=0.0)  # raw counts
probe = [a for c in chunks[7:9] for a in read_chunk(STORE / c["file"])][::3]
obs = []  # (n, c, accepted)
for a in probe:
    p = 0
    while p < len(a.answer):
        ctx, truth = a.prompt + a.answer[:p], a.answer[p:p + 15]
        chain = lookup_chain(ctx, 3, 15)
        support = []
        if not chain:
            found = index.chain(ctx, 15)
            chain, support = found.tokens, found.support
        acc = next((i for i, (x, y) in enumerate(zip(chain, truth)) if x != y), min(len(chain), len(truth)))
        for d, (n, c) in enumerate(support[:len(truth)]):
            obs.append((n, c, d < acc))
            if d >= acc:
                break
        p += acc + 1
print(f"{len(obs)} drafted positions of store chains")
table = defaultdict(lambda: [0, 0])
for n, c, ok in obs:
    nb = 1 if n == 1 else 2 if n <= 3 else 4 if n <= 10 else 11 if n <= 50 else 51
    table[(nb, min(int(10 * c / n), 9))][0] += 1
    table[(nb, min(int(10 * c / n), 9))][1] += ok
print("n from | share c/n | positions | accepted")
for key in sorted(table):
    k, v = table[key], key
    print(f"{v[0]:>6} | {v[1] / 10:.1f}-{(v[1] + 1) / 10:.1f} | {k[0]:>9} | {k[1] / k[0]:.2f}")
for prior in (0, 0.5, 1, 2, 4, 8):
    err = sum((c / (n + prior) - ok) ** 2 for n, c, ok in obs) / len(obs)
    print(f"c / (n + {prior}): mean squared error {err:.4f}")
