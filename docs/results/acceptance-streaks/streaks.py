"""Does a round that accepted nothing predict another? Per validation chat request, the accept
length a of every sync round (T = 0, verify_min_prob 0.05, the CPU default then), and E[a] / P(a > 0)
after k rounds in a row that accepted nothing, and by the drafter's confidence in the verified
drafts. Greedy, so the figures do not depend on timing (a concurrent job does not change them).

    PYTHONPATH=. python docs/results/acceptance-streaks/streaks.py TARGET DRAFTER [N] > streaks.json
"""

import collections
import json
import sys

import d3d
from d3d.data.corpus import training_corpus
from d3d.train.chat_data import chat_prompts


def summary(values: list[int]) -> dict:
    return {"rounds": len(values), "mean_accepted": sum(values) / len(values),
            "p_accept_any": sum(a > 0 for a in values) / len(values)}


def main(target_dir: str, drafter_dir: str, n: int = 8) -> dict:
    target, tok = d3d.load_model(target_dir), d3d.load_tokenizer(target_dir)
    drafter = d3d.load_drafter(drafter_dir, target=target)
    result = {"target": target_dir, "drafter": drafter_dir, "dtype": str(target.dtype), "n": n, "sets": {}}
    for name in ("code", "explain"):
        prompts = chat_prompts(tok, training_corpus(target_dir), 0.05, n, "validation", seed=1234, templates=1,
                               explain=name == "explain")
        by_streak, by_conf, all_a = collections.defaultdict(list), collections.defaultdict(list), []
        for k, p in enumerate(prompts, 1):
            rounds = []
            d3d.generate(target, p, max_new_tokens=128, stop_ids=tok.stop_token_ids(), spec="sync verify_min_prob=0.05",
                         drafter=drafter, on_round=lambda r: rounds.append((r.accepted, r.confidence)))
            misses = 0
            for a, c in rounds:
                by_streak[min(misses, 6)].append(a)
                by_conf["<0.1" if c < 0.1 else "0.1-0.3" if c < 0.3 else ">=0.3"].append(a)
                all_a.append(a)
                misses = misses + 1 if a == 0 else 0
            print(f"{name}: {k}/{n} prompts, {len(all_a)} rounds", file=sys.stderr, flush=True)
        result["sets"][name] = {"all": summary(all_a),
                                "after_k_misses": {f"{k}{'+' if k == 6 else ''}": summary(v)
                                                   for k, v in sorted(by_streak.items())},
                                "by_confidence": {k: summary(v) for k, v in by_conf.items()}}
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])), indent=1))
