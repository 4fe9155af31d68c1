"""``kitune stats`` shows each loop run's KI credit table (issue 21)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kitune.optimizers.credit import CreditLedger, ShownEpisode


def test_stats_prints_the_credit_of_every_loop_run(tmp_path: Path) -> None:
    from kitune.cli import _register, app

    cfg = tmp_path / "kitune.yaml"
    cfg.write_text(f"workdir: {tmp_path / 'work'}\nembedder:\n  type: hash\n  dim: 32\n", encoding="utf-8")
    ledger = CreditLedger(tmp_path / "work" / "optimize" / "loop-a" / "ki_credit.json")
    ledger.record_run("it0:validation", [ShownEpisode("q1", True, ("k1",)), ShownEpisode("q2", True, ())])
    ledger.record_run(
        "it1:validation", [ShownEpisode("q1", False, ("k1", "k2")), ShownEpisode("q2", False, ("k2",))]
    )
    _register()
    runner = CliRunner()
    res = runner.invoke(app, ["stats", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    assert "no KIs yet" in res.output and "KI credit of loop run loop-a:" in res.output
    assert "| k2 | 0 | 2 | 2 | 0 | retire | it1:validation:q1, it1:validation:q2 |" in res.output
    res = runner.invoke(app, ["stats", "--config", str(cfg), "--json"])
    data = json.loads(res.output)
    assert data["credit"]["loop-a"]["summary"] == {
        "runs": 2,
        "kis": 2,
        "harmful": 1,
        "helpful": 0,
        "demoted": 0,
        "retire": 1,
        "retired": 0,
    }
    assert data["credit"]["loop-a"]["harmful"]["k2"]["verdict"] == "retire"
    res = runner.invoke(app, ["stats", "--config", str(cfg), "--run-name", "other"])
    assert res.exit_code == 0 and "KI credit" not in res.output
