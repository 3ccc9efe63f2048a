"""How the store's first chunk was made (2026-12-02, eighth session): before ``--answers`` existed,
a plain loop answered the same requests ``chat_requests(..., kinds=("code", "explain"),
extra_functions=True)`` builds — function j's code request, then its explain request — with
``generate`` in batches of 64 (bf16, 160-token cap), saving every batch; this seals those answers
into the store. Later chunks come from ``python -m d3d train-drafter ... --answers DIR``.

    PYTHONPATH=. python docs/results/answer-store/import_first_chunk.py TARGET RUN_DIR STORE SECONDS
"""
import sys
from pathlib import Path

import torch

from d3d.model.checkpoint import load_model
from d3d.model.tokenizer import Tokenizer
from d3d.data.answers import AnswerStore, target_fingerprint
from d3d.train.chat_data import chat_requests
from d3d.train.common import save_atomic

target_dir, run, store_dir, seconds = sys.argv[1], Path(sys.argv[2]), sys.argv[3], float(sys.argv[4])
answers = [a for batch in torch.load(run / "answers.partial.pt") for a in batch]
prompts = torch.load(run / "prompts.pt")
requests = chat_requests(Tokenizer.load(target_dir), None, 0.05, 2 * 17321, kinds=("code", "explain"),
                         extra_functions=True)
assert [p for _, p in requests] == prompts, "the loop's requests are not chat_requests' on this machine"
target = load_model(target_dir)
store = AnswerStore(store_dir, target_fingerprint(target), 160)
assert not store.sealed() and not store.pending(), f"{store_dir}: not empty"
store.prepare()
save_atomic([[(k, p, a) for (k, p), a in zip(requests, answers)]], store.pending_path)
print(store.seal(seconds, str(target.embed_tokens.weight.dtype).removeprefix("torch.")))
