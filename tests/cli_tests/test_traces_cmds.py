"""``kitune traces import|status`` and ``kitune loop`` from the shell (only the optimiser is stubbed)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from kitune.cli import traces_cmds, watch_cmds


def _conv(i: int, answer: str) -> dict[str, Any]:
    return {
        "id": f"c{i}",
        "messages": [
            {"role": "user", "content": f"Question number {i}?"},
            {"role": "assistant", "content": answer},
        ],
        "correct": True,
    }


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[typer.Typer, Path, Path, list[Any]]:
    cfg_file = tmp_path / "kitune.yaml"
    cfg_file.write_text(f"workdir: {tmp_path / 'w'}\n", encoding="utf-8")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.jsonl").write_text("".join(json.dumps(_conv(i, f"A{i}")) + "\n" for i in range(3)))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"docid": "d1", "text": "Some text."}) + "\n")
    calls: list[Any] = []

    def fake_optimize(cfg: Any, opts: Any, **kw: Any) -> None:
        calls.append(opts)

    import kitune.service.tuning.optimize as optimize

    monkeypatch.setattr(optimize, "run_optimize", fake_optimize)
    app = typer.Typer()
    traces_cmds.register(app)
    watch_cmds.register(app)
    return app, cfg_file, inbox, calls


def test_import_then_status(env: tuple) -> None:
    app, cfg_file, inbox, _calls = env
    r = CliRunner().invoke(app, ["traces", "import", str(inbox / "a.jsonl"), "-c", str(cfg_file)])
    assert r.exit_code == 0, r.output
    assert re.search(r"new traces\s*│\s*3\s*│", r.output) and re.search(
        r"new questions\s*│\s*3\s*│", r.output
    )
    r = CliRunner().invoke(app, ["traces", "status", "-c", str(cfg_file)])
    assert r.exit_code == 0, r.output
    assert "3 traces imported, 3 questions, 3 not yet consumed, 0 round(s) finished" in r.output.replace(
        "\n", " "
    )
    r = CliRunner().invoke(app, ["traces", "import", str(inbox / "nope.jsonl"), "-c", str(cfg_file)])
    assert r.exit_code == 2 and "no trace file" in r.output


def test_loop_once_from_a_folder_then_nothing_new(env: tuple) -> None:
    app, cfg_file, inbox, calls = env
    corpus = inbox.parent / "corpus.jsonl"
    args = ["loop", "--corpus", str(corpus), "--traces", str(inbox), "--no-progress", "-c", str(cfg_file)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert len(calls) == 1 and calls[0].run_name == "loop-default-001" and calls[0].iterations == 1
    assert "loop-default-001" in r.output
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0 and "no round: 0 new trace(s)" in r.output and len(calls) == 1
    r = CliRunner().invoke(app, [*args, "--watch", str(inbox)])
    assert r.exit_code == 2 and "not both" in r.output
    r = CliRunner().invoke(app, ["loop", "--corpus", str(corpus), "--programs", "nope", "-c", str(cfg_file)])
    assert r.exit_code == 2 and "--programs" in r.output


def test_loop_with_a_missing_corpus_fails_before_looking_at_traces(env: tuple) -> None:
    # A mistyped --corpus used to read as "no round: 0 new trace(s)" with exit 0 (cron never noticed).
    app, cfg_file, inbox, calls = env
    missing = inbox.parent / "nope.jsonl"
    for extra in ([], ["--traces", str(inbox)], ["--watch", str(inbox), "--max-polls", "1"]):
        r = CliRunner().invoke(
            app, ["loop", "--corpus", str(missing), *extra, "--no-progress", "-c", str(cfg_file)]
        )
        assert r.exit_code == 2 and "no corpus at" in r.output, (extra, r.output)
    assert calls == []
