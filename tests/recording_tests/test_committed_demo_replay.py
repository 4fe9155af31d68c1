"""The committed demo recordings (experiments/demo-*/recording) replay offline to their own numbers.

This is the README's claim "kitune demo --replay experiments/demo-<date>/recording reproduces
the table with no model": each run's summary.json (written when it was recorded with the
embedded model) must equal what the replay computes with the run's own settings (its
``demo.yaml`` copy), with no provider reachable. If a change alters any LLM request (a prompt, a
parameter), the replay stops on the first unrecorded call and this test says the recording must
be made again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kitune.cli import _register, app

ROOT = Path(__file__).resolve().parents[2]
RUNS = sorted(p.parent for p in (ROOT / "experiments").glob("demo-*/recording/calls.jsonl"))


@pytest.mark.slow
@pytest.mark.parametrize("run", [p.parent for p in RUNS], ids=[p.parent.name for p in RUNS])
def test_committed_demo_recording_replays_to_its_summary(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not (ROOT.parent / "shared" / "data" / "fixture").is_dir():
        pytest.skip("shared data not found")
    monkeypatch.chdir(ROOT)  # the demo reads ../shared/data/fixture and configs/experiments/demo.yaml
    for var in ("KITUNE_CONFIG", "KITUNE_WORKDIR"):
        monkeypatch.delenv(var, raising=False)
    _register()
    res = CliRunner().invoke(
        app,
        [
            "demo",
            *("--config", str(run / "demo.yaml")),
            *("--workdir", str(tmp_path), "--replay", str(run / "recording"), "--no-progress"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "no provider was called" in " ".join(res.output.split())
    # one line however narrow the terminal (Rich used to break it before "no provider was called")
    (said,) = [line for line in res.output.splitlines() if line.startswith("replayed ")]
    assert said.endswith("recording/calls.jsonl; no provider was called")
    keys = ("name", "n_total", "n_correct", "em", "f1", "input_tokens", "output_tokens", "timeouts")
    expected = [{k: s[k] for k in keys} for s in json.loads((run / "summary.json").read_text())]
    replayed = json.loads((tmp_path / "demo" / "report" / "summary.json").read_text())
    assert [{k: s[k] for k in keys} for s in replayed] == expected


def test_the_newest_recording_is_made_with_the_current_demo_settings() -> None:
    """The README's demo table comes from the newest recording, made with today's demo.yaml."""
    assert RUNS, "no committed demo recording under experiments/demo-*/recording"
    newest = RUNS[-1].parent
    current = (ROOT / "configs" / "experiments" / "demo.yaml").read_text()
    assert (newest / "demo.yaml").read_text() == current, (
        f"{newest.name}/demo.yaml differs from configs/experiments/demo.yaml: re-record the demo "
        "(kitune demo --record experiments/demo-<date>/recording) and copy the config there"
    )
