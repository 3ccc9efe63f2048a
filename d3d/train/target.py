"""Pretraining a small Qwen3 target on real Python source (``python -m d3d train-target``).

Pipeline: find the corpus and split it by file -> train a byte-level BPE tokenizer on the train
files -> tokenize both splits into token streams (cached on disk) -> train the library's own
``Transformer`` on random windows of the train stream with AdamW, a cosine schedule and gradient
clipping -> report held-out loss and bits per byte -> save a HF-layout checkpoint.

Batches depend only on (seed, step), and the checkpoint holds model + optimizer + step, so a
resumed run continues exactly as an uninterrupted one would.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..model.checkpoint import save_model
from ..model.config import ModelConfig
from ..data.corpus import find_corpus, read_texts
from ..files import write_json
from ..model.transformer import Transformer
from ..model.tokenizer import Tokenizer
from .bpe import save_tokenizer, train_bpe
from .common import make_optimizer
from .loop import TrainSettings, train_loop


@dataclass(kw_only=True)
class TargetTrainConfig(TrainSettings):
    vocab_size: int = 8192
    hidden_size: int = 384
    num_layers: int = 6
    num_heads: int = 6
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 1024
    max_positions: int = 2048
    seq_len: int = 256
    batch_size: int = 16
    steps: int = 3000
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.1
    eval_every: int = 250
    eval_windows: int = 64
    save_every: int = 250
    log_every: int = 25
    save_dtype: str = "bfloat16"
    extra: dict = field(default_factory=dict)

    def model_config(self, tok: Tokenizer) -> ModelConfig:
        return ModelConfig(
            model_type="qwen3", vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads, head_dim=self.head_dim,
            rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=self.max_positions,
            tie_word_embeddings=True, bos_token_id=None, eos_token_id=tok.token_id("<|endoftext|>"))


# ----------------------------------------------------------------------------- data


@dataclass
class TokenData:
    train: torch.Tensor  # int64 [N] token stream, files separated by <|endoftext|>
    heldout: torch.Tensor
    token_bytes: torch.Tensor  # float [V]: UTF-8 bytes each token stands for (0 for specials)


def token_byte_lengths(tok: Tokenizer) -> torch.Tensor:
    """Bytes per token: in a byte-level BPE each character of a token's string is one byte."""
    lengths = torch.zeros(tok.vocab_size)
    specials = set(tok.added)
    for token, i in tok._tok.get_vocab(with_added_tokens=True).items():
        lengths[i] = 0 if token in specials else len(token)
    return lengths


def token_stream(tok: Tokenizer, texts: list[str]) -> torch.Tensor:
    """The texts' token ids back to back, each followed by ``<|endoftext|>``: int64 [N]."""
    eot = tok.token_id("<|endoftext|>")
    ids = []
    for enc in tok._tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.int64)


def tokenize_corpus(cfg: TargetTrainConfig, out: Path, log=print) -> tuple[Tokenizer, TokenData]:
    """Train (or reuse) the tokenizer and tokenize both splits (cached under ``out/data``)."""
    corpus = find_corpus(cfg.corpus, cfg.heldout_fraction)
    log(f"corpus {corpus.describe()}")
    train_texts, heldout_texts = read_texts(corpus.train), read_texts(corpus.heldout)
    if not train_texts:
        raise ValueError(f"corpus {corpus.root}: no readable UTF-8 training files")
    if not (out / "tokenizer.json").is_file():
        t = time.perf_counter()
        save_tokenizer(train_bpe(train_texts, cfg.vocab_size), out, cfg.max_positions)
        log(f"trained a {cfg.vocab_size}-token byte-level BPE in {time.perf_counter() - t:.1f} s")
    tok = Tokenizer.load(out)
    if tok.vocab_size != cfg.vocab_size:
        raise ValueError(f"{out}/tokenizer.json has {tok.vocab_size} tokens, --vocab-size is {cfg.vocab_size}")
    key = hashlib.sha256((out / "tokenizer.json").read_bytes()
                         + "\n".join(str(p) for p in corpus.train + corpus.heldout).encode()).hexdigest()[:16]
    cache = out / "data" / f"tokens-{key}.pt"
    if cache.is_file():
        data = torch.load(cache)
    else:
        data = {"train": token_stream(tok, train_texts), "heldout": token_stream(tok, heldout_texts)}
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save(data, cache)
    log(f"tokens: {data['train'].numel():,} train, {data['heldout'].numel():,} held-out")
    return tok, TokenData(data["train"], data["heldout"], token_byte_lengths(tok))


def sample_windows(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """``batch`` random windows of ``length`` tokens from a stream: [batch, length]."""
    if stream.numel() <= length:
        raise ValueError(f"token stream of {stream.numel()} tokens is shorter than a window of {length}")
    starts = torch.randint(0, stream.numel() - length, (batch,), generator=gen)
    return torch.stack([stream[s: s + length] for s in starts.tolist()])


def heldout_windows(stream: torch.Tensor, length: int, limit: int | None = None) -> torch.Tensor:
    """Consecutive non-overlapping windows covering the held-out stream: [W, length]."""
    n = (stream.numel() - 1) // (length - 1)
    idx = torch.arange(length)[None, :] + (length - 1) * torch.arange(n)[:, None]
    windows = stream[idx]
    return windows if limit is None else windows[:limit]


@torch.no_grad()
def evaluate(model: Transformer, windows: torch.Tensor, token_bytes: torch.Tensor, batch: int = 32) -> dict:
    """Mean next-token loss (nats) and bits per byte over ``windows`` [W, S+1]."""
    model.eval()
    nll, tokens, nbytes = 0.0, 0, 0.0
    for i in range(0, windows.shape[0], batch):
        w = windows[i: i + batch]
        logits = model(w[:, :-1])
        targets = w[:, 1:]
        nll += F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum").item()
        tokens += targets.numel()
        nbytes += token_bytes[targets].sum().item()
    model.train()
    return {"loss": nll / tokens, "bits_per_byte": nll / math.log(2) / max(nbytes, 1.0), "tokens": tokens}


# ----------------------------------------------------------------------------- training


def init_weights(model: Transformer, seed: int) -> None:
    """Normal(0, 0.02) matrices, residual outputs scaled by 1/sqrt(2 * layers) (GPT-2 style)."""
    gen = torch.Generator().manual_seed(seed)
    n_layers = model.cfg.num_hidden_layers
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def train_target(cfg: TargetTrainConfig, resume: bool = False, log=print) -> dict:
    """Run the whole pipeline; returns a summary dict (also written to ``out/train_summary.json``)."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("vocab_size", "steps", "batch_size", "seq_len"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(cfg, name)}: must be positive")
    tok, data = tokenize_corpus(cfg, out, log)
    mcfg = cfg.model_config(tok)
    model = Transformer(mcfg)
    init_weights(model, cfg.seed)
    model.train()
    optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay)
    log(f"model: {mcfg.num_parameters() / 1e6:.2f}M parameters "
        f"({mcfg.num_parameters(include_embeddings=False) / 1e6:.2f}M without embeddings)")
    eval_set = heldout_windows(data.heldout, cfg.seq_len + 1, cfg.eval_windows)

    def loss_fn(step, gen):
        batch = sample_windows(data.train, cfg.batch_size, cfg.seq_len + 1, gen)
        logits = model(batch[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten()), batch.numel()

    def held_out(step):
        ev = evaluate(model, eval_set, data.token_bytes)
        log(f"  held-out: loss {ev['loss']:.4f}, {ev['bits_per_byte']:.3f} bits/byte")
        return {"val_loss": ev["loss"], "val_bpb": ev["bits_per_byte"]}

    run = train_loop(model, optimizer, cfg, out / "training_state.pt", loss_fn, held_out, resume=resume, log=log)
    final = None  # every held-out token: minutes on a CPU, so only once the schedule is complete
    if run.steps_done >= cfg.steps:
        final = evaluate(model, heldout_windows(data.heldout, cfg.seq_len + 1), data.token_bytes)
        log(f"final held-out (all {final['tokens']:,} tokens): loss {final['loss']:.4f}, "
            f"{final['bits_per_byte']:.3f} bits/byte")
    save_model(model.requires_grad_(False), out, dtype=cfg.save_dtype)
    summary = {"config": asdict(cfg), "parameters": mcfg.num_parameters(),
               "parameters_without_embeddings": mcfg.num_parameters(include_embeddings=False),
               "train_tokens_available": data.train.numel(), "heldout_tokens": data.heldout.numel(),
               "steps_done": run.steps_done, "tokens_seen_this_run": run.tokens_seen,
               "train_seconds_this_run": run.seconds,
               "final_train_loss": run.losses[-1] if run.losses else float("nan"), "losses_this_run": run.losses,
               "heldout": final, "history": run.history,
               "threads": torch.get_num_threads()}
    write_json(out / "train_summary.json", summary)
    return summary


# ----------------------------------------------------------------------------- model card
