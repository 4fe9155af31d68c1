"""Proposals from unlabelled production traces and their lifecycle, on every embedded store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kitune.config import KituneConfig, LanceStoreConfig
from kitune.errors import ProposalNotFoundError, ProposalStateError, StoreError
from kitune.retrieval.base import Store
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.memory import MemoryStore
from kitune.service.workflows.proposals import ProposalStore, RewriterPrompt, proposal_id, propose
from kitune.service.workflows.review import ReviewService, file_proposals
from kitune.service.workflows.signals import load_signal_traces, signal_report, store_facts
from kitune.testing.review import TableDrafter, gold_evaluator, scenario
from kitune.testing.tracking import RecordingTracker

REWRITER = RewriterPrompt("kitune-corpus-rewriter", "Turn the question into a search query plan.", None)


@pytest.fixture(params=["memory", "lancedb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "memory":
        s: Store = MemoryStore(HashEmbedder())
    else:
        from kitune.retrieval.lance import LanceStore

        s = LanceStore(tmp_path / "lance", HashEmbedder(), config=LanceStoreConfig(table="kis"))
    s.upsert(scenario().kis)
    yield s
    s.close()


def setup(
    tmp_path: Path, store: Store, *, rule: str = "stage", **review: object
) -> tuple[KituneConfig, ReviewService, RecordingTracker]:
    cfg = KituneConfig(workdir=tmp_path / "w", review=review, optimize={"decision_rule": rule})
    tracker = RecordingTracker()
    return cfg, ReviewService(cfg, ProposalStore.of(cfg), store, None, tracker), tracker


def report_for(tmp_path: Path, cfg: KituneConfig, store: Store):  # type: ignore[no-untyped-def]
    path = tmp_path / "prod.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in scenario().chats), encoding="utf-8")
    return signal_report(cfg, load_signal_traces([path]).traces, facts=store_facts(store))


def docs(docid: str):  # type: ignore[no-untyped-def]
    return {d.docid: d for d in scenario().docs}.get(docid)


def test_proposer_files_each_kind_with_evidence_and_diff(tmp_path: Path, store: Store) -> None:
    cfg, _, _ = setup(tmp_path, store)
    sc = scenario()
    paris, (dunant, geneva), (sauvestre,) = sc.kis[0], sc.drafts["d7"], sc.drafts["d8"]
    drafter = TableDrafter(sc.drafts)
    result = propose(
        report_for(tmp_path, cfg, store),
        cfg=cfg,
        store=store,
        held=set(),
        documents=docs,
        draft=drafter,
        extractor_version="extractor@abcd1234",
        rewriter=REWRITER,
    )
    by = {p.kind: p for p in result.proposals}
    assert [p.kind for p in result.proposals] == ["re_extract", "add_ki", "retire_ki", "rewriter_feedback"]
    assert sorted(drafter.calls) == ["d7", "d8"] and result.errors == []
    re = by["re_extract"]
    assert re.change_keys == ["re_extract:d7:extractor@abcd1234"]
    assert re.change["added"] == [dunant.id, geneva.id] and re.change["not_reproduced"] == []
    assert [e["trace_id"] for e in re.evidence] == ["conv-1", "conv-2"]
    assert re.evidence[0]["signals"][1] == {"kind": "fell_back_to_raw", "steps": [3], "detail": "read d7"}
    assert re.diff.splitlines()[0] == f"+ [{dunant.id}] {dunant.title} — {dunant.description}"
    add = by["add_ki"]
    assert add.change_keys == [f"add_ki:{sauvestre.id}"] and add.change["answers"] == ["Stephen Sauvestre"]
    retire = by["retire_ki"]
    assert retire.change["ki_ids"] == [paris.id] and retire.change["counts"] == {
        "shown": 2,
        "unsupported": 2,
        "looped": 0,
    }
    assert [e["trace_id"] for e in retire.evidence] == ["conv-4", "conv-5"]
    fb = by["rewriter_feedback"]
    assert fb.change["queries"] == ["Red Cross founder", "Red Cross city", "Eiffel Tower designer"]
    assert fb.change["new_text"].startswith(REWRITER.text) and '- "Red Cross city"' in fb.change["new_text"]
    assert fb.diff.startswith("--- kitune-corpus-rewriter@packaged\n+++ kitune-corpus-rewriter@proposed\n")
    assert fb.id == proposal_id("rewriter_feedback", fb.change_keys)


def test_approve_applies_and_revert_is_soft(tmp_path: Path, store: Store) -> None:
    cfg, svc, tracker = setup(tmp_path, store)
    sc = scenario()
    sauvestre = sc.drafts["d8"][0]
    paris = sc.kis[0]
    rep = file_proposals(svc, report_for(tmp_path, cfg, store), documents=docs, draft=TableDrafter(sc.drafts))
    assert [p.kind for p in rep.filed] == ["re_extract", "add_ki", "retire_ki"]  # no rewriter given
    add = next(p for p in rep.filed if p.kind == "add_ki")
    done = svc.approve(add.id, reason="looks right")
    assert done.status == "approved" and done.reason == "looks right"
    assert store.get(sauvestre.id).payload.status == "active"
    assert done.applied == {"before": {sauvestre.id: None}}
    reverted = svc.revert(add.id, reason="wrong designer")
    assert reverted.status == "reverted"
    assert store.get(sauvestre.id).payload.status == "expired"  # soft: still there, not served
    retire = next(p for p in rep.filed if p.kind == "retire_ki")
    svc.approve(retire.id)
    assert store.get(paris.id).payload.status == "expired"
    svc.revert(retire.id)
    assert store.get(paris.id).payload.status == "active"
    actions = [e["action"] for e in svc.queue.events(add.id)]
    assert actions == ["filed", "applying", "snapshot", "approved", "reverted"]
    assert tracker.by_name(f"review-{add.id}-approved").params["review.kind"] == "add_ki"
    assert (
        json.loads(tracker.by_name(f"review-{add.id}-reverted").artifacts["review/proposal.json"])["status"]
        == "reverted"
    )
    with pytest.raises(ProposalStateError, match="is reverted"):
        svc.approve(add.id)


def test_rejected_change_is_remembered_and_not_proposed_again(tmp_path: Path, store: Store) -> None:
    cfg, svc, _ = setup(tmp_path, store)
    sc = scenario()
    report = report_for(tmp_path, cfg, store)
    first = file_proposals(svc, report, documents=docs, draft=TableDrafter(sc.drafts))
    retire = next(p for p in first.filed if p.kind == "retire_ki")
    with pytest.raises(ValueError, match="needs a reason"):
        svc.reject(retire.id, reason="  ")
    rejected = svc.reject(retire.id, reason="Paris KI is fine; the questions were off-topic")
    assert rejected.status == "rejected" and rejected.reason.startswith("Paris KI is fine")
    with pytest.raises(ProposalStateError, match="is rejected"):
        svc.approve(retire.id)
    again = file_proposals(svc, report, documents=docs, draft=TableDrafter(sc.drafts))
    assert again.filed == [] and again.proposed.skipped == {
        "already proposed": 2,
        "already proposed or stored": 1,
    }
    assert svc.list(status="rejected") == [svc.queue.get(retire.id)]
    with pytest.raises(ProposalNotFoundError):
        svc.show("p-000000000000")


def test_auto_approved_only_when_the_validation_gate_passes(tmp_path: Path, store: Store) -> None:
    # the old rule by name: on this scenario's 2 labelled questions the stage rule shows nothing (below)
    cfg, svc, _ = setup(tmp_path, store, rule="permissive", auto_approve=["add_ki", "retire_ki"])
    sc = scenario()
    arms: list[str] = []
    rep = file_proposals(
        svc,
        report_for(tmp_path, cfg, store),
        documents=docs,
        draft=TableDrafter(sc.drafts),
        questions=sc.questions,
        evaluate=gold_evaluator(arms),
    )
    add = next(p for p in rep.filed if p.kind == "add_ki")
    retire = next(p for p in rep.filed if p.kind == "retire_ki")
    re = next(p for p in rep.filed if p.kind == "re_extract")
    # adding the Sauvestre KI fixes g1 and breaks nothing: accepted and applied
    assert rep.auto_approved == [add.id]
    assert (
        svc.queue.get(add.id).status == "approved"
        and store.get(sc.drafts["d8"][0].id).payload.status == "active"
    )
    effect = svc.queue.get(add.id).effect or {}
    assert effect["comparison"]["fixed"] == ["g1"] and effect["decision"]["outcome"] == "accepted"
    # retiring the Paris KI breaks g2: the gate refuses, a person decides
    assert rep.gate_refused[retire.id].startswith("rejected: ")
    assert svc.queue.get(retire.id).status == "pending" and store.get(sc.kis[0].id).payload.status == "active"
    # re_extract is not auto-approvable: measured, left pending
    assert svc.queue.get(re.id).status == "pending" and re.id in rep.measured
    assert arms[:2] == [f"{re.id}-current", f"{re.id}-proposal"]


def test_under_the_stage_rule_two_labelled_questions_approve_nothing(tmp_path: Path, store: Store) -> None:
    cfg, svc, _ = setup(tmp_path, store, auto_approve=["add_ki", "retire_ki"])
    sc = scenario()
    rep = file_proposals(
        svc,
        report_for(tmp_path, cfg, store),
        documents=docs,
        draft=TableDrafter(sc.drafts),
        questions=sc.questions,
        evaluate=gold_evaluator([]),
    )
    add = next(p for p in rep.filed if p.kind == "add_ki")
    retire = next(p for p in rep.filed if p.kind == "retire_ki")
    assert rep.auto_approved == [] and svc.queue.get(add.id).status == "pending"
    # fixing 1 of 2 questions shows nothing either way: kept the incumbent, with the test's numbers
    assert rep.gate_refused[add.id].startswith("not_enough_evidence: kept the incumbent: not enough evidence")
    effect = svc.queue.get(add.id).effect or {}
    (change,) = effect["decision"]["changes"]
    # the scenario's questions name no gold document: decided on the answers (g1 fixed, g2 kept)
    assert change["tests_in_round"] == len(rep.filed) and change["test"]["metric"] == "end_to_end_accuracy"
    assert (change["test"]["n"], change["test"]["better"], change["test"]["worse"]) == (2, 1, 0)
    assert change["test"]["p_noninferior"] == pytest.approx(0.81)  # P(Binomial(2, 0.1) ≤ 0)
    assert not rep.gate_refused[retire.id].startswith("accepted")


def test_no_labelled_questions_no_auto_approval(tmp_path: Path, store: Store) -> None:
    cfg, svc, _ = setup(tmp_path, store, auto_approve=["add_ki"])
    rep = file_proposals(
        svc, report_for(tmp_path, cfg, store), documents=docs, draft=TableDrafter(scenario().drafts)
    )
    add = next(p for p in rep.filed if p.kind == "add_ki")
    assert rep.auto_approved == [] and rep.gate_refused == {
        add.id: "no labelled questions to run the validation gate on"
    }
    assert svc.queue.get(add.id).status == "pending"


class _FailingOnce:
    """A store whose first upsert fails (a crash mid-apply), then works."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.failed = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def upsert(self, kis):  # type: ignore[no-untyped-def]
        if not self.failed:
            self.failed = True
            raise StoreError("disk full")
        return self.inner.upsert(kis)


def test_a_failed_apply_resumes_and_reverts_to_the_true_previous_state(tmp_path: Path, store: Store) -> None:
    cfg, _, _ = setup(tmp_path, store)
    flaky = _FailingOnce(store)
    svc = ReviewService(cfg, ProposalStore.of(cfg), flaky, None, None)  # type: ignore[arg-type]
    sc = scenario()
    rep = file_proposals(svc, report_for(tmp_path, cfg, store), documents=docs, draft=TableDrafter(sc.drafts))
    re = next(p for p in rep.filed if p.kind == "re_extract")
    with pytest.raises(StoreError, match="disk full"):
        svc.approve(re.id)
    assert svc.queue.get(re.id).status == "applying"
    done = svc.approve(re.id)
    assert done.status == "approved" and done.applied == {"before": {k.id: None for k in sc.drafts["d7"]}}
    svc.revert(re.id)
    assert [store.get(k.id).payload.status for k in sc.drafts["d7"]] == ["expired", "expired"]


def test_rewriter_feedback_goes_through_the_registry_and_back(tmp_path: Path) -> None:
    from kitune.tracking.prompts import PromptRegistry

    store = MemoryStore(HashEmbedder())
    store.upsert(scenario().kis)
    cfg, _, _ = setup(tmp_path, store)
    registry = PromptRegistry(f"sqlite:///{tmp_path / 'reg.db'}")
    from kitune.programs.instructions import load_instruction

    packaged = load_instruction("rewriter").text
    svc = ReviewService(cfg, ProposalStore.of(cfg), store, registry, None)
    rewriter = RewriterPrompt("kitune-corpus-rewriter", packaged, None)
    rep = file_proposals(svc, report_for(tmp_path, cfg, store), rewriter=rewriter)
    assert [p.kind for p in rep.filed] == ["retire_ki", "rewriter_feedback"]  # no drafter: no KI drafts
    fb = rep.filed[1]
    done = svc.approve(fb.id)
    assert done.applied == {"prompt": "kitune-corpus-rewriter", "from_version": 1, "to_version": 2}
    prod = registry.get("kitune-corpus-rewriter", "production")
    assert prod.version == 2 and prod.text == fb.change["new_text"] and prod.tags["kitune.review"] == fb.id
    svc.revert(fb.id, reason="made plans worse")
    assert registry.get("kitune-corpus-rewriter", "production").version == 1


def test_retire_ki_follows_the_loop_runs_credit_ledger(tmp_path: Path, store: Store) -> None:
    from kitune.optimizers.credit import CreditLedger, KICredit, ShownEpisode
    from kitune.testing.store_contract import make_ki

    cfg, svc, _ = setup(tmp_path, store)
    sc = scenario()
    paris = sc.kis[0]  # the signals alone retire it (2 unsupported episodes, no good one)
    other = make_ki("Lyon", "France", docid="d9", predicate="city_in")  # no trace showed it
    store.upsert([other])
    report = report_for(tmp_path, cfg, store)
    # a ledger that credits paris with more fixes than breaks: the signals' retirement is held back;
    # one that blames `other` for two right → wrong flips: proposed on the ledger's evidence alone
    credit = {
        paris.id: KICredit(paris.id, shown_right=3, harmful=1, helpful=2),
        other.id: KICredit(
            other.id, shown_wrong=2, harmful=2, harmful_in=("it1:validation:q1", "it1:tune:q2")
        ),
    }
    result = propose(report, cfg=cfg, store=store, held=set(), credit=credit)
    retire = [p for p in result.proposals if p.kind == "retire_ki"]
    assert [p.change["ki_ids"] for p in retire] == [[other.id]]
    assert result.skipped["credit: helpful"] == 1
    (p,) = retire
    assert p.title == (
        f"retire {other.id}: the loop's credit ledger blames it for 2 right → wrong flips (0 wrong → right)"
    )
    assert p.change["credit"] == {"shown_right": 0, "shown_wrong": 2, "harmful": 2, "helpful": 0}
    assert [(e["trace_id"], e["answer"]) for e in p.evidence] == [
        ("credit:it1:validation:q1", "right → wrong"),
        ("credit:it1:tune:q2", "right → wrong"),
    ]
    # without a ledger the signals alone decide, as before
    plain = propose(report, cfg=cfg, store=store, held=set())
    assert [p.change["ki_ids"] for p in plain.proposals if p.kind == "retire_ki"] == [[paris.id]]
    # file_proposals reads every loop run's ki_credit.json under <workdir>/optimize by default
    ledger = CreditLedger(cfg.workdir / "optimize" / "run-a" / "ki_credit.json")
    ledger.record_run("r1", [ShownEpisode("q1", True, ()), ShownEpisode("q2", True, ())])
    ledger.record_run("r2", [ShownEpisode("q1", False, (other.id,)), ShownEpisode("q2", False, (other.id,))])
    rep = file_proposals(svc, report)
    assert sorted(p.change["ki_ids"][0] for p in rep.filed if p.kind == "retire_ki") == sorted(
        [paris.id, other.id]
    )


def test_a_ki_change_that_lowers_a_labelled_questions_gold_retrieval_is_rejected(tmp_path: Path) -> None:
    from kitune.data.loaders import Question
    from kitune.evaluation.metrics import Trace
    from kitune.service.workflows.proposals import Proposal
    from kitune.service.workflows.review import measure_effect
    from kitune.testing.store_contract import make_ki

    cfg = KituneConfig(workdir=tmp_path / "w", optimize={"gate_rank_tolerance": 0.0})
    store = MemoryStore(HashEmbedder())
    gold = make_ki("Eiffel Tower", "Stephen Sauvestre", docid="d8", predicate="designed_by")
    store.upsert([gold])
    q = Question("g1", "Who designed the Eiffel Tower?", "Stephen Sauvestre", gold_docids=("d8",))
    # the proposal adds two facts from another document that match the question better
    louder = [
        make_ki(
            "Eiffel Tower",
            f"Gustave Eiffel {i}",
            docid="d9",
            predicate=f"designer_{i}",
            title=f"Who designed the Eiffel Tower? The Eiffel Tower was designed by Gustave Eiffel ({i}).",
        )
        for i in range(2)
    ]
    p = Proposal(
        id="p-test",
        kind="add_ki",
        title="add two facts",
        evidence=[],
        change={"docid": "d9", "kis": [k.model_dump(mode="json") for k in louder], "answers": []},
        diff="",
        change_keys=[f"add_ki:{k.id}" for k in louder],
    )

    def evaluate(questions, kis, rewriter, label):  # type: ignore[no-untyped-def]
        # the answers say the proposal fixed g1: only the retrieval check can refuse it
        right = label.endswith("-proposal")
        answer = "Stephen Sauvestre" if right else "Gustave Eiffel"
        return [
            Trace(
                query_id="g1",
                skill="in-context",
                question=q.query,
                gold_answer=q.answer,
                status="answered",
                exact_answer=answer,
                em=right,
            )
        ]

    effect = measure_effect(cfg, p, [q], store=store, evaluate=evaluate)
    assert effect["comparison"]["fixed"] == ["g1"]
    (drop,) = effect["retrieval"]["drops"]
    assert drop["query_id"] == "g1" and drop["before"] == 1.0 and drop["after"] < 1.0
    assert effect["retrieval"]["checked"] == 1 and effect["retrieval"]["tolerance"] == 0.0
    assert effect["decision"]["outcome"] == "rejected"
    assert effect["decision"]["reason"].startswith("retrieval: g1 gold reciprocal rank 1.00 → ")
    assert store.get(gold.id).payload.status == "active" and len(list(store.iter_kis())) == 1  # a copy
