"""Does the target's confidence predict whether the drafter's next block is accepted? Per validation request and
round of sync with the drafter alone and every draft verified (greedy: the rounds do not depend on timing), the
drafts accepted, beside the target's probability of the round's anchor (the token the draft follows) and of the
token before it (one teacher-forced pass over prompt + answer). Prints E[accepted] by bins of each. Run from the
repository root:

    python docs/results/target-confidence/confidence.py MODEL SETS OUT.json

SETS: comma-separated names of ``bench.common.request_sets`` (validation: code, explain, mtbench, mtbench-free).
"""
import json
import sys

import torch

import d3d
from bench.common import request_sets, write_json
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model
from d3d.hardware import cpu_flags

BINS = (0.0, 0.3, 0.6, 0.8, 0.9, 0.97, 0.99, 1.01)


def rounds_of(target, drafter, tok, prompt: list[int]) -> list[dict]:
    rounds = []
    out = d3d.generate(target, [prompt], max_new_tokens=128, spec="sync verify_min_prob=0 lookup=0 leaves=0",
                       drafter=drafter, stop_ids=tok.stop_token_ids(), on_round=rounds.append)
    ids = list(prompt) + out.tokens[0]
    with torch.inference_mode():
        p_max = torch.softmax(target(torch.tensor([ids]))[0].float(), -1).amax(-1)
    rows, anchor = [], len(prompt)  # the first answer token (from prefill) is the first round's anchor
    for r in rounds:
        rows.append({"accepted": r.accepted, "p_anchor": float(p_max[anchor - 1]), "p_before": float(p_max[anchor - 2])})
        anchor += len(r.committed)
    return rows


def by_bins(rows: list[dict], key: str) -> list[dict]:
    bins = []
    for lo, hi in zip(BINS, BINS[1:]):
        a = [r["accepted"] for r in rows if lo <= r[key] < hi]
        bins.append({"from": lo, "to": hi, "rounds": len(a), "mean_accepted": sum(a) / max(1, len(a))})
    return bins


def main(name: str, sets: str, out: str) -> None:
    path = resolve_model(name)
    target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
    _, drafter, _ = pick_drafter(target, "sync", None)
    result = {"model": name, "cpu_flags": sorted(cpu_flags()), "sets": {}}
    for sname, prompts in request_sets(tok, path, sets.split(",")).items():
        rows = [r for i, p in enumerate(prompts) for r in rounds_of(target, drafter, tok, p)]
        result["sets"][sname] = {"rounds": len(rows), "mean_accepted": sum(r["accepted"] for r in rows) / len(rows),
                                 **{key: by_bins(rows, key) for key in ("p_anchor", "p_before")}}
        print(sname, len(prompts), "requests,", len(rows), "rounds", file=sys.stderr, flush=True)
        for b in result["sets"][sname]["p_anchor"]:
            print(f"  p_anchor [{b['from']:.2f}, {b['to']:.2f}): {b['rounds']:4d} rounds, "
                  f"E[accepted] {b['mean_accepted']:.2f}")
    write_json(out, result)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
