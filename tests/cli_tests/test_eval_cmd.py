"""``kitune eval``: bad input exits 2 before any LLM call, naming the input and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kitune.cli import _register, app
from kitune.cli.eval_cmds import EVAL_SKILL_CHOICES
from kitune.evaluation.full_context import EVAL_SKILLS
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.memory import MemoryStore


def test_skill_choices_match_the_evaluation_skills() -> None:
    assert EVAL_SKILL_CHOICES == EVAL_SKILLS


def test_unknown_skill_is_refused_by_the_parser_listing_the_skills(fixture_dir: Path) -> None:
    _register()
    r = CliRunner().invoke(app, ["eval", "--skill", "incontext", "--data", str(fixture_dir)])
    assert r.exit_code == 2
    out = " ".join(r.output.split())
    assert "incontext" in out and "'in-context'" in out and "'closed-book'" in out


def test_in_context_on_an_empty_ki_store_refuses_before_any_llm_call(
    tmp_path: Path, fixture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 16: `kitune eval --skill in-context` on an empty store ran every question (tokens spent).
    import kitune.lm
    import kitune.retrieval as retrieval

    built: list[str] = []
    monkeypatch.setattr(kitune.lm, "LiteLLMChatModel", lambda cfg, role, ledger=None: built.append(role))
    monkeypatch.setattr(retrieval, "create_store", lambda cfg: MemoryStore(embedder=HashEmbedder(dim=64)))
    monkeypatch.setenv("KITUNE_WORKDIR", str(tmp_path / "w"))
    _register()
    r = CliRunner().invoke(app, ["eval", "--skill", "in-context", "--data", str(fixture_dir), "--no-judge"])
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert "holds no KIs" in out and "kitune extract" in out
    assert built == [] and not (tmp_path / "w" / "runs").exists()
