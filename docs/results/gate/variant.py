"""A slower gate on the validation requests (an experiment; the library's gate is unchanged).

Variant: decay 0.1 (about 10 rounds of memory instead of 4) and plain steps probed every 32nd
round while drafting wins (a step's rate depends on the machine, which changes slowly), drafting
still every 8th round while steps win (its rate depends on the text). Runs ``bench speculative``
with ``sync+gate`` meaning this variant:

    PYTHONPATH=. python docs/results/gate/variant.py TARGET_DIR SET OUT_JSON      # SET: code or explain
"""
import sys

import d3d.decode.speculative
from d3d.decode.gate import DRAFT, STEP, Gate


class SlowGate(Gate):
    def __init__(self):
        super().__init__(probe_every=8, decay=0.1)

    def choose(self) -> str:
        for kind in (DRAFT, STEP):
            if self.tokens[kind] is None:
                return kind
        best = DRAFT if self.rate(DRAFT) >= self.rate(STEP) else STEP
        self.since_probe += 1
        if self.since_probe >= (32 if best == DRAFT else self.probe_every):
            self.since_probe = 0
            return STEP if best == DRAFT else DRAFT
        return best


d3d.decode.speculative.Gate = SlowGate
from bench.speculative import main  # noqa: E402

target, name, out = sys.argv[1:4]
main(["--target", target, "--drafter", "models/d3d-drafter-qwen2.5-coder-0.5b", "--chat", "--validation",
      "--sets", name, "--n", "8", "--new-tokens", "128", "--modes", "ar", "sync", "sync+gate", "--out", out])
