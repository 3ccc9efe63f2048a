"""τ of the bundled D3D and DFlash drafters on the evaluation prompts (deduplicated held-out code,
HumanEval), B = 16, T = 0, 128 new tokens, fp32 as in the model cards. Writes drafter_eval.json."""
import json
import os
import sys

os.environ.setdefault("D3D_DTYPE", "float32")
sys.path.insert(0, ".")
import d3d  # noqa: E402
from bench.common import machine  # noqa: E402
from d3d.assets import BUNDLED_DFLASH, BUNDLED_DRAFTER, BUNDLED_TARGET, bundled  # noqa: E402
from d3d.draft.dflash import load_dflash  # noqa: E402
from d3d.data.prompts import load_prompt_set  # noqa: E402
from d3d.train.drafter import measure_tau  # noqa: E402

target = d3d.load_model(bundled(BUNDLED_TARGET))
tok = d3d.load_tokenizer(bundled(BUNDLED_TARGET))
drafters = {"d3d": d3d.load_drafter(bundled(BUNDLED_DRAFTER), target=target),
            "dflash": load_dflash(bundled(BUNDLED_DFLASH), target)}
res = {}
for name in ("code", "humaneval"):
    prompts = load_prompt_set(name, tok, 16, 64)
    for kind, drafter in drafters.items():
        if kind == "d3d":
            r = measure_tau(target, drafter, prompts, 128)
        else:
            out = d3d.generate(target, prompts, max_new_tokens=128, spec="dflash", drafter=drafter, stop_ids=[])
            r = {"tau": out.stats.tau, "rounds": out.stats.rounds, "accept_hist": out.stats.accept_hist}
        res.setdefault(kind, {})[name] = {**r, "prompts": len(prompts)}
        print(kind, name, f"tau {r['tau']:.3f} over {r['rounds']} rounds", flush=True)
json.dump({"what": __doc__.strip(), "machine": machine(), "dtype": str(target.dtype), "results": res},
          open("docs/results/cpu-fastpath/drafter_eval.json", "w"), indent=2)
