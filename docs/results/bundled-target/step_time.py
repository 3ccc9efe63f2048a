"""Training-step time of the two candidate target shapes, interleaved in one process (docs/results/bundled-target/size_choice.md)."""
import time, torch, torch.nn.functional as F
from d3d.model.config import ModelConfig
from d3d.model.transformer import Transformer
torch.manual_seed(0)
def cfg(h, L, H, mlp):
    return ModelConfig(vocab_size=8192, hidden_size=h, intermediate_size=mlp, num_hidden_layers=L, num_attention_heads=H,
                       num_key_value_heads=2, head_dim=64, max_position_embeddings=2048, tie_word_embeddings=True)
shapes = {"28M (512x8)": cfg(512, 8, 8, 1536), "16M (384x8)": cfg(384, 8, 6, 1024)}
models = {k: Transformer(c) for k, c in shapes.items()}
opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
x = torch.randint(0, 8192, (16, 257))
res = {k: [] for k in models}
for rep in range(6):
    for k, m in models.items():
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = m(x[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten())
        opts[k].zero_grad(); loss.backward(); opts[k].step()
        if rep: res[k].append(time.perf_counter() - t)
for k, v in res.items():
    v.sort(); print(k, f"median {v[len(v)//2]:.2f} s/step -> {16*256/v[len(v)//2]:.0f} tok/s")
