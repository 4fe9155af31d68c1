"""Tests for kitune.tracking.prompts against one SQLite registry per module."""

from __future__ import annotations

from pathlib import Path

import pytest

from kitune.errors import PromptNotFoundError, TrackingError
from kitune.tracking.prompts import PromptRegistry, prompt_name


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> PromptRegistry:
    root = tmp_path_factory.mktemp("registry")
    reg = PromptRegistry(f"sqlite:///{root / 'mlflow.db'}")
    name = prompt_name("fixture", "extractor")
    reg.register(name, "Extract facts.\nOne per line.\n", tags={"run_id": "r1"}, commit_message="seed")
    reg.register(name, "Extract facts.\nOne per line, with dates.\n", commit_message="gepa round 1")
    reg.register(
        name, "Extract facts {{doc}}.\nOne per line, with dates and places.\n", commit_message="round 2"
    )
    return reg


def test_prompt_name_is_sanitised() -> None:
    assert prompt_name("fixture", "extractor") == "kitune-fixture-extractor"
    assert prompt_name("My Corpus/2026", "Query Rewriter") == "kitune-my-corpus-2026-query-rewriter"
    with pytest.raises(ValueError, match="corpus"):
        prompt_name("///", "x")


def test_register_and_get(registry: PromptRegistry) -> None:
    name = "kitune-fixture-extractor"
    versions = registry.versions(name)
    assert [v.version for v in versions] == [1, 2, 3]
    first = registry.get(name, 1)
    assert first.text == "Extract facts.\nOne per line.\n"
    assert first.tags["run_id"] == "r1" and first.commit_message == "seed"
    assert registry.get(name, "v3").text.startswith("Extract facts {{doc}}.")  # braces kept verbatim
    assert registry.get(name, "latest").version == 3


def test_unknown_name_version_alias_have_clear_errors(registry: PromptRegistry) -> None:
    with pytest.raises(PromptNotFoundError, match=r"no prompt named 'kitune-nope'.*kitune-fixture-extractor"):
        registry.get("kitune-nope", 1)
    with pytest.raises(PromptNotFoundError, match=r"no version 9; versions: \[1, 2, 3\]"):
        registry.get("kitune-fixture-extractor", 9)
    with pytest.raises(PromptNotFoundError, match="no alias 'staging'"):
        registry.get("kitune-fixture-extractor", "staging")
    with pytest.raises(ValueError, match="alias must be one of"):
        registry.set_alias("kitune-fixture-extractor", "staging", 1)
    with pytest.raises(ValueError, match="empty"):
        registry.register("kitune-fixture-extractor", "   ")
    with pytest.raises(ValueError, match="prompt_name"):
        registry.register("bad name", "x")


def test_diff(registry: PromptRegistry) -> None:
    text = registry.diff("kitune-fixture-extractor", 1, 2)
    assert text.splitlines()[:2] == ["--- kitune-fixture-extractor@v1", "+++ kitune-fixture-extractor@v2"]
    assert "-One per line.\n" in text and "+One per line, with dates.\n" in text
    assert registry.diff("kitune-fixture-extractor", 2, 2) == ""


def test_promote_rollback_walks_history(registry: PromptRegistry) -> None:
    name = "kitune-fixture-rewriter"
    for i in range(1, 4):
        registry.register(name, f"Rewrite the question, variant {i}.")
    with pytest.raises(PromptNotFoundError, match="no alias 'production'"):
        registry.rollback(name)
    # No production yet: get() without a version falls back to latest.
    assert registry.get(name).version == 3
    registry.set_alias(name, "candidate", 3)
    for v in (1, 2, 3):
        promoted = registry.promote(name, v)
        assert "production" in promoted.aliases
    assert registry.get(name).version == 3
    assert [v.version for v in registry.history(name)] == [1, 2, 3]
    assert registry.rollback(name).version == 2
    assert registry.get(name, "production").version == 2
    assert registry.get(name, 3).tags["kitune.rolled_back"] == "true"
    assert registry.rollback(name).version == 1
    with pytest.raises(PromptNotFoundError, match="nothing to roll back to"):
        registry.rollback(name)
    # Re-promoting clears the rolled-back mark and becomes the newest history entry.
    registry.promote(name, 3)
    assert registry.get(name, 3).tags["kitune.rolled_back"] == "false"
    assert registry.rollback(name).version == 1
    summary = {s.name: s for s in registry.list()}
    assert summary[name].latest_version == 3
    assert summary[name].aliases == {"candidate": 3, "production": 1}
    assert [v.aliases for v in registry.versions(name)] == [("production",), (), ("candidate",)]


def test_file_store_uri_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TrackingError, match="file store"):
        PromptRegistry(str(tmp_path / "mlruns"))
    with pytest.raises(TrackingError, match="file store"):
        PromptRegistry((tmp_path / "mlruns").as_uri())
