"""--no-progress silences the libraries' own bars and progress lines too (issue 37, item 6)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kitune.cli.common import quiet_progress

SRC = Path(__file__).resolve().parents[2] / "src"

_PROBE = """
import logging
from kitune.cli.common import quiet_progress
quiet_progress({progress})
import dspy  # what a command imports after its first line
from tqdm.auto import tqdm
bar = tqdm(range(3))  # GEPA's bar: dspy passes display_progress_bar=True itself
import tqdm as tqdm_module
forced = tqdm_module.tqdm(range(3), disable=False)  # dspy's bootstrap_trace: display_progress=True
print(bar.disable and forced.disable, logging.getLogger("dspy").getEffectiveLevel())
"""


def _probe(progress: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    env["PYTHONPATH"] = str(SRC)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(progress=progress)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    return done.stdout.strip()


def test_no_progress_disables_the_libraries_bars_and_info_lines() -> None:
    # a fresh process, as a command runs: quiet_progress is its first line, before tqdm is imported
    assert _probe(False) == f"True {logging.WARNING}"


def test_progress_on_leaves_the_bars_on() -> None:
    assert _probe(True).startswith("False ")


@pytest.fixture
def _dspy_level() -> Iterator[None]:
    saved = logging.getLogger("dspy").level
    yield
    logging.getLogger("dspy").setLevel(saved)


@pytest.mark.usefixtures("_dspy_level")
def test_progress_on_changes_no_setting() -> None:
    logging.getLogger("dspy").setLevel(logging.INFO)
    quiet_progress(True)
    assert "TQDM_DISABLE" not in os.environ and logging.getLogger("dspy").level == logging.INFO
