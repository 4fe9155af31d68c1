"""Copy the loop run's records into this folder (run from the repository root after the run).

Usage: ``python experiments/loop-fixture-24/collect.py WORKDIR`` — copies the loop state, curves,
failure ledger, every evaluation's traces and the look-up log from
``WORKDIR/optimize/loop-fixture-24``, and exports the KI table (extracted + disambiguation KIs,
every status) to ``kis.jsonl``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from kitune.config import load_config
from kitune.retrieval import create_store
from kitune.schema import Filter

try:
    from kitune.service.serving.prompts import versioned_store_cfg
except ImportError:  # the run's own commit (run-loop-fixture-24) named it privately
    from kitune.service.optimize import _versioned_store_cfg as versioned_store_cfg  # type: ignore[attr-defined,no-redef]

work = Path(sys.argv[1])
here = Path(__file__).parent
run = work / "optimize" / "loop-fixture-24"
for name in ("loop_state.json", "curves.md", "curves.png", "failure_ledger.json", "failure_ledger.md"):
    if (run / name).is_file():
        shutil.copy2(run / name, here / name)
(here / "evals").mkdir(exist_ok=True)
for f in sorted((run / "evals").glob("*.jsonl")):
    shutil.copy2(f, here / "evals" / f.name)
for f in sorted((run / "llm-judge-originals").glob("*.jsonl")):
    shutil.copy2(f, here / "evals" / f.name)
cfg = load_config(Path("configs/experiments/loop-fixture.yaml"), {"workdir": str(work)})
store = create_store(versioned_store_cfg(cfg, "extractor@e31e6d7e"))
kis = sorted(store.iter_kis(Filter(statuses=())), key=lambda k: k.id)
with (here / "kis.jsonl").open("w", encoding="utf-8") as fh:
    for ki in kis:
        fh.write(json.dumps(ki.model_dump(mode="json"), ensure_ascii=False) + "\n")
subtypes: dict[str, int] = {}
for ki in kis:
    subtypes[ki.payload.subtype] = subtypes.get(ki.payload.subtype, 0) + 1
print(f"{len(kis)} KIs exported: {subtypes}")
