"""Copy the loop-dev-100 run's records into this folder, or put them back into a work folder.

The same tool as ``experiments/loop-dev-48/collect.py`` (see its docstring for what is copied and
restored), pointed at this run's name, folder and config:

* ``python experiments/loop-dev-100/collect.py WORKDIR`` — after every step (run.sh calls it);
* ``python experiments/loop-dev-100/collect.py WORKDIR --restore`` — a later session without the
  original work folder: the records go back into ``WORKDIR/optimize/loop-dev-100`` and the KI
  tables are re-indexed, so rerunning ``run.sh WORKDIR`` continues the run.

Unlike loop-dev-48's, this one also keeps DSPy's LM-call cache (``WORKDIR/dspy-cache``: the
rewriter, reflection and GEPA metric calls, ~21 MB on disk, ~1.5 MB packed) as
``dspy-cache.tar.gz`` here, and unpacks it on ``--restore``: a resumed run then replays GEPA's
calls instead of spending the ~1 h they took. Pack it only while the run is stopped (the cache is
an SQLite database being written to while it runs).
"""

from __future__ import annotations

import importlib.util
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).parent
_BASE = HERE.parent / "loop-dev-48" / "collect.py"
_spec = importlib.util.spec_from_file_location("loop_dev_48_collect", _BASE)
assert _spec is not None and _spec.loader is not None
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)
base.HERE = HERE
base.RUN = "loop-dev-100"
base.CONFIG = Path("configs/experiments/loop-dev-100.yaml")

PACKED = HERE / "dspy-cache.tar.gz"


def pack_lm_cache(work: Path) -> None:
    """Pack ``work/dspy-cache`` into ``dspy-cache.tar.gz`` here (nothing when it does not exist)."""
    if (work / "dspy-cache").is_dir():
        with tarfile.open(PACKED, "w:gz") as tar:
            tar.add(work / "dspy-cache", arcname="dspy-cache")
        print(f"packed {work / 'dspy-cache'} into {PACKED} ({PACKED.stat().st_size:,} bytes)")


def unpack_lm_cache(work: Path) -> None:
    """Unpack ``dspy-cache.tar.gz`` into ``work`` unless ``work/dspy-cache`` already exists."""
    if PACKED.is_file() and not (work / "dspy-cache").exists():
        work.mkdir(parents=True, exist_ok=True)
        with tarfile.open(PACKED, "r:gz") as tar:
            tar.extractall(work, filter="data")
        print(f"unpacked {PACKED} into {work / 'dspy-cache'}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python experiments/loop-dev-100/collect.py WORKDIR [--restore] [--pack-lm-cache]")
    target = Path(sys.argv[1])
    if "--restore" in sys.argv[2:]:
        base.restore(target)
        unpack_lm_cache(target)
    else:
        base.collect(target)
        if "--pack-lm-cache" in sys.argv[2:]:
            pack_lm_cache(target)
