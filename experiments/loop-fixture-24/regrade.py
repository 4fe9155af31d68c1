"""Re-grade cached agent episodes with the deterministic grader (one-off, documented in the README).

The loop run's first 13 episodes were graded by the embedded 1.5B judge before the run was
stopped and switched to ``grading.grader: match`` (the judge's verdicts were wrong for 5 of 12).
The episodes themselves (answers, tokens, steps) do not depend on the grader, so instead of
running them again this script recomputes only the judge fields with
:func:`kitune.evaluation.grading.match_judge`, keeping the original file beside it as
``<name>.llm-judge.jsonl``. Usage: ``python regrade.py TRACES.jsonl``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from kitune.evaluation.grading import match_answer

path = Path(sys.argv[1])
backup = path.with_suffix(".llm-judge.jsonl")
if not backup.exists():
    shutil.copy2(path, backup)
lines = backup.read_text(encoding="utf-8").splitlines()
out, changed = [], 0
for line in lines:
    t = json.loads(line)
    if t["status"] != "failed":
        correct, _rule = match_answer(t["exact_answer"], t["gold_answer"], t.get("aliases", []))
        changed += int(correct != t.get("judge_correct"))
        t.update(judge_correct=correct, judge_status="graded", judge_error=None)
    out.append(json.dumps(t, ensure_ascii=False))
path.write_text("\n".join(out) + "\n", encoding="utf-8")
print(f"{path}: {len(out)} traces re-graded, {changed} verdicts changed (original: {backup.name})")
