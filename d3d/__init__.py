"""d3d — D3D: decoupled diffusion drafting for asynchronous speculative decoding.

The public API::

    model = d3d.load_model("models/...")            # Qwen3/Qwen2 HF checkpoint directory
    tok = d3d.load_tokenizer("models/...")
    out = d3d.generate(model, tok.encode("def fib(n):"), max_new_tokens=64)                 # ar
    drafter = d3d.load_drafter("models/...", target=model)
    out = d3d.generate(model, ids, max_new_tokens=64, spec="sync", drafter=drafter)     # or d3d.SpecConfig(...)
    print(tok.decode(out.tokens[0]), out.stats.tokens_per_second)
"""

from .decode.config import Sampling, SpecConfig
from .decode.datastore import Datastore, load_datastore
from .decode.engines import GenerationOutput, GenerationStats, generate
from .draft.drafter import Drafter, DrafterConfig, load_drafter, save_drafter
from .model.checkpoint import load_model, save_model
from .model.config import ModelConfig
from .model.tokenizer import Tokenizer, load_tokenizer
from .model.transformer import Transformer

__all__ = [
    "SpecConfig",
    "Sampling",
    "Datastore",
    "load_datastore",
    "Drafter",
    "DrafterConfig",
    "load_drafter",
    "save_drafter",
    "GenerationOutput",
    "GenerationStats",
    "ModelConfig",
    "Tokenizer",
    "Transformer",
    "generate",
    "load_model",
    "load_tokenizer",
    "save_model",
]
__version__ = "0.1.0"
