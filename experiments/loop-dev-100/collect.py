"""Copy the loop-dev-100 run's records into this folder, or put them back into a work folder.

The same tool as ``experiments/loop-dev-48/collect.py`` (see its docstring for what is copied and
restored), pointed at this run's name, folder and config:

* ``python experiments/loop-dev-100/collect.py WORKDIR`` — after every step (run.sh calls it);
* ``python experiments/loop-dev-100/collect.py WORKDIR --restore`` — a later session without the
  original work folder: the records go back into ``WORKDIR/optimize/loop-dev-100`` and the KI
  tables are re-indexed, so rerunning ``run.sh WORKDIR`` continues the run.
"""

from __future__ import annotations

import importlib.util
import sys
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

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python experiments/loop-dev-100/collect.py WORKDIR [--restore]")
    target = Path(sys.argv[1])
    base.restore(target) if "--restore" in sys.argv[2:] else base.collect(target)
