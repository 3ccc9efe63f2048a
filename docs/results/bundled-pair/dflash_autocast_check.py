"""Is bf16 autocast why the DFlash baseline trailed? Its training loss on one batch of the training
continuations, the committed drafter loaded in fp32, computed in fp32 and under bf16 autocast (as
in training). Writes dflash_autocast_check.json.

    PYTHONPATH=. python docs/results/bundled-pair/dflash_autocast_check.py ~/.cache/d3d-runs/d3d-drafter-16m/data/drafter-data-*.pt
"""
import json
import sys

import torch

import d3d
from bench.common import machine
from d3d.assets import BUNDLED_DFLASH, BUNDLED_TARGET, bundled
from d3d.draft.dflash import load_dflash
from d3d.train.dflash import DFlashTrainConfig, dflash_loss

target = d3d.load_model(bundled(BUNDLED_TARGET), dtype="float32")
drafter = load_dflash(bundled(BUNDLED_DFLASH), target)
x0 = torch.load(sys.argv[1])[:8]
cfg = DFlashTrainConfig(target=str(bundled(BUNDLED_TARGET)), out="unused", num_layers=4)
loss = {}
with torch.no_grad():
    for name, dtype in (("float32", None), ("bfloat16_autocast", torch.bfloat16)):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is not None):
            loss[name] = float(dflash_loss(drafter, target, x0, cfg, torch.Generator().manual_seed(0)))
out = {"what": __doc__.strip().splitlines()[0], "machine": machine(), "batch": list(x0.shape), "loss": loss}
json.dump(out, open("docs/results/bundled-pair/dflash_autocast_check.json", "w"), indent=2)
print(loss)
