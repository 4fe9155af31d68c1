"""``kitune extract``: Ctrl-C says what was saved and how to resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kitune.cli import _register, app
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.memory import MemoryStore


def test_ctrl_c_reports_saved_documents_from_the_resume_file(
    tmp_path: Path, fixture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 16: Ctrl-C exited in silence with the bar at 96 done while 49 were saved.
    import kitune.lm as lm_mod
    import kitune.retrieval as retrieval
    import kitune.service.pipelines.extraction as extraction

    monkeypatch.setenv("KITUNE_WORKDIR", str(tmp_path / "w"))
    monkeypatch.setattr(retrieval, "create_store", lambda cfg: MemoryStore(embedder=HashEmbedder(dim=64)))
    monkeypatch.setattr(lm_mod, "build_lm", lambda cfg, role, ledger=None: object())

    def interrupted(docs: list[Any], store: Any, extractor: Any, *, state_path: Path, **kw: Any) -> None:
        state_path.parent.mkdir(parents=True, exist_ok=True)
        rows = [{"docid": d.docid, "status": "ok"} for d in docs[:3]]
        rows.append({"docid": docs[3].docid, "status": "failed"})
        state_path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        raise KeyboardInterrupt

    monkeypatch.setattr(extraction, "extract_corpus", interrupted)
    _register()
    r = CliRunner().invoke(
        app,
        ["extract", "--data", str(fixture_dir), "--limit", "10", "--no-progress", "--packaged"],
        env={"COLUMNS": "300"},
    )
    assert r.exit_code == 130, r.output
    assert "interrupted; 3 of 10 document(s) are saved" in r.output and "rerun the same command" in r.output
