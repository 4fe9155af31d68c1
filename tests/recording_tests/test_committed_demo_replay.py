"""The committed demo recording (experiments/demo-2026-12-01) replays offline to its own numbers.

This is the README's claim "kitune demo --replay experiments/demo-2026-12-01/recording
reproduces the table with no model": the run's summary.json (written when it was recorded with
the embedded model) must equal what the replay computes, with no provider reachable. If a
change alters any LLM request (a prompt, a parameter), the replay stops on the first unrecorded
call and this test says the recording must be made again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kitune.cli import _register, app

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "experiments" / "demo-2026-12-01"


@pytest.mark.slow
def test_committed_demo_recording_replays_to_its_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not (ROOT.parent / "shared" / "data" / "fixture").is_dir():
        pytest.skip("shared data not found")
    monkeypatch.chdir(ROOT)  # the demo reads ../shared/data/fixture and configs/experiments/demo.yaml
    for var in ("KITUNE_CONFIG", "KITUNE_WORKDIR"):
        monkeypatch.delenv(var, raising=False)
    _register()
    res = CliRunner().invoke(
        app, ["demo", "--workdir", str(tmp_path), "--replay", str(RUN / "recording"), "--no-progress"]
    )
    assert res.exit_code == 0, res.output
    assert "no provider was called" in " ".join(res.output.split())
    keys = ("name", "n_total", "n_correct", "em", "f1", "input_tokens", "output_tokens", "timeouts")
    expected = [{k: s[k] for k in keys} for s in json.loads((RUN / "summary.json").read_text())]
    replayed = json.loads((tmp_path / "demo" / "report" / "summary.json").read_text())
    assert [{k: s[k] for k in keys} for s in replayed] == expected
