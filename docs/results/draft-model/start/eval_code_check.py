"""Whether a sequence's chain starts on the evaluation code requests (the 6 HumanEval chat prompts ``bench llamacpp``
runs on the 1.5B): the defaults and the defaults with the 0.5B's chains, each request's tok/s (end to end), τ and
the drafts the chain made. A check of the start rule, not a choice. Run from the repository root:

    python docs/results/draft-model/start/eval_code_check.py
"""
import sys, time, torch, d3d
from d3d.data.prompts import load_prompt_set
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model
torch.set_grad_enabled(False)
big, small_path = resolve_model("qwen2.5-coder-1.5b"), resolve_model("qwen2.5-coder-0.5b")
target, small = d3d.load_model(big, weights="auto"), d3d.load_model(small_path, weights="auto")
tok = d3d.load_tokenizer(big)
_, drafter, _ = pick_drafter(target, "sync", None)
prompts = load_prompt_set("humaneval", tok, 6, chat=True)
for i, p in enumerate(prompts):
    for eng in ["now", "chain"]:
        spec = d3d.SpecConfig("sync") if eng == "now" else d3d.SpecConfig("sync", draft_model=small)
        t0 = time.perf_counter()
        out = d3d.generate(target, p, max_new_tokens=128, spec=spec, drafter=drafter, stop_ids=tok.stop_token_ids())
        s = out.stats
        tok_s = s.total_generated / (time.perf_counter() - t0)
        print(i, eng, f"{tok_s:.1f} tok/s tau {s.tau:.2f} rounds {s.rounds} model_drafts {s.model_drafts}", flush=True)
