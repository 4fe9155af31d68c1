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
    monkeypatch.setattr(retrieval, "store_exists", lambda cfg: True)  # a table that exists, empty
    monkeypatch.setenv("KITUNE_WORKDIR", str(tmp_path / "w"))
    _register()
    r = CliRunner().invoke(app, ["eval", "--skill", "in-context", "--data", str(fixture_dir), "--no-judge"])
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert "holds no KIs" in out and "kitune extract" in out
    assert built == [] and not (tmp_path / "w" / "runs").exists()


# -- issue 37 (5): exits users can script on, the reused answers said, --no-cache ------------------


def _eval_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, turns: list[object]) -> Path:
    import kitune.lm
    from kitune.testing.chat import ScriptedChatModel

    model = ScriptedChatModel(turns, usage=(50, 5))  # type: ignore[arg-type]
    monkeypatch.setattr(kitune.lm, "LiteLLMChatModel", lambda cfg, role, ledger=None: model)
    cfg = tmp_path / "k.yaml"
    cfg.write_text(f"workdir: {tmp_path / 'w'}\ngrading: {{grader: match}}\nagent: {{concurrency: 1}}\n")
    return cfg


def _answer(text: str) -> str:
    import json

    return json.dumps({"answer": {"explanation": "from memory", "exact_answer": text, "confidence": 50}})


def test_eval_exit_codes_fail_under_reuse_and_no_cache(
    tmp_path: Path, fixture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kitune.data.loaders import load_questions

    gold = {q.query: q.answer for q in load_questions(fixture_dir)}
    asked: list[str] = []

    def first_right(messages: list[dict[str, str]]) -> str:  # the first question right, the rest wrong
        asked.append(messages[1]["content"])
        hit = next((a for q, a in gold.items() if q in messages[1]["content"]), "")
        return _answer(hit if len(asked) == 1 else "certainly not this")

    cfg = _eval_env(tmp_path, monkeypatch, [first_right] * 6)
    _register()
    base = ["eval", "--skill", "closed-book", "--data", str(fixture_dir), "--limit", "2", "-c", str(cfg)]
    r = CliRunner().invoke(app, [*base, "--fail-under", "0.9", "--no-progress"])
    assert r.exit_code == 1, r.output
    out = " ".join(r.output.split())
    assert "accuracy 50.0% (1/2) is below --fail-under 90.0%" in out
    assert "correct (match)" in out and "judge-correct" not in out  # the summary names the grader
    assert "wrong (match)" not in out  # --no-progress: no per-question lines
    # the rerun asks nothing: both answers are reused, and it says so
    r = CliRunner().invoke(app, [*base, "--fail-under", "0.5"])
    assert r.exit_code == 0, r.output
    assert "reused 2 cached answer(s) of 2" in " ".join(r.output.split())
    # --no-cache asks again (the scripted model's next answers are wrong) and keeps the old file
    r = CliRunner().invoke(app, [*base, "--no-cache"])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "reused" not in out and "wrong (match)" in out and "moved to" in out
    assert len(list((tmp_path / "w" / "runs").rglob("traces.replaced-*.jsonl"))) == 1


def test_eval_exits_1_when_no_question_was_answered(
    tmp_path: Path, fixture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kitune.errors import LMRateLimitError

    cfg = _eval_env(tmp_path, monkeypatch, [LMRateLimitError("429 after retries")] * 4)
    _register()
    args = ["eval", "--skill", "closed-book", "--data", str(fixture_dir), "--limit", "2", "-c", str(cfg)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 1, r.output
    assert "no question was answered: all 2 failed" in " ".join(r.output.split())


def test_eval_runs_on_one_question_and_names_an_empty_split(
    tmp_path: Path, fixture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: eval on a single question gives a result and exit 0; an empty split says why."""
    import json

    cfg = _eval_env(tmp_path, monkeypatch, [lambda _m: _answer("MIT")] * 2)
    one = tmp_path / "one.jsonl"
    question = {"query_id": "q1", "query": "Which license does curl use?", "answer": "MIT"}
    one.write_text(json.dumps(question) + "\n")
    _register()
    base = ["eval", "--skill", "closed-book", "--data", str(fixture_dir), "--questions", str(one)]
    r = CliRunner().invoke(app, [*base, "-c", str(cfg), "--no-progress"])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "1/1 (100.0%)" in out and "20.7%–100.0%" in out  # the Wilson interval of 1 of 1
    r = CliRunner().invoke(app, [*base, "--split", "validation", "-c", str(cfg)])
    assert r.exit_code == 2
    out = " ".join(r.output.split())
    assert "--split validation of" in out and "gives 0 questions: its 1 question(s) all go to tuning" in out
    assert "use --split all" in out
