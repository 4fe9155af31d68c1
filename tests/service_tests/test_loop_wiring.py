"""Issue 21 in the loop: GEPA on the rewriter by recall@k, the feedback gate, KI credit, sampled questions."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "optimizers_tests"))

from loop_fakes import _fact, agent_turn, disambiguator_rule, extractor_rule, make_deps, write_dataset
from opt_fakes import RuleLM

from kitune.chat import ChatMessage
from kitune.config import KituneConfig
from kitune.data.loaders import Question
from kitune.evaluation.summary import wilson_interval
from kitune.optimizers.credit import ShownEpisode
from kitune.optimizers.ledger import FailureLedger
from kitune.optimizers.loop import Setting, run_loop
from kitune.schema import Document
from kitune.service.pipelines.eval_cache import store_fingerprint
from kitune.service.tuning.loop_env import ServiceLoopEnv
from kitune.service.tuning.optimize import run_optimize
from kitune.service.tuning.options import OptimizeOptions
from kitune.testing.chat import ScriptedChatModel
from kitune.testing.tracking import RecordingTracker

# -- a neighbour a feedback KI can break -----------------------------------------------------------
# qa's first KI ends on "Tower", so the reader answers "Tower" (wrong); the feedback KI written for
# qa ("… The answer is Paris, not Tower.") also ranks first for qb and qc, whose reader then answers
# "Paris": right → wrong. The reader answers from the FIRST KI it is shown (its answer depends on
# what it retrieves).
DOCS = [
    Document(
        docid="d1", title="Alpha Tower", text="Paris is home to the Alpha Tower. It was built long ago."
    ),
    Document(
        docid="d2", title="Alpha Bridge", text="The Alpha Bridge stands in the city of Rome. It is old."
    ),
    Document(docid="d3", title="Gamma", text="Gamma Lake lies near the town of Oslo. It is cold."),
    Document(docid="d4", title="Alpha Gate", text="The Alpha Gate stands in the city of Oslo. It is new."),
    Document(
        docid="d5", title="Alpha Tower works", text="The Alpha Tower was built in the year 1900. It is tall."
    ),
]
QA = Question(
    "qa", "In which city does the Alpha Tower stand?", "Paris", evidence_docids=("d1",), gold_docids=("d1",)
)
QB = Question(
    "qb", "In which city does the Alpha Bridge stand?", "Rome", evidence_docids=("d2",), gold_docids=("d2",)
)
QC = Question(
    "qc", "In which city does the Alpha Gate stand?", "Oslo", evidence_docids=("d4",), gold_docids=("d4",)
)
QT = Question(
    "qt", "In which year was the Alpha Tower built?", "1900", evidence_docids=("d5",), gold_docids=("d5",)
)
DISAMBIGUATOR = "Write a fact that tells the right answer from the wrong one."


def first_sentence_rule(system: str, user: str) -> dict[str, Any]:
    if "[[ ## correct_answer ## ]]" in user:
        return disambiguator_rule(system, user)
    m = re.search(r"\[\[ ## text ## \]\]\n(.*?)(?:\n\n\[\[|\Z)", user, re.S)
    sentences = [s.strip() for s in re.findall(r"[^.]+\.", m.group(1) if m else "")]
    return {"facts": [_fact(sentences[0])]}


def first_ki_reader(messages: list[ChatMessage]) -> str:
    if len(messages) <= 2:
        return json.dumps({"tool": "get_context", "args": {"query": messages[1]["content"]}})
    first = re.search(r"^1\. \[[^\]]+\] (.*?) — ", messages[-1]["content"], re.M)
    title = first.group(1) if first else ""
    said = re.search(r"The answer is (.+?), not", title)
    answer = said.group(1) if said else (title.rstrip(".").split()[-1] if title else "none")
    return json.dumps({"answer": {"explanation": "x", "exact_answer": answer, "confidence": 60}})


def neighbour_env(
    tmp_path: Path,
    *,
    gate: bool,
    validation: tuple[Question, ...] = (QB, QC),
    stores: dict[str, Any] | None = None,
    rank_tolerance: float = 0.5,
    decision_rule: str = "stage",
    **options: Any,
) -> ServiceLoopEnv:
    cfg = KituneConfig(
        workdir=tmp_path / "w",
        corpus_name="tiny",
        # the scripted reader parses the full rendering ("1. [id] title — …")
        agent={"max_steps": 4, "concurrency": 1, "ki_render": "full"},
        optimize={
            "improvers": ["disambiguation"],
            "gate": gate,
            "gate_rank_tolerance": rank_tolerance,
            "decision_rule": decision_rule,
        },
        extraction={"concurrency": 1},
    )
    deps = make_deps(RuleLM(first_sentence_rule), RuleLM(lambda s, u: {}, json=True), stores=stores)
    deps.chat_model = ScriptedChatModel([first_ki_reader] * 400, usage=(100, 10))
    opts = OptimizeOptions(data_dir=tmp_path, programs=("disambiguator",), progress=False, **options)
    questions = [QA, *validation]
    docs = [d for d in DOCS if any(d.docid in q.evidence_docids for q in questions)]
    env = ServiceLoopEnv(cfg, opts, deps, questions=questions, documents=docs, state_dir=tmp_path / "s")
    env.tune, env.validation = [QA], list(validation)
    return env


def test_with_stage_measurement_the_gate_rejects_a_ki_that_lowers_a_neighbours_gold_rank(
    tmp_path: Path,
) -> None:
    # --measure stage --tune-agent: qa runs end to end, validation qt only by its stage metrics, so
    # the answer check cannot see qt; its gold KI (d5) falls from rank 1 to 2 (1.0 → 0.5) behind qa's
    # feedback KI ("In which city does the Alpha Tower stand? …"), beyond a tolerance of 0.25: the
    # retrieval check rejects the KI
    env = neighbour_env(
        tmp_path, gate=True, validation=(QT,), rank_tolerance=0.25, measure="stage", tune_agent=True
    )
    setting = Setting({"disambiguator": DISAMBIGUATOR})
    tune = env.evaluate(setting, "tune")
    val = env.evaluate(setting, "validation")
    assert [t.query_id for t in tune.traces] == ["qa"] and val.traces == ()
    assert val.stages is not None and val.stages.values("rewriter", "mrr") == {"qt": 1.0}
    proposal = env.improve(setting, tune, 0, ledger=FailureLedger())
    m = proposal.metrics
    assert (m["feedback_written"], m["gate_rejected"], m["gate_rejected_retrieval"]) == (1.0, 1.0, 1.0)
    assert m["gate_broken"] == 0.0 and m["gate_rank_drops"] == 1.0
    gate = proposal.notes["gate"]
    (ki_id,) = gate["candidates"]
    assert gate["rejected"] == [
        {
            "ki_id": ki_id,
            "reason": "retrieval",
            "query_ids": ["qt"],
            "detail": "qt gold reciprocal rank 1.00 → 0.50",
        }
    ]
    assert gate["rank_drops"] == [{"query_id": "qt", "before": 1.0, "after": 0.5, "shown": [ki_id]}]
    assert env.store_for(setting).get(ki_id).payload.status == "expired"
    assert env.lookup(setting, QT.query).kis[0].evidence_doc_ids == ["d5"]  # qt's gold is first again


def test_the_gate_rejects_a_feedback_ki_that_breaks_a_neighbour_and_retires_it(tmp_path: Path) -> None:
    stores: dict[str, Any] = {}
    env = neighbour_env(tmp_path, gate=True, validation=(QB,), stores=stores)
    setting = Setting({"disambiguator": DISAMBIGUATOR})
    tune = env.evaluate(setting, "tune")
    val = env.evaluate(setting, "validation")
    assert [t.exact_answer for t in tune.traces] == ["Tower"]
    assert [t.exact_answer for t in val.traces] == ["Rome"]
    ledger = FailureLedger()
    ledger.record(0, "tune", tune.traces, gold_docids=tune.gold_docids, retrieved=tune.retrieved)
    proposal = env.improve(setting, tune, 0, ledger=ledger)
    m = proposal.metrics
    assert m["feedback_written"] == 1.0
    assert (m["gate_candidates"], m["gate_kept"], m["gate_rejected"], m["gate_rejected_broke"]) == (
        1.0,
        0.0,
        1.0,
        1.0,
    )
    assert (m["gate_rerun"], m["gate_broken"], m["gate_fixed"], m["gate_removed"]) == (2.0, 1.0, 1.0, 1.0)
    gate = proposal.notes["gate"]
    (ki_id,) = gate["candidates"]
    assert gate["rejected"] == [
        {"ki_id": ki_id, "reason": "broke", "query_ids": ["qb"], "detail": "broke: qb"}
    ]
    assert gate["broken"] == ["qb"] and gate["fixed"] == ["qa"] and gate["rerun"] == ["qa", "qb"]
    # the retrieval check compared both questions: qb's gold fell from rank 1 to 2, within the tolerance
    assert (m["gate_rank_checked"], m["gate_rank_drops"], m["gate_rejected_retrieval"]) == (2.0, 0.0, 0.0)
    # retired through its status, not deleted; not served any more
    store = env.store_for(setting)
    assert store.get(ki_id).payload.status == "expired"
    assert ki_id not in [k.id for k in env.lookup(setting, QB.query).kis]
    # the ledger's attempt says the gate rejected it and which question it broke
    (attempt,) = ledger.entries["qa"]["feedback"]
    assert attempt["ki_ids"] == [ki_id] and attempt["gate"] == "broke" and attempt["gate_broke"] == ["qb"]
    assert ledger.feedback_summary()["gate_rejected"] == 1
    assert "gate broke: qb" in ledger.to_markdown()
    # the flips after the gate: the store is back to what it was, qa's trace before the KI is reused
    assert m["flips_fixed"] == 0.0 and m["flips_still_wrong"] == 1.0
    # a resumed process extracts again, which refreshes feedback KIs; the rejected one stays retired
    assert json.loads((tmp_path / "s" / "retired_kis.json").read_text(encoding="utf-8")) == {ki_id: "gate"}
    again = neighbour_env(tmp_path, gate=True, validation=(QB,), stores=stores)
    again.evaluate(
        setting, "tune"
    )  # extracts qa's d1 again: refresh_derived re-sights the KI (d1 is its evidence)
    assert store.get(ki_id).payload.status == "expired"
    assert [t.exact_answer for t in again.evaluate(setting, "validation").traces] == ["Rome"]


def test_without_the_gate_credit_retires_the_ki_that_broke_two_questions(tmp_path: Path) -> None:
    # no gate and no decision on the batch (the permissive rule): only the credit ledger can catch it
    env = neighbour_env(tmp_path, gate=False, decision_rule="permissive")
    tracker = RecordingTracker()
    res = run_loop(
        env,
        Setting({"disambiguator": DISAMBIGUATOR}),
        iterations=2,
        state_dir=tmp_path / "s",
        tracker=tracker,
        decision_rule="permissive",
    )
    first, second = res.history
    assert first.improve["feedback_written"] == 1.0 and first.gate == {}
    assert second.flips["validation"] == {"fixed": [], "broken": ["qb", "qc"]}
    # KIs shown: the 4 extracted ones, then the feedback KI; it was shown to qa (right) and, newly,
    # to qb and qc (right → wrong): harmful 2 ⇒ retire
    assert first.credit == {
        "runs": 2,
        "kis": 3,
        "harmful": 0,
        "helpful": 0,
        "demoted": 0,
        "retire": 0,
        "retired": 0,
    }
    assert second.credit == {
        "runs": 4,
        "kis": 4,
        "harmful": 1,
        "helpful": 3,  # qa went wrong → right with the feedback KI and two others newly shown
        "demoted": 0,
        "retire": 1,
        "retired": 1,
    }
    ledger = json.loads((tmp_path / "s" / "ki_credit.json").read_text(encoding="utf-8"))
    (ki_id,) = ledger["retired"]
    c = ledger["kis"][ki_id]
    assert (c["shown_right"], c["shown_wrong"], c["harmful"]) == (1, 2, 2)
    assert c["harmful_in"] == ["it1:validation:qb", "it1:validation:qc"]
    assert c["helpful_in"] == ["it1:tune:qa"]  # it fixed its own question: 2 broken > 1 fixed, retired
    assert env.store_for(Setting({"disambiguator": DISAMBIGUATOR})).get(ki_id).payload.status == "expired"
    assert tracker.by_name("iteration-1").metrics["credit_retired"] == 1.0
    # wall time per step, recorded and logged
    assert list(second.timings) == ["measure_s", "improve_s", "revalidate_s", "candidate_s", "total_s"]
    assert second.timings["total_s"] >= second.timings["measure_s"] >= 0.0
    assert tracker.by_name("iteration-1").metrics["time_total_s"] >= 0.0
    # once retired, the candidate's validation run is back to the traces before the KI (reused, not re-run)
    assert second.candidate_val_accuracy == 1.0
    curves = (tmp_path / "s" / "curves.md").read_text(encoding="utf-8")
    assert "| 1 | - | - | - | - | 1 harmful, 0 demoted, 1 retired of 4 |" in curves


def test_with_the_gate_the_loop_counts_the_rejection_in_metrics_records_and_reports(tmp_path: Path) -> None:
    env = neighbour_env(tmp_path, gate=True)
    tracker = RecordingTracker()
    res = run_loop(
        env,
        Setting({"disambiguator": DISAMBIGUATOR}),
        iterations=1,
        state_dir=tmp_path / "s",
        tracker=tracker,
    )
    (rec,) = res.history
    (ki_id,) = rec.gate["candidates"]
    assert rec.gate["rejected"] == [
        {"ki_id": ki_id, "reason": "broke", "query_ids": ["qb", "qc"], "detail": "broke: qb, qc"}
    ]
    assert rec.improve["gate_rejected"] == 1.0
    m = tracker.by_name("iteration-0").metrics
    assert m["improve_gate_rejected"] == 1.0 and m["improve_gate_broken"] == 2.0
    assert m["ledger_gate_rejected"] == 1.0
    state = json.loads((tmp_path / "s" / "loop_state.json").read_text(encoding="utf-8"))
    assert state["history"][0]["gate"]["rejected"][0]["query_ids"] == ["qb", "qc"]
    curves = (tmp_path / "s" / "curves.md").read_text(encoding="utf-8")
    assert f"| 0 | 1 | 0 | {ki_id} (broke: qb, qc) | 3 |" in curves
    proposal = (tmp_path / "s" / "proposals" / "iteration-0.md").read_text(encoding="utf-8")
    assert f"- rejected {ki_id} (broke: qb, qc)" in proposal
    # validation was not hurt: the rejected KI is retired, the current setting is re-measured as before
    assert rec.val_after_accuracy == 1.0
    # stage metrics for both splits, with their intervals, in MLflow and in the record
    low, high = wilson_interval(2, 2)
    assert (
        m["val_stage_extractor_answer_coverage"] == 1.0 and m["val_stage_extractor_answer_coverage_n"] == 2.0
    )
    assert (
        m["val_stage_extractor_answer_coverage_ci_low"],
        m["val_stage_extractor_answer_coverage_ci_high"],
    ) == (
        low,
        high,
    )
    assert m["tune_stage_rewriter_recall_at_k"] == 1.0 and m["tune_stage_extractor_grounding_rate"] == 1.0
    assert [x["name"] for x in rec.stages["validation"]] == [
        "answer_coverage",
        "evidence_coverage",
        "grounding_rate",
        "ki_tokens_per_doc",
        "recall_at_k",
        "mrr",
    ]
    assert "| 0 validation | 2/2 = 100.0% [34.2%–100.0%]" in curves


def test_demoted_kis_rank_lower_and_change_the_store_state(tmp_path: Path) -> None:
    env = neighbour_env(tmp_path, gate=False, validation=(QB,))
    setting = Setting({"disambiguator": DISAMBIGUATOR})
    env.evaluate(setting, "tune")
    env.evaluate(setting, "validation")
    before = [k.id for k in env.lookup(setting, QB.query).kis]
    top = before[0]
    content = store_fingerprint(env.store_for(setting))
    assert env.store_state(setting) == content  # no penalty yet: the plain content fingerprint
    # harmful once, shown wrong more than right ⇒ demoted (score × 0.5)
    env.credit.record_run("a", [ShownEpisode("qx", True, ())])
    env.credit.record_run("b", [ShownEpisode("qx", False, (top,)), ShownEpisode("qy", False, (top,))])
    assert env.credit.penalties() == {top: 0.5}
    after = [k.id for k in env.lookup(setting, QB.query).kis]
    assert after != before and after.index(top) > 0 and sorted(after) == sorted(before)
    assert env.store_state(setting) != content  # cached evaluations are not reused blindly
    rendered = env.context_fn(setting)(QB.query).text
    assert not rendered.startswith(f"1. [{top}]")


def test_route_feedback_keeps_blank_answers_from_the_disambiguator() -> None:
    from kitune.optimizers.feedback import Failure
    from kitune.optimizers.improvers.disambiguation import route_feedback

    failures = [
        Failure("1", "q", "Paris", "", ("d1",)),
        Failure("2", "q", "Paris", "Lyon", ("d1",)),
        Failure("3", "q", "Paris", "", ("d1",)),
        Failure("4", "q", "1889", "1890", ("d1",)),
    ]
    kinds = {"1": "out_of_budget", "2": "wrong_entity", "3": "no_candidate", "4": "wrong_number"}
    routed, skipped = route_feedback(failures, kinds, None, max_attempts=2)
    assert [f.query_id for f in routed] == ["2", "4"]
    assert skipped == {"out_of_budget": 1, "no_candidate": 1}


# -- GEPA on the rewriter: one rewrite + get_context per metric call, no agent episode -----------------


def rewriter_rule(system: str, user: str) -> dict[str, Any]:
    """With TITLES in the instruction the plan searches the question; otherwise unrelated words."""
    if "[[ ## question ## ]]" in user:
        q = re.search(r"\[\[ ## question ## \]\]\n(.*?)\n", user)
        text = q.group(1) if q and "TITLES" in system else "unrelated pebble words"
        return {"plan": {"entity_tags": [], "lexical": text, "semantic": text}}
    return extractor_rule(system, user)


@pytest.mark.parametrize("rule", ["permissive", "stage"])
def test_gepa_on_the_rewriter_scores_recall_without_running_the_agent(tmp_path: Path, rule: str) -> None:
    data = write_dataset(tmp_path / "data")
    cfg = KituneConfig(
        workdir=tmp_path / "w",
        corpus_name="tiny",
        agent={"max_steps": 4, "concurrency": 1},
        retrieval={"default_size": 1},
        optimize={"seed": 0, "improvers": ["prompts"], "min_proposals": 1, "decision_rule": rule},
        extraction={"concurrency": 1},
    )
    reflection = RuleLM(
        lambda s, u: {"new_instruction": "Plan look-ups that name the question's TITLES."}, json=True
    )
    deps = make_deps(RuleLM(rewriter_rule), reflection)
    deps.chat_model = ScriptedChatModel([agent_turn] * 100, usage=(200, 20))
    opts = OptimizeOptions(
        data_dir=data, iterations=1, programs=("rewriter",), distractors=0, feedback=False, progress=False
    )
    tracker = RecordingTracker()
    lines: list[str] = []
    res = run_optimize(cfg, opts, deps=deps, tracker=tracker, log=lines.append)
    (rec,) = res.loop.history
    m = tracker.by_name("iteration-0").metrics
    if rule == "stage":  # the power table is printed before the run; 2 questions cannot decide anything
        assert (
            "| rewriter prompt | rewriter_mrr | 2 | 0.370 (prior) | 0.0500 | 0.651 (no decision possible) |"
            in lines
        )
        assert any(x.startswith("warning: rewriter prompt: the split is too small") for x in lines)
    # 2 tuning questions = the Pareto set; budget min_metric_calls(2, 2, 1) = 3 starts one proposal:
    # seed 2 + parent 2 + child 2 (minibatch of the 1 question missed, padded) + the child's valset 2
    assert m["improve_rewriter_examples"] == 2.0 and m["improve_rewriter_imperfect"] == 1.0
    assert m["improve_rewriter_metric_calls"] == 8.0 and m["improve_rewriter_proposals"] == 1.0
    assert (m["improve_rewriter_baseline_score"], m["improve_rewriter_best_score"]) == (0.5, 1.0)
    if rule == "permissive":
        assert "TITLES" in res.loop.setting.prompts["rewriter"] and rec.accepted
    else:  # both validation questions better (reciprocal rank 0 → 1): p = 1/4, too few to accept
        assert rec.decision == "not_enough_evidence" and "TITLES" not in res.loop.setting.prompts["rewriter"]
        (d,) = rec.decisions
        assert (d["test"]["metric"], d["test"]["n"], d["test"]["better"]) == ("rewriter_mrr", 2, 2)
        assert d["test"]["p_better"] == 0.25 and m["decision_rewriter_not_enough_evidence"] == 1.0
        saved = [
            json.loads(f.read_text()) for f in (tmp_path / "w" / "optimize").rglob("stages-*-validation.json")
        ]
        # the current setting and the candidate, each with every question's values
        assert sorted(v for s in saved for v in s["per_question"]["rewriter_mrr"].values()) == [
            0.0,
            0.0,
            1.0,
            1.0,
        ]
    # agent episodes: tuning 2 + validation 2 + the candidate on validation 2, 2 turns each; GEPA ran none
    assert 100 - deps.chat_model.remaining == 12
    assert (m["val_stage_rewriter_recall_at_k"], m["candidate_val_stage_rewriter_recall_at_k"]) == (0.0, 1.0)


def test_a_seeded_sample_is_recorded_with_its_split(tmp_path: Path) -> None:
    from kitune.service.tuning.slicing import sample_questions

    qs = [Question(f"q{i}", "x", "a") for i in range(10)]
    picked = [q.query_id for q in sample_questions(qs, 4, 7)]
    assert picked == [q.query_id for q in sample_questions(qs, 4, 7)]  # same seed, same sample
    assert picked != ["q0", "q1", "q2", "q3"] and len(picked) == 4
    assert [q.query_id for q in sample_questions(qs, 4, None)] == ["q0", "q1", "q2", "q3"]
    assert picked == sorted(picked, key=lambda i: int(i[1:]))  # dataset order kept


@pytest.mark.parametrize("sample_seed", [None, 3])
def test_extract_only_extracts_the_slice_and_writes_the_question_ids(
    tmp_path: Path, sample_seed: int | None
) -> None:
    from kitune.service.tuning.optimize import extract_slice

    data = write_dataset(tmp_path / "data")
    cfg = KituneConfig(workdir=tmp_path / "w", corpus_name="tiny", extraction={"concurrency": 1})
    lm = RuleLM(extractor_rule)
    stores: dict[str, Any] = {}
    deps = make_deps(lm, RuleLM(lambda s, u: {}, json=True), stores=stores)
    opts = OptimizeOptions(data_dir=data, questions=3, sample_seed=sample_seed, distractors=1, progress=False)
    first = extract_slice(cfg, opts, deps=deps, registry=None)
    assert first.documents == 4 and first.metrics["extract_docs_done"] == 4.0 and lm.calls == 4
    again = extract_slice(cfg, opts, deps=deps, registry=None)
    assert again.metrics["extract_docs_done"] == 0.0 and again.metrics["extract_docs_skipped"] == 4.0
    assert lm.calls == 4  # resumed: nothing extracted twice
    ids = json.loads((first.state_dir / "questions.json").read_text(encoding="utf-8"))
    assert ids["sample_seed"] == sample_seed and ids["questions_in_dataset"] == 4 and ids["n"] == 3
    assert sorted(ids["tune"] + ids["validation"]) == sorted(first.tune_ids + first.validation_ids)
    expected = ["q1", "q2", "q3"] if sample_seed is None else None
    if expected is not None:
        assert sorted(ids["tune"] + ids["validation"]) == expected
    (table,) = stores  # the loop's own table for this extractor version: one KI per document
    assert table.endswith(first.prompt_version.split("@")[1]) and len(list(stores[table].iter_kis())) == 4


def test_kitune_optimize_extract_only_with_a_sample_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    import kitune.service.tuning.optimize as optimize_service
    from kitune.cli import _register, app

    data = write_dataset(tmp_path / "data")
    cfg_path = tmp_path / "k.yaml"
    cfg_path.write_text(
        f"workdir: {tmp_path / 'w'}\ncorpus_name: tiny\nembedder: {{type: hash}}\n"
        "extraction: {concurrency: 1}\n"
    )
    deps = make_deps(RuleLM(extractor_rule), RuleLM(lambda s, u: {}, json=True))
    monkeypatch.setattr(optimize_service, "default_deps", lambda cfg, ledger, corpus_store=None: deps)
    _register()
    args = ["optimize", "--data", str(data), "-c", str(cfg_path), "--questions", "2", "--sample-seed", "5"]
    res = CliRunner().invoke(app, [*args, "--extract-only", "--distractors", "0", "--run-name", "dev"])
    assert res.exit_code == 0, res.output
    assert "2 done, 0 failed, 0 skipped, 2 KIs written" in res.output
    ids = json.loads((tmp_path / "w" / "optimize" / "dev" / "questions.json").read_text(encoding="utf-8"))
    from kitune.data.loaders import load_questions
    from kitune.service.tuning.slicing import sample_questions

    expected = [q.query_id for q in sample_questions(load_questions(data), 2, 5)]
    assert sorted(ids["tune"] + ids["validation"]) == sorted(expected) and ids["sample_seed"] == 5
    assert len(ids["tune"]) == len(ids["validation"]) == 1


@pytest.mark.parametrize("with_log", [True, False])
def test_the_reflection_fallback_warning_is_said_once(
    tmp_path: Path, with_log: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # kitune demo printed it twice: through its log callback and through the logging module
    cfg = KituneConfig(workdir=tmp_path / "w", corpus_name="tiny")
    deps = make_deps(RuleLM(first_sentence_rule), RuleLM(lambda s, u: {}, json=True))
    opts = OptimizeOptions(data_dir=tmp_path, programs=("extractor",), progress=False)
    lines: list[str] = []
    with caplog.at_level("WARNING", logger="kitune"):
        env = ServiceLoopEnv(
            cfg,
            opts,
            deps,
            questions=[QA, QB],
            documents=DOCS,
            state_dir=tmp_path / "s",
            log=lines.append if with_log else None,
        )
    note = env.reflection_note
    assert note is not None and note.startswith("no reflection model configured")
    said = [*lines, *(r.getMessage() for r in caplog.records)]
    assert said == ([f"[yellow]warning: {note}[/]"] if with_log else [note])
