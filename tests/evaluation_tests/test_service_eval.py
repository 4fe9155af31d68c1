"""Tests for kitune.service.pipelines.evaluation and the eval/report CLI (stand-ins, real fixture data)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from eval_fakes import FakeCorpusStore
from typer.testing import CliRunner

from kitune.config import KituneConfig
from kitune.data.loaders import load_corpus
from kitune.errors import ConfigError
from kitune.evaluation.tools import ContextObservation
from kitune.service.pipelines.evaluation import default_run_name, report_runs, run_eval
from kitune.testing.chat import ScriptedChatModel


@dataclass(frozen=True)
class Verdict:
    correct: bool | None
    status: str


def judge(*, question, response, gold, aliases):
    return Verdict(any(f"Exact Answer: {g}\n" in response for g in [gold, *aliases]), "graded")


def _answer_model(n: int, first_tool: str | None = None) -> ScriptedChatModel:
    def turn(messages):
        q = messages[1]["content"]
        return json.dumps(
            {
                "answer": {
                    "explanation": "",
                    "exact_answer": "Lunenburg" if "LaHave" in q else "x",
                    "confidence": 50,
                }
            }
        )

    turns = []
    for _ in range(n):
        if first_tool:
            turns.append(json.dumps({"tool": first_tool, "args": {"query": "LaHave David Morse"}}))
        turns.append(turn)
    return ScriptedChatModel(turns, usage=(40, 4))


def test_run_eval_baseline_on_fixture(tmp_path: Path, fixture_dir: Path) -> None:
    cfg = KituneConfig(workdir=tmp_path / "w")
    store = FakeCorpusStore(load_corpus(fixture_dir))
    res = run_eval(
        cfg,
        skill="baseline",
        data_dir=fixture_dir,
        limit=3,
        concurrency=1,
        progress=False,
        chat_model=_answer_model(3, "search"),
        judge=judge,
        corpus_store=store,
    )
    assert res.run_dir == tmp_path / "w" / "runs" / "baseline-fixture-all-n3"
    assert [t.query_id for t in res.traces] == ["43", "94", "9"]
    t43 = res.traces[0]
    assert (
        t43.judge_correct is True
        and t43.em is True
        and t43.input_tokens == 80
        and t43.tool_calls == {"search": 1}
    )
    assert t43.evidence_recall is not None and 0 < t43.evidence_recall <= 1
    assert res.summary.n_correct == 1 and res.summary.input_tokens == 240
    params = json.loads((res.run_dir / "run.json").read_text())
    assert params["question_ids"] == ["43", "94", "9"] and params["budget"]["max_steps"] == 43
    assert json.loads((res.run_dir / "summary.json").read_text())["n_total"] == 3
    # resume: nothing left to run, so an empty script is never called
    again = run_eval(
        cfg,
        skill="baseline",
        data_dir=fixture_dir,
        limit=3,
        progress=False,
        chat_model=ScriptedChatModel([]),
        judge=judge,
        corpus_store=store,
    )
    assert [t.to_dict() for t in again.traces] == [t.to_dict() for t in res.traces]


def test_run_eval_in_context_and_checks(tmp_path: Path, fixture_dir: Path) -> None:
    cfg = KituneConfig(workdir=tmp_path / "w")
    seen = []

    def ctx(query: str) -> ContextObservation:
        seen.append(query)
        return ContextObservation(
            text="1. [k] LaHave is in Lunenburg (docs: 100818)", doc_ids=("100818",), n_results=1
        )

    res = run_eval(
        cfg,
        skill="in-context",
        data_dir=fixture_dir,
        limit=1,
        progress=False,
        use_judge=False,
        chat_model=_answer_model(1, "get_context"),
        context_fn=ctx,
        corpus_store=FakeCorpusStore([]),
    )
    assert seen == ["LaHave David Morse"]
    assert res.traces[0].doc_ids_seen == ["100818"] and res.traces[0].judge_status == "not_run"
    with pytest.raises(ConfigError, match="only apply to --skill in-context"):
        run_eval(cfg, skill="baseline", data_dir=fixture_dir, disambiguation=True)
    with pytest.raises(ConfigError, match="unknown skill"):
        run_eval(cfg, skill="oracle", data_dir=fixture_dir)  # type: ignore[arg-type]
    assert default_run_name("in-context", fixture_dir, "tune", None, True) == "in-context-disamb-fixture-tune"


def test_cli_eval_closed_book_and_report(
    tmp_path: Path, fixture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kitune.lm
    from kitune.cli import _register, app

    monkeypatch.setattr(kitune.lm, "LiteLLMChatModel", lambda cfg, role, ledger=None: _answer_model(2))
    monkeypatch.setenv("KITUNE_WORKDIR", str(tmp_path / "w"))
    _register()
    runner = CliRunner()
    r = runner.invoke(
        app,
        [
            "eval",
            "--skill",
            "closed-book",
            "--data",
            str(fixture_dir),
            "--limit",
            "2",
            "--no-judge",
            "--run-name",
            "cb",
        ],
    )
    assert r.exit_code == 0, r.output
    run_dir = tmp_path / "w" / "runs" / "cb"
    assert len((run_dir / "traces.jsonl").read_text().splitlines()) == 2
    r2 = runner.invoke(app, ["report", str(run_dir), "--out", str(tmp_path / "rep")])
    assert r2.exit_code == 0, r2.output
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| input tokens | 80 |" in md and "| EM | 0.500 |" in md
    bad = runner.invoke(app, ["eval", "--skill", "closed-book", "--data", str(tmp_path / "missing")])
    assert bad.exit_code == 2 and "does not exist" in " ".join(bad.output.split())
    files = report_runs([run_dir], tmp_path / "rep2")
    assert files.summaries[0].n_total == 2


@pytest.mark.slow
def test_run_eval_with_real_stores_hash_embedder(tmp_path: Path, fixture_dir: Path) -> None:
    """The default wiring: LanceDB corpus store filled from --data, empty KI store, get_context gate."""
    cfg = KituneConfig(workdir=tmp_path / "w", embedder={"type": "hash"})
    lookups = [json.dumps({"tool": "get_context", "args": {"query": q}}) for q in ("LaHave", "David Morse")]
    script = [
        json.dumps({"tool": "search", "args": {"query": "LaHave"}}),  # refused: no failed look-ups yet
        *lookups,  # empty KI store: two failed look-ups
        json.dumps({"tool": "search", "args": {"query": "LaHave River Lunenburg"}}),
        json.dumps({"answer": {"explanation": "", "exact_answer": "Lunenburg", "confidence": 60}}),
    ]
    res = run_eval(
        cfg,
        skill="in-context",
        data_dir=fixture_dir,
        limit=1,
        progress=False,
        use_judge=False,
        chat_model=ScriptedChatModel(script),
    )
    t = res.traces[0]
    assert t.status == "answered" and t.em is True, t.errors
    assert t.tool_calls == {"search": 2, "get_context": 2}
    assert "search not allowed yet" in t.steps[0]["error"]
    assert t.steps[3]["error"] is None and t.steps[3]["doc_ids"]  # the fallback search ran
    assert t.evidence_recall is not None
    from kitune.retrieval import create_corpus_store

    assert create_corpus_store(cfg).count() == 144


def test_make_context_fn_hides_disambiguation_kis_and_counts_rewrite_tokens() -> None:
    from kitune.evaluation.agent import Agent
    from kitune.evaluation.tools import in_context_toolbox
    from kitune.retrieval import HashEmbedder, MemoryStore
    from kitune.service.pipelines.evaluation import make_context_fn
    from kitune.testing.store_contract import make_ki

    cfg = KituneConfig()
    store = MemoryStore(HashEmbedder())
    fact = make_ki("LaHave River", "Lunenburg County", docid="100818", predicate="located_in")
    twin = make_ki(
        "LaHave",
        "Lunenburg Municipal District",
        docid="100820",
        predicate="located_in",
        subtype="disambiguation",
    )
    store.upsert([fact, twin])
    plain = make_context_fn(cfg, store, disambiguation=False)("LaHave River located in Lunenburg")
    assert plain.n_results == 1 and plain.doc_ids == ("100818",) and twin.id not in plain.text
    # the facet line counts only the KI shown: not the hidden twin's entities or document
    assert plain.facets.startswith("facets: ") and "100820" not in plain.facets
    assert "municipal" not in plain.facets and "lunenburg-county 1" in plain.facets
    full = make_context_fn(cfg, store, disambiguation=True)("LaHave River located in Lunenburg")
    assert full.n_results == 2 and set(full.doc_ids) == {"100818", "100820"}
    assert "100820 1" in full.facets and "lunenburg-municipal-district 1" in full.facets

    class Rewriter:  # stands in for QueryRewriter: reports 30/7 tokens per rewrite
        def rewrite(self, query, *, size, ledger=None):
            from kitune.schema import QueryPlan

            return type(
                "R",
                (),
                {
                    "plan": QueryPlan.plain(query, size=size),
                    "fell_back": False,
                    "reason": None,
                    "tokens": type("T", (), {"input": 30, "output": 7})(),
                },
            )()

    fn = make_context_fn(cfg, store, disambiguation=True, rewriter=Rewriter())
    assert (fn("LaHave").input_tokens, fn("LaHave").output_tokens) == (30, 7)
    model = ScriptedChatModel(
        [
            json.dumps({"tool": "get_context", "args": {"query": "LaHave River"}}),
            json.dumps({"answer": {"explanation": "", "exact_answer": "x", "confidence": 1}}),
        ],
        usage=(100, 5),
    )
    ep = Agent(model, in_context_toolbox(fn)).run("q")
    assert ep.input_tokens == 200 and ep.tool_input_tokens == 30 and ep.tool_output_tokens == 7
    assert ep.steps[0].tool_input_tokens == 30


# -- failures are failures through `kitune eval` (issue 12 item 11) --------------------------------
def _cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model: ScriptedChatModel):
    import kitune.lm
    from kitune.cli import _register, app

    monkeypatch.setattr(kitune.lm, "LiteLLMChatModel", lambda cfg, role, ledger=None: model)
    monkeypatch.setenv("KITUNE_WORKDIR", str(tmp_path / "w"))
    monkeypatch.setenv("COLUMNS", "250")
    _register()
    return app


def _lunenburg(_messages):
    return json.dumps({"answer": {"explanation": "", "exact_answer": "Lunenburg", "confidence": 50}})


def test_cli_eval_reports_failed_questions_and_excludes_them(
    tmp_path: Path, fixture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kitune.errors import LMTimeoutError

    timeout = LMTimeoutError(
        "m-small at https://gw.example/v1 did not answer within 30 s (3 attempts)", timeout_s=30.0
    )
    app = _cli(monkeypatch, tmp_path, ScriptedChatModel([_lunenburg, timeout, _lunenburg], usage=(40, 4)))
    r = CliRunner().invoke(
        app,
        [
            "eval",
            "--skill",
            "closed-book",
            "--data",
            str(fixture_dir),
            "--limit",
            "3",
            "--concurrency",
            "1",
            "--no-judge",
            "--run-name",
            "cb",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "[1] 43: not graded · 1 step(s), 40 input tokens" in r.stderr
    assert "[2] 94: FAILED (LMTimeoutError: m-small at https://gw.example/v1 did not answer" in r.stderr
    assert "1 of 3 question(s) failed" in r.stdout and "not in the accuracy" in r.stdout
    assert "94: LMTimeoutError:" in r.stdout
    summary = json.loads((tmp_path / "w" / "runs" / "cb" / "summary.json").read_text())
    assert (summary["n_failed"], summary["n_graded"]) == (1, 0)


def test_cli_eval_stops_on_an_auth_failure_with_exit_2(
    tmp_path: Path, fixture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kitune.errors import LMAuthError

    refused = LMAuthError(
        "HTTP 401 from https://gw.example/v1 for model m-small: the key in $KI_GW_KEY (sk-…9876) was "
        "rejected. Check the key and that https://gw.example/v1 is the host you meant. Not retried."
    )
    model = ScriptedChatModel([_lunenburg, refused, _lunenburg, _lunenburg], usage=(40, 4))
    app = _cli(monkeypatch, tmp_path, model)
    r = CliRunner().invoke(
        app,
        [
            "eval",
            "--skill",
            "closed-book",
            "--data",
            str(fixture_dir),
            "--limit",
            "4",
            "--concurrency",
            "1",
            "--no-judge",
            "--run-name",
            "cb",
        ],
    )
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert "authentication failed for the agent on question 94" in out and "$KI_GW_KEY" in out
    assert "2 of 4 question(s) not run" in out
    assert len(model.calls) == 2 and model.remaining == 2  # nothing ran after the refusal
    lines = (tmp_path / "w" / "runs" / "cb" / "traces.jsonl").read_text().splitlines()
    assert [json.loads(x)["status"] for x in lines] == ["answered", "failed"]
