"""Is the drafter's confidence calibrated? With every draft verified (``sync,lookup=0,leaves=0,verify_min_prob=0``),
the drafter's joint confidence in its first k drafts against whether all k were accepted, binned, on validation
chat requests (code, explain), 128 tokens. Writes the rounds and the bins.

    python docs/results/cut-batch1/calibration.py MODEL N OUT.json
"""
import sys

import torch

import d3d
import d3d.decode.speculative as S
from bench.common import machine, write_json
from d3d.data.corpus import training_corpus
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model
from d3d.train.chat_data import chat_prompts

EDGES = [0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.01]


def bins(rounds):
    """[(mean predicted, share accepted, count)] per bin of the joint confidence of a round's first k drafts."""
    count, hit, pred = [0] * (len(EDGES) - 1), [0] * (len(EDGES) - 1), [0.0] * (len(EDGES) - 1)
    for conf, accepted in rounds:
        p = 1.0
        for k, c in enumerate(conf):
            p *= c
            b = next(i for i in range(len(EDGES) - 1) if EDGES[i] <= p < EDGES[i + 1])
            count[b], pred[b], hit[b] = count[b] + 1, pred[b] + p, hit[b] + (accepted > k)
    return [(round(pred[i] / count[i], 3), round(hit[i] / count[i], 3), count[i]) for i in range(len(count)) if count[i]]


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    name, n, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    path = resolve_model(name)
    target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
    _, drafter, _ = pick_drafter(target, "sync", None)
    confidences, widths = [], S.verify_widths

    def verify_widths(drafts, min_prob):  # every round's draft confidences, as the cut sees them
        confidences.append([list(d.confidence) for d in drafts][0])
        return widths(drafts, min_prob)

    S.verify_widths = verify_widths
    rounds = {}
    for s in ("code", "explain"):
        accepted = []
        for p in chat_prompts(tok, training_corpus(path), 0.05, n, "validation", seed=1234, templates=1,
                              explain=s == "explain"):
            d3d.generate(target, p, max_new_tokens=128, spec="sync,lookup=0,leaves=0,verify_min_prob=0",
                         drafter=drafter, stop_ids=tok.stop_token_ids(), on_round=lambda r: accepted.append(r.accepted))
        rounds[s] = list(zip(confidences, accepted))
        confidences.clear()
    write_json(out_path, {"bench": "drafter calibration", "machine": machine(), "model": name, "n": n,
                          "bins": {s: bins(r) for s, r in rounds.items()}, "rounds": rounds})
