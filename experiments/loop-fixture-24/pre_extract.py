"""Extract the KIs the loop run needs before the loop starts (same code path and store table).

Run from the repository root: ``python experiments/loop-fixture-24/pre_extract.py WORKDIR``.
Resumable: rerunning skips documents already done. It builds the loop's own environment
(``ServiceLoopEnv``) for the same options as the loop command and calls ``ensure_extracted``
for every question, so the loop later finds every document extracted.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from kitune.config import load_config
from kitune.optimizers.loop import Setting, initial_prompts
from kitune.service.tuning.loop_env import ServiceLoopEnv
from kitune.service.tuning.optimize import default_deps
from kitune.service.tuning.options import OptimizeOptions
from kitune.service.tuning.slicing import load_slice
from kitune.usage import TokenLedger

workdir = Path(sys.argv[1])
cfg = load_config(Path("configs/experiments/loop-fixture.yaml"), {"workdir": str(workdir)})
opts = OptimizeOptions(data_dir=Path("../shared/data/fixture"), progress=False)
questions, documents = load_slice(cfg, opts)
ledger = TokenLedger()
deps = default_deps(cfg, ledger)
env = ServiceLoopEnv(
    cfg,
    opts,
    deps,
    questions=questions,
    documents=documents,
    state_dir=workdir / "optimize" / "pre",
    log=print,
)
setting = Setting(initial_prompts(("extractor",), corpus=cfg.corpus_name, registry=None))
t0 = time.time()
print(env.ensure_extracted(setting, questions), flush=True)
print(f"wall {time.time() - t0:.0f} s; tokens {ledger.by_role_stage()}", flush=True)
env.close()
