"""End-to-end speculative decoding: ar vs sync vs async (D3D), same prompts, one run.

For every prompt of every set, each mode generates with batch 1 at T = 0 (modes interleaved, so
machine drift hits them alike); greedy outputs are checked against ``ar`` token for token. Per
set and mode we report τ, tokens/s (generated tokens / wall time including prefill), the speedup
over ``ar`` measured in the same run, and for async the successor hit rate and where the time
went (drafting on the critical path vs hidden behind verification).

Modes: ``ar``, ``ar-fp32`` (ar in fp32 beside the policy's dtype; in "vs fastest ar"), and any
``d3d.SpecConfig`` in the compact form ``generate --spec`` reads, commas for spaces: ``sync``, ``dflash``,
``async`` (the device's defaults), ``async,overlap=packed,hypotheses=4``, ``sync,verify_min_prob=auto``,
``sync,exact=true``, ``sync,lookup=0,leaves=0`` (the drafter alone); what each knob means:
``d3d/decode/config.py``. ``store=N`` (the bench's own) drafts from the target's earlier answers
(``--datastore``) where N% of the occurrences agree on the first draft. The JSON's
verified_drafts_per_round, leaf_hit_rate, leaves_per_round, lookup_rate and datastore_rate say what
each knob did.

For async modes the JSON reports the hit rate, the hit rate per accept length, hypotheses drafted
per round, and the drafting left on the critical path (synchronous drafts + the part of the
hypotheses passes that verification did not hide).

Models load in the dtype policy's choice (``d3d.cpu.precision``; ``--dtype`` forces one). In fp32
every speculative output must equal ar; in bf16 only exact=true modes must, the others are counted
(``identical_to_ar``): they may part at near-ties of the target's logits.

    python -m bench speculative [--sets code humaneval] [--n 8] [--new-tokens 128] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import d3d
from d3d.assets import BUNDLED_DFLASH, models_dir
from d3d.data.corpus import training_corpus
from d3d.data.prompts import CHAT_SETS, PROMPT_SETS, heldout_prompts, load_prompt_set
from d3d.draft.pick import pick_drafter
from d3d.train.chat_data import chat_prompts

from .common import target_dir as bench_target, bench_spec, check_chat_sets, compare_table, load_json, machine, markdown_table, write_json


BASELINES = ("ar-fp32",)  # plain decoding beside ar: not compared token for token, in "fastest ar"


def run_mode(target, drafter, prompt, mode: str, args):
    if mode == "ar-fp32":  # the fp32 baseline beside the policy's dtype: speedups are quoted vs the faster
        target, mode = args.fp32_target, "ar"
    spec = args.specs[mode]
    draft = args.dflash_drafter if spec.mode == "dflash" else drafter
    t = time.perf_counter()
    out = d3d.generate(target, prompt, max_new_tokens=args.new_tokens, spec=spec, drafter=draft, stop_ids=args.stop_ids)
    return out, time.perf_counter() - t


def bench_set(target, drafter, prompts, args) -> dict:
    acc = {m: {"tokens": 0, "seconds": 0.0, "rounds": 0, "hist": None, "hits": 0, "fallbacks": 0, "draft_s": 0.0,
               "hidden_draft_s": 0.0, "exposed_draft_s": 0.0, "verify_s": 0.0, "verified": 0, "per_prompt_tok_s": [],
               "identical": 0, "hits_by_accept": None, "hypotheses": 0, "passes": 0, "leaves": 0, "leaf_hits": 0,
               "lookup": 0, "datastore": 0} for m in args.modes}
    # fp32 and +exact modes must reproduce ar token for token; other low-precision modes may part
    # at near-ties of the target's logits (bench agreement measures them), so they are counted
    must_match = target.dtype == torch.float32
    for i, prompt in enumerate(prompts):
        outs = {}
        for m in args.modes:
            out, dt = run_mode(target, drafter, prompt, m, args)
            outs[m] = out.tokens
            a, s = acc[m], out.stats
            a["tokens"] += s.total_generated
            a["seconds"] += dt
            a["per_prompt_tok_s"].append(s.total_generated / dt)
            a["rounds"] += s.rounds
            a["hits"] += s.successor_hits
            a["fallbacks"] += s.fallbacks
            a["draft_s"] += s.draft_seconds
            a["hidden_draft_s"] += s.hidden_draft_seconds
            a["exposed_draft_s"] += s.exposed_draft_seconds
            a["verify_s"] += s.verify_seconds
            a["verified"] += s.verified_drafts
            a["hypotheses"] += s.hypotheses
            a["passes"] += s.successor_passes
            a["leaves"] += s.verified_leaves
            a["leaf_hits"] += s.leaf_hits
            a["lookup"] += s.lookup_drafts
            a["datastore"] += s.datastore_drafts
            for key, hist in (("hist", s.accept_hist), ("hits_by_accept", s.hits_by_accept)):
                if hist:
                    a[key] = hist if a[key] is None else [x + y for x, y in zip(a[key], hist)]
        for m, tokens in outs.items():
            acc[m]["identical"] += tokens == outs.get("ar")
            # another dtype or matmul layout (BASELINES) may part from ar's greedy output at near-ties
            if "ar" in outs and tokens != outs["ar"] and m not in BASELINES and (must_match or args.specs[m].exact):
                raise SystemExit(f"prompt {i}: {m} output differs from ar — speculative decoding is broken")
        print(f"  prompt {i + 1}/{len(prompts)} done", file=sys.stderr, flush=True)
    res = {}
    for m, a in acc.items():
        r = {"tok_s": a["tokens"] / a["seconds"], "tokens": a["tokens"], "seconds": a["seconds"],
             "per_prompt_tok_s": a["per_prompt_tok_s"], "identical_to_ar": a["identical"]}
        if a["rounds"]:
            r.update(tau=sum((k + 1) * c for k, c in enumerate(a["hist"])) / a["rounds"], rounds=a["rounds"],
                     accept_hist=a["hist"], hit_rate=a["hits"] / a["rounds"],
                     fallback_rate=a["fallbacks"] / a["rounds"], draft_seconds=a["draft_s"],
                     hidden_draft_seconds=a["hidden_draft_s"], verify_seconds=a["verify_s"],
                     critical_draft_seconds=a["draft_s"] + a["exposed_draft_s"],
                     hypotheses_per_round=a["hypotheses"] / a["rounds"],
                     hypothesis_pass_rate=a["passes"] / a["rounds"],
                     verified_drafts_per_round=a["verified"] / a["rounds"],
                     leaves_per_round=a["leaves"] / a["rounds"], leaf_hit_rate=a["leaf_hits"] / a["rounds"],
                     lookup_rate=a["lookup"] / a["rounds"], datastore_rate=a["datastore"] / a["rounds"])
            if a["hits_by_accept"]:
                r["hit_rate_by_accept"] = [h / c if c else None for h, c in zip(a["hits_by_accept"], a["hist"])]
        res[m] = r
    if "ar" in res:
        fastest = max(res[m]["tok_s"] for m in ("ar",) + BASELINES if m in res)
        for r in res.values():
            r["speedup_vs_ar"] = r["tok_s"] / res["ar"]["tok_s"]
            r["speedup_vs_fastest_ar"] = r["tok_s"] / fastest
    return res


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="target directory or a real model's name, fetched once (default: bundled)")
    ap.add_argument("--drafter", help="D3D drafter directory (default: the bundled drafter that fits the target)")
    ap.add_argument("--dflash", help="DFlash drafter directory for the 'dflash' mode (default: bundled, if present)")
    ap.add_argument("--sets", nargs="+", default=None, choices=PROMPT_SETS + ("explain",),
                    help="prompt sets (default: all; with --chat: humaneval mtbench; 'explain' only with --chat "
                         "--validation: requests for a prose explanation of a validation function); a missing "
                         "optional set is reported (and listed in the JSON), never installed")
    ap.add_argument("--n", type=int, default=8, help="prompts per set")
    ap.add_argument("--validation", action="store_true",
                    help="code prompts from the validation files, for choosing settings (K, F, thresholds; with "
                         "--chat: requests built from their functions, as the drafter trainer's τ monitor asks, "
                         "or with --sets explain requests to explain them in prose); every reported figure uses "
                         "the evaluation files (the default)")
    ap.add_argument("--prompt-len", type=int, default=64, help="tokens per code prompt")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--chat", action="store_true",
                    help="ask the prompts as user turns in the target's chat format (humaneval, mtbench) and stop "
                         "at its end-of-turn token, as an instruction-tuned model is used (default: raw text, "
                         "exactly --new-tokens per prompt)")
    ap.add_argument("--block-size", type=int, default=None,
                    help="tokens per round of every speculative mode whose spec sets none (default: the drafter's)")
    ap.add_argument("--modes", nargs="+", default=["ar", "ar-fp32", "sync", "sync,exact=true", "async",
                                                   "async,overlap=packed", "async,successor_threshold=0"],
                    help="ar, ar-fp32, or d3d.SpecConfig's compact form with commas (sync,lookup=0,leaves=3); "
                         "store=N: drafts from --datastore (module docstring)")
    ap.add_argument("--dtype", default="auto", help="dtype of both models (default: the policy's choice)")
    ap.add_argument("--weights", default="auto", help="load_model's weights (default auto: a quantized checkpoint "
                                                       "keeps its blocks; see d3d/cpu/precision.py)")
    ap.add_argument("--device", default="cpu", help="torch device of both models (default cpu)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--out", default=None, help="write the JSON here")
    ap.add_argument("--compare", default=None, help="a previous speculative JSON to compare against")
    ap.add_argument("--plots", default=None, help="directory for PNG plots (needs matplotlib: pip install d3d[plot])")
    ap.add_argument("--datastore", default=None,
                    help="an answer store of the target's own answers (e.g. data/qwen2.5-coder-answers) for the "
                         "+store modes (d3d.decode.datastore)")
    return ap


def load_sets(args, tok, corpus) -> tuple[dict[str, list[list[int]]], dict[str, str]]:
    """The prompts of each of ``args.sets`` ({name: prompts}), and the sets that are not installed
    ({name: why}: reported, never installed)."""
    sets, missing = {}, {}
    for name in args.sets:
        try:
            if args.validation and args.chat:
                sets[name] = chat_prompts(tok, corpus, 0.05, args.n, "validation", seed=1234, templates=1,
                                          explain=name == "explain")
            elif args.validation:
                sets[name] = heldout_prompts(tok, corpus, 0.05, args.n, args.prompt_len, part="validation")
            else:
                sets[name] = load_prompt_set(name, tok, args.n, args.prompt_len, chat=args.chat, corpus=corpus)
        except FileNotFoundError as e:
            missing[name] = str(e)
            print(f"prompt set {name!r} unavailable: {e}", file=sys.stderr)
    return sets, missing


def results_table(results: dict) -> str:
    rows = []
    for name, res in results.items():
        for m, r in res.items():
            rows.append([name, m, f"{r['tau']:.2f}" if "tau" in r else "-", r["tok_s"],
                         f"{r.get('speedup_vs_fastest_ar', r['speedup_vs_ar']):.2f}x",
                         f"{r['hit_rate']:.0%}" if m.startswith("async") else "-",
                         f"{r['hypotheses_per_round']:.1f}" if m.startswith("async") else "-",
                         f"{r['leaf_hit_rate']:.0%}" if r.get("leaves_per_round") else "-",
                         f"{r['critical_draft_seconds']:.2f} / {r['hidden_draft_seconds']:.2f} / "
                         f"{r['verify_seconds']:.2f}" if "tau" in r else "-"])
    return markdown_table(["set", "mode", "τ", "tok/s", "vs fastest ar", "async hit rate", "hypotheses/round",
                           "leaf hit rate", "draft on critical path / hypotheses passes / verify s"], rows)


def main(argv=None) -> dict:
    ap = parser()
    args = ap.parse_args(argv)
    if args.sets is None:
        args.sets = list(CHAT_SETS if args.chat else PROMPT_SETS)
    if args.validation and set(args.sets) - {"code", "explain"}:
        ap.error("--validation: only the code set (and, with --chat, explain) has a validation split")
    if "explain" in args.sets and not (args.validation and args.chat):
        ap.error("--sets explain: validation requests in the chat format only (add --chat --validation)")
    if args.chat and not args.validation:
        check_chat_sets(ap, args.sets)
    if "ar" not in args.modes:
        args.modes.insert(0, "ar")
    if args.threads:
        torch.set_num_threads(args.threads)
    target_dir = bench_target(args.target, "speculative")
    target = d3d.load_model(target_dir, dtype=args.dtype, device=args.device, weights=args.weights)
    tok = d3d.load_tokenizer(target_dir)
    args.stop_ids = tok.stop_token_ids() if args.chat else []
    try:  # --drafter, or the bundled D3D drafter that fits the target
        _, drafter, _ = pick_drafter(target, "sync", args.drafter)
    except ValueError as e:
        ap.error(str(e))
    drafter_dir = drafter.model.source
    args.datastore_dir, args.datastore = args.datastore, None
    if any("store=" in m for m in args.modes):
        if args.datastore_dir is None:
            ap.error("the store= modes need --datastore DIR")
        t0 = time.perf_counter()
        args.datastore = d3d.load_datastore(args.datastore_dir, target)
        print(f"datastore {args.datastore_dir}: {len(args.datastore)} tokens indexed in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
    args.specs = {m: bench_spec("ar" if m == "ar-fp32" else m, args.datastore, args.block_size) for m in args.modes}
    args.fp32_target = (d3d.load_model(target_dir, dtype="float32", device=args.device)
                        if "ar-fp32" in args.modes else None)
    args.dflash_drafter = None
    dflash_dir = Path(args.dflash) if args.dflash else models_dir() / BUNDLED_DFLASH
    if any(s.mode == "dflash" for s in args.specs.values()):
        from d3d.draft.dflash import load_dflash

        if not (dflash_dir / "config.json").is_file():
            raise SystemExit(f"mode dflash: no DFlash drafter at {dflash_dir} (pass --dflash DIR)")
        args.dflash_drafter = load_dflash(dflash_dir, target)
    d3d.generate(target, [1, 2, 3], max_new_tokens=8, drafter=drafter, stop_ids=[], spec="async")  # warm-up
    corpus = training_corpus(target_dir)  # code prompts from the evaluation files of the target's own corpus
    sets, missing = load_sets(args, tok, corpus)
    results = {}
    for name, prompts in sets.items():
        print(f"{name}: {len(prompts)} prompts", file=sys.stderr)
        results[name] = bench_set(target, drafter, prompts, args)
    print(results_table(results))
    config = {k: v for k, v in vars(args).items() if k not in ("dflash_drafter", "fp32_target", "datastore", "specs")}
    config["dtype_used"] = str(target.dtype).removeprefix("torch.")
    config["block_size"] = args.block_size or drafter.block_size  # as the rounds ran (d3d.SpecConfig.resolve)
    payload = {"bench": "speculative", "machine": machine(), "config": config,
               "target": str(target_dir), "drafter": str(drafter_dir),
               "target_parameters": target.cfg.num_parameters(),
               "drafter_parameters": drafter.num_parameters(include_shared=False),
               "dflash_parameters": (sum(p.numel() for n, p in args.dflash_drafter.named_parameters()
                                         if not n.startswith(("model.embed_tokens", "model.lm_head")))
                                     if args.dflash_drafter is not None else None),
               "missing_sets": missing, "results": results}
    if args.compare:
        print(compare_table(payload, load_json(args.compare)))
    if args.plots:
        plot(payload, Path(args.plots))
    write_json(args.out, payload)
    return payload


def plot(payload: dict, out: Path) -> list[Path]:
    """Acceptance-length histograms per mode and a speedup bar chart per prompt set (PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install 'd3d[plot]')", file=sys.stderr)
        return []
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, res in payload["results"].items():
        spec = {m: r for m, r in res.items() if "accept_hist" in r}
        fig, axes = plt.subplots(1, max(1, len(spec)), figsize=(3.2 * max(1, len(spec)), 2.8), sharey=True, squeeze=False)
        for ax, (m, r) in zip(axes[0], spec.items()):
            total = sum(r["accept_hist"])
            ax.bar(range(1, len(r["accept_hist"]) + 1), [c / total for c in r["accept_hist"]])
            ax.set_title(f"{m}  τ={r['tau']:.2f}", fontsize=9)
            ax.set_xlabel("tokens per round (a + 1)")
        axes[0][0].set_ylabel("share of rounds")
        fig.suptitle(f"acceptance, {name} prompts", fontsize=10)
        fig.tight_layout()
        path = out / f"acceptance_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
        modes = list(res)
        fig, ax = plt.subplots(figsize=(max(5, 0.6 * len(modes)), 3.2))
        ax.bar(modes, [res[m].get("speedup_vs_fastest_ar", res[m]["speedup_vs_ar"]) for m in modes])
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_ylabel("speedup over the fastest ar")
        ax.set_title(f"{name} prompts ({payload['machine'].get('cpu', '')[:40]})", fontsize=9)
        ax.tick_params(axis="x", labelrotation=35, labelsize=8)
        plt.setp(ax.get_xticklabels(), ha="right", rotation_mode="anchor")
        fig.tight_layout()
        path = out / f"speedup_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    for p in written:
        print(f"wrote {p}", file=sys.stderr)
    return written


if __name__ == "__main__":
    main()
