"""Tests for kitune.optimizers.gate: a feedback KI that breaks a neighbour question is rejected."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from kitune.evaluation.harness import read_traces
from kitune.evaluation.metrics import Trace
from kitune.evaluation.stage_metrics import reciprocal_rank
from kitune.ki import KI
from kitune.optimizers.gate import GateRejection, RankChange, attribute_changes, rank_changes, run_gate
from kitune.schema import QueryPlan
from kitune.testing.store_contract import make_ki
from kitune.text import exact_match

QUESTIONS = {
    "alice": ("Where was Alice Moreau born?", "Paris"),
    "bob": ("Where does Bob Stein live?", "Oslo"),
    "dave": ("Where did Dave Lund study?", "Milan"),
    "erin": ("Where does Erin Falk work?", "Bergen"),
}


class ScriptedWorld:
    """A tiny KI store plus a reader whose answer is the object of the first KI it retrieves.

    Retrieval: active KIs sharing an ``entity:`` tag with the question's plain plan, feedback
    (disambiguation) KIs first, then by id — the reader trusts a feedback fact over a plain one.
    """

    def __init__(self, kis: Sequence[KI]) -> None:
        self.kis = {k.id: k for k in kis}
        self.reruns: list[list[str]] = []

    def write(self, kis: Sequence[KI]) -> None:
        self.kis.update({k.id: k for k in kis})

    def retrieve(self, question: str) -> list[KI]:
        tags = set(QueryPlan.plain(question).entity_tags)
        found = [k for k in self.kis.values() if k.payload.status == "active" and tags & set(k.tags)]
        return sorted(found, key=lambda k: (k.payload.subtype != "disambiguation", k.id))

    def shown(self) -> dict[str, list[str]]:
        return {qid: [k.id for k in self.retrieve(q)] for qid, (q, _gold) in QUESTIONS.items()}

    def answer(self, qid: str) -> Trace:
        question, gold = QUESTIONS[qid]
        found = self.retrieve(question)
        answer = found[0].payload.properties.object if found else ""
        return Trace(
            query_id=qid,
            skill="in-context",
            question=question,
            gold_answer=gold,
            status="answered",
            exact_answer=answer,
            em=exact_match(answer, gold),
        )

    def rerun(self, qids: Sequence[str]) -> list[Trace]:
        self.reruns.append(list(qids))
        return [self.answer(q) for q in qids]

    def retire(self, ki_ids: Sequence[str]) -> int:
        for i in ki_ids:
            self.kis[i].payload.status = "expired"
        return len(ki_ids)


def _world() -> ScriptedWorld:
    return ScriptedWorld(
        [
            make_ki("Alice Moreau", "Lyon", docid="d1", predicate="born_in"),  # the wrong twin
            make_ki("Bob Stein", "Oslo", docid="d2", predicate="lives_in"),
            make_ki("Dave Lund", "Rome", docid="d3", predicate="studied_in"),
            make_ki("Erin Falk", "Bergen", docid="d4", predicate="works_in"),
        ]
    )


def test_a_feedback_ki_that_fixes_its_question_but_breaks_a_neighbour_is_rejected_and_counted() -> None:
    world = _world()
    previous = [world.answer(q) for q in QUESTIONS]
    assert [t.em for t in previous] == [False, True, False, True]  # alice, dave wrong; bob, erin right
    before = world.shown()
    # alice's feedback KI is also indexed under the agent's look-up entity "Bob Stein" (it searched him)
    fb_alice = make_ki(
        "Alice Moreau",
        "Paris",
        docid="d1",
        predicate="born_in",
        subtype="disambiguation",
        tags=["entity:bob-stein"],
    )
    fb_dave = make_ki("Dave Lund", "Milan", docid="d3", predicate="studied_in", subtype="disambiguation")
    world.write([fb_alice, fb_dave])

    report = run_gate(
        [fb_alice.id, fb_dave.id],
        changed=lambda ids: attribute_changes(before, world.shown(), ids),
        rerun=world.rerun,
        previous=previous,
        reject=world.retire,
    )

    assert world.reruns == [["alice", "bob", "dave"]]  # erin's look-ups did not change: not re-run
    assert report.fixed == ("alice", "dave")
    assert report.broken == ("bob",)
    assert report.kept == (fb_dave.id,)
    assert report.rejected == (GateRejection(fb_alice.id, "broke", ("bob",)),)
    assert world.kis[fb_alice.id].payload.status == "expired"  # retired, not deleted
    assert world.answer("bob").em is True  # the neighbour is right again
    assert world.answer("alice").em is False  # and alice's fix went with it
    assert report.to_metrics() == {
        "gate_candidates": 2.0,
        "gate_kept": 1.0,
        "gate_rejected": 1.0,
        "gate_rejected_broke": 1.0,
        "gate_rejected_retrieval": 0.0,
        "gate_rejected_unverified": 0.0,
        "gate_rank_checked": 0.0,
        "gate_rank_drops": 0.0,
        "gate_rerun": 3.0,
        "gate_broken": 1.0,
        "gate_fixed": 2.0,
        "gate_unverified": 0.0,
        "gate_removed": 1.0,
    }
    assert report.to_dict()["rejected"] == [
        {"ki_id": fb_alice.id, "reason": "broke", "query_ids": ["bob"], "detail": "broke: bob"}
    ]


def _t(qid: str, answer: str, *, status: str = "answered", graded: bool = False) -> Trace:
    return Trace(
        query_id=qid,
        skill="in-context",
        question="?",
        gold_answer="g",
        status=status,
        exact_answer=answer,
        em=answer == "g",
        judge_status="grader_error" if graded else "not_run",
    )


def test_conservative_attribution_blames_every_candidate_shown_and_all_when_none_is_named() -> None:
    previous = {q: _t(q, "g") for q in ("q1", "q2", "q3")}
    changed = {"q1": {"a", "b", "not-a-candidate"}, "q2": {"c"}, "q3": set()}
    rejected: list[list[str]] = []

    def reject(ids: Sequence[str]) -> int:
        rejected.append(list(ids))
        return 0

    report = run_gate(
        ["a", "b", "c", "d"],
        changed=lambda _ids: changed,
        rerun=lambda qids: [_t("q1", "x"), _t("q2", "g")],  # q1 broken; q3 missing
        previous=previous,
        reject=reject,
    )
    assert report.broken == ("q1",) and report.unverified == ("q3",)
    # q1 broke: a and b both shown → both rejected; q3 changed with no candidate named and has
    # no verdict → every candidate is blamed (c and d: unverified; a, b already broke)
    assert report.rejected == (
        GateRejection("a", "broke", ("q1",)),
        GateRejection("b", "broke", ("q1",)),
        GateRejection("c", "unverified", ("q3",)),
        GateRejection("d", "unverified", ("q3",)),
    )
    assert report.kept == ()
    assert rejected == [["a", "b", "c", "d"]]
    assert report.removed == 0


def test_no_verdict_only_matters_for_questions_that_were_right() -> None:
    previous = [_t("right", "g"), _t("wrong", "x"), _t("ungraded-before", "g", graded=True)]
    report = run_gate(
        ["k1", "k2"],
        changed=lambda _ids: {"right": {"k1"}, "wrong": {"k2"}, "ungraded-before": {"k2"}, "new": {"k2"}},
        rerun=lambda qids: [
            _t("right", "", status="failed"),  # an outage: no verdict → k1 unverified
            _t("wrong", "", status="failed"),  # was wrong: nothing to protect
            _t("ungraded-before", "x"),  # no previous verdict: cannot be broken
            _t("new", "x"),  # no previous trace: cannot be broken
        ],
        previous=previous,
        reject=lambda ids: len(ids),
    )
    assert report.rejected == (GateRejection("k1", "unverified", ("right",)),)
    assert report.kept == ("k2",)
    assert report.to_metrics()["gate_rejected_unverified"] == 1.0
    assert report.removed == 1


def test_no_candidates_calls_nothing_and_unchanged_questions_are_not_rerun() -> None:
    def boom(*_a: object) -> object:
        raise AssertionError("must not be called")

    empty = run_gate([], changed=boom, rerun=boom, previous=[], reject=boom)  # type: ignore[arg-type]
    assert (empty.kept, empty.rejected, empty.rerun) == ((), (), ())
    quiet = run_gate(["k"], changed=lambda _ids: {}, rerun=boom, previous=[], reject=boom)  # type: ignore[arg-type]
    assert (quiet.kept, quiet.rerun) == (("k",), ())


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ({"q": ["a"]}, {"q": ["a"]}, {}),  # unchanged
        ({"q": ["a"]}, {"q": ["k", "a"]}, {"q": frozenset({"k"})}),  # a candidate appeared
        ({"q": ["a", "b"]}, {"q": ["b", "a"]}, {"q": frozenset()}),  # reordered, nobody named
        ({"q": ["k"]}, {"q": ["k"]}, {"q": frozenset({"k"})}),  # a rewritten candidate shown
        ({"q": ["a"]}, {}, {"q": frozenset()}),  # only before: its results vanished
    ],
)
def test_attribute_changes(
    before: dict[str, list[str]], after: dict[str, list[str]], expected: dict[str, frozenset[str]]
) -> None:
    assert attribute_changes(before, after, ["k"]) == expected


RUN_24 = Path(__file__).resolve().parents[2] / "experiments" / "loop-fixture-24"


def test_gate_replayed_on_loop_fixture_24_rejects_the_two_kis_that_broke_validation() -> None:
    """Iteration 0 of experiments/loop-fixture-24: 8 feedback KIs, then 187 and 9 went right → wrong."""
    if not (RUN_24 / "evals" / "observations.jsonl").is_file():
        pytest.skip(f"committed run not found at {RUN_24}")
    states = ["ffea4be9b8c4cfd8", "8632401159a06710"]  # the store before / after iteration 0's feedback
    shown: dict[str, dict[str, list[str]]] = {s: {} for s in states}
    for line in (RUN_24 / "evals" / "observations.jsonl").read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        if rec["store"] in shown:
            shown[rec["store"]][rec["query_id"]] = [i for c in rec["calls"] for i in c["ki_ids"]]
    traces = {
        s: {t.query_id: t for t in read_traces(RUN_24 / "evals" / f"c41552d3-{s}.jsonl")} for s in states
    }
    ledger = json.loads((RUN_24 / "failure_ledger.json").read_text(encoding="utf-8"))["questions"]
    written = [
        k for e in ledger.values() for fb in e["feedback"] if fb["iteration"] == 0 for k in fb["ki_ids"]
    ]
    report = run_gate(
        written,
        changed=lambda ids: attribute_changes(shown[states[0]], shown[states[1]], ids),
        rerun=lambda qids: [traces[states[1]][q] for q in qids],
        previous=traces[states[0]],
        reject=len,
    )
    # the look-up replay re-ran 9 tuning + 5 validation questions, as the run's log says
    assert len(report.rerun) == 14
    assert report.broken == ("187", "9")
    assert report.fixed == ("199", "43", "47", "58")
    # both KIs shown to question 9 are blamed (conservative); the one that also reached 187 twice over
    assert report.rejected == (
        GateRejection("ki-2d80d86a38cc1be1821a96e7", "broke", ("9",)),
        GateRejection("ki-113576d9264e350ca4a567fc", "broke", ("187", "9")),
    )
    assert (len(written), len(report.kept)) == (8, 6)


# -- the retrieval check (issue 36): a KI must not push a neighbour's gold documents out of the top k
GOLD_DOCS = {"alice": "d1", "bob": "d2", "dave": "d3", "erin": "d4"}


class RankedWorld(ScriptedWorld):
    """:class:`ScriptedWorld` whose look-up keeps the top 5 by a fixed score, feedback KIs first."""

    def __init__(self, kis: Sequence[KI], scores: dict[str, float]) -> None:
        super().__init__(kis)
        self.scores = scores

    def retrieve(self, question: str) -> list[KI]:
        tags = set(QueryPlan.plain(question).entity_tags)
        found = [k for k in self.kis.values() if k.payload.status == "active" and tags & set(k.tags)]
        found.sort(key=lambda k: (k.payload.subtype != "disambiguation", -self.scores.get(k.id, 0.0), k.id))
        return found[:5]

    def ranks(self) -> tuple[dict[str, float], dict[str, list[str]]]:
        """Each question's gold reciprocal rank in the top 5 (the rewriter's stage value), its top-5 ids."""

        found = {qid: self.retrieve(q) for qid, (q, _gold) in QUESTIONS.items()}
        rr = {qid: reciprocal_rank([GOLD_DOCS[qid]], kis, 5) for qid, kis in found.items()}
        return rr, {qid: [k.id for k in kis] for qid, kis in found.items()}


def _ranked_world() -> RankedWorld:
    # bob's gold fact (d2) is 5th of 5 for "Bob Stein": four facts from other documents score higher
    others = [make_ki("Bob Stein", f"fact {i}", docid=f"x{i}", predicate=f"p{i}") for i in range(4)]
    gold = [
        make_ki("Alice Moreau", "Lyon", docid="d1", predicate="born_in"),
        make_ki("Bob Stein", "Oslo", docid="d2", predicate="lives_in"),
        make_ki("Dave Lund", "Rome", docid="d3", predicate="studied_in"),
        make_ki("Erin Falk", "Bergen", docid="d4", predicate="works_in"),
    ]
    scores = {k.id: 1.0 - i / 10 for i, k in enumerate(others)} | {k.id: 0.5 for k in gold}
    return RankedWorld([*others, *gold], scores)


def test_a_feedback_ki_that_drops_a_neighbours_recall_at_5_to_zero_is_rejected_with_its_reason() -> None:
    world = _ranked_world()
    rr_before, _ = world.ranks()
    assert rr_before == {"alice": 1.0, "bob": 0.2, "dave": 1.0, "erin": 1.0}  # bob's gold at rank 5
    # only alice was run end to end (a tuning failure); bob is a validation question measured by its
    # stage metric alone, so the answer check cannot see him
    previous = [world.answer("alice")]
    before = world.shown()
    fb_alice = make_ki(
        "Alice Moreau",
        "Paris",
        docid="d1",
        predicate="born_in",
        subtype="disambiguation",
        tags=["entity:bob-stein"],  # also indexed under the entity of a look-up that searched Bob
    )
    fb_dave = make_ki("Dave Lund", "Milan", docid="d3", predicate="studied_in", subtype="disambiguation")
    world.write([fb_alice, fb_dave])

    def ranks(ids: Sequence[str]) -> list[RankChange]:
        rr_after, top = world.ranks()
        return rank_changes(rr_before, rr_after, top, ids)

    report = run_gate(
        [fb_alice.id, fb_dave.id],
        changed=lambda ids: attribute_changes(before, world.shown(), ids),
        rerun=world.rerun,
        previous=previous,
        reject=world.retire,
        ranks=ranks,
        rank_tolerance=0.5,
        own={fb_alice.id: ["alice"], fb_dave.id: ["dave"]},
    )

    assert report.broken == ()  # no answer broke where one was measured
    assert report.rejected == (GateRejection(fb_alice.id, "retrieval", ("bob",)),)
    assert report.rejected[0].detail == "bob gold reciprocal rank 0.20 → 0.00 (recall lost)"
    assert report.kept == (fb_dave.id,)
    assert report.rank_drops == (RankChange("bob", 0.2, 0.0, frozenset({fb_alice.id})),)
    assert world.kis[fb_alice.id].payload.status == "expired"
    assert world.ranks()[0]["bob"] == 0.2  # retired: bob's gold is back in his top 5
    m = report.to_metrics()
    assert (m["gate_rejected_retrieval"], m["gate_rank_checked"], m["gate_rank_drops"]) == (1.0, 4.0, 1.0)
    assert report.to_dict()["rank_drops"] == [
        {"query_id": "bob", "before": 0.2, "after": 0.0, "shown": [fb_alice.id]}
    ]


@pytest.mark.parametrize(
    ("before", "after", "dropped"),
    [
        (1.0, 0.5, False),  # rank 1 -> 2: a fall of 0.5, not beyond the tolerance
        (1.0, 1 / 3, True),  # rank 1 -> 3
        (0.5, 0.2, False),  # rank 2 -> 5
        (0.2, 0.0, True),  # recall@k lost, however small the fall
        (0.0, 0.0, False),  # nothing to lose
        (0.5, 1.0, False),  # better
    ],
)
def test_rank_drop_rule(before: float, after: float, dropped: bool) -> None:
    assert RankChange("q", before, after).dropped(0.5) is dropped


def test_retrieval_blame_skips_the_kis_own_question_and_blames_all_when_none_is_shown() -> None:
    changes = [
        RankChange("own", 1.0, 0.0, frozenset({"a"})),  # a written for 'own': not blamed there
        RankChange("n1", 1.0, 0.25, frozenset()),  # no candidate in its top k now: every candidate
    ]
    report = run_gate(
        ["a", "b"],
        changed=lambda ids: {},
        rerun=lambda qids: [],
        previous=[],
        reject=lambda ids: len(ids),
        ranks=lambda ids: changes,
        own={"a": ["own"]},
    )
    assert [(r.ki_id, r.reason, r.query_ids) for r in report.rejected] == [
        ("a", "retrieval", ("n1",)),
        ("b", "retrieval", ("n1",)),
    ]
    with pytest.raises(ValueError, match=r"rank_tolerance=1\.5"):
        run_gate(
            ["a"], changed=lambda ids: {}, rerun=lambda q: [], previous=[], reject=len, rank_tolerance=1.5
        )
