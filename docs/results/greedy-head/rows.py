"""Real rows for the greedy head's bounds: the final norm's outputs while a model answers 5 MT-Bench questions
greedily (24 tokens each), one row a decoding pass (bounds.py, bounds_int4.py)."""
import torch

import d3d
from d3d.data.prompts import mtbench_prompts
from d3d.fetch import resolve_model


def final_rows(name: str):
    """(the model, its LM head's weight, the rows [R, hidden])."""
    torch.set_grad_enabled(False)
    path = resolve_model(name)
    m, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
    hs = []
    hook = m.norm.register_forward_hook(lambda mod, i, o: hs.append(o.reshape(-1, o.shape[-1])[-1:].clone()))
    for i in (1, 5, 9, 20, 30):
        p = tok.encode_chat([{"role": "user", "content": mtbench_prompts()[i]}])
        d3d.generate(m, p, max_new_tokens=24, spec="ar", stop_ids=tok.stop_token_ids())
    hook.remove()
    return m, m.output_weight(), torch.cat(hs)
