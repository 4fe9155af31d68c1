"""Artifacts the loop logs to any tracker: candidate instructions and optimised program state.

They live with the loop (the optimizers layer) and use only the tracker's own methods
(``log_text``, ``log_dict``, ``log_artifact``), so the loop does not import the tracking
layer; :mod:`kitune.tracking.trackers` re-exports both.
"""

from __future__ import annotations

import logging
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kitune.optimizers.protocols import Tracker

__all__ = ["log_candidate", "log_program_state"]

logger = logging.getLogger(__name__)


def log_program_state(
    tracker: Tracker, program: Any, artifact_file: str = "program/program.json", *, run_id: str | None = None
) -> None:
    """Log a DSPy program's saved state as JSON (``program.save(path, save_program=False)``; never pickle).

    Args:
        tracker: where to log.
        program: a ``dspy.Module``.
        artifact_file: artifact path; must end in ``.json``.
        run_id: explicit run (else the current one).

    Raises:
        ValueError: ``artifact_file`` does not end in ``.json``.
    """
    if not artifact_file.endswith(".json"):
        raise ValueError(f"artifact_file must end in .json (state only, never pickle), got {artifact_file!r}")
    folder, _, filename = artifact_file.rpartition("/")
    with tempfile.TemporaryDirectory(prefix="kitune-program-") as tmp:
        path = Path(tmp) / filename
        try:
            program.save(str(path), save_program=False)
        except Exception as e:
            record = getattr(tracker, "_record", None)  # trackers that keep a failure list
            if callable(record):
                record("log_program_state", artifact_file, e, run_id)
            else:
                logger.warning("saving program state for %s failed: %s", artifact_file, e)
            return
        tracker.log_artifact(path, folder or None, run_id=run_id)


def log_candidate(
    tracker: Tracker, candidate: Mapping[str, str], prefix: str = "prompts", *, run_id: str | None = None
) -> dict[str, str]:
    """Log each instruction of a candidate as ``<prefix>/<predictor>.txt`` plus ``<prefix>/candidate.json``.

    Args:
        tracker: where to log.
        candidate: predictor name → instruction text (see ``kitune.optimizers.base.Candidate``).
        prefix: artifact folder.
        run_id: explicit run (else the current one).

    Returns:
        Predictor name → artifact file it was written to (names made file-safe).
    """
    files: dict[str, str] = {}
    for predictor, text in candidate.items():
        safe = re.sub(r"[^A-Za-z0-9_.\-]+", "_", predictor).strip("_.") or "predictor"
        files[predictor] = f"{prefix}/{safe}.txt"
        tracker.log_text(text, files[predictor], run_id=run_id)
    tracker.log_dict(dict(candidate), f"{prefix}/candidate.json", run_id=run_id)
    return files
