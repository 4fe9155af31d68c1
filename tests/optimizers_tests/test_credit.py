"""Tests for kitune.optimizers.credit: helpful/harmful counters per KI, demotion and retirement."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from kitune.evaluation.harness import read_traces
from kitune.evaluation.metrics import Trace
from kitune.optimizers.credit import (
    DEMOTE_FACTOR,
    CreditLedger,
    KICredit,
    ShownEpisode,
    credit_verdict,
    demote_ranked,
    episodes_from_traces,
    load_run_credit,
    rank_factor,
    retire_kis,
)
from kitune.retrieval.memory import MemoryStore
from kitune.schema import Filter, QueryPlan
from kitune.testing.store_contract import make_ki


def _ep(qid: str, correct: bool | None, *ids: str) -> ShownEpisode:
    return ShownEpisode(qid, correct, ids)


def test_counts_accumulate_across_two_runs_and_a_run_id_counts_once(tmp_path: Path) -> None:
    path = tmp_path / "credit" / "ki_credit.json"
    ledger = CreditLedger(path)
    assert ledger.record_run("loop:it0:tune", [_ep("q1", True, "a", "b", "a"), _ep("q2", False, "a")])
    assert (ledger.credit("a"), ledger.credit("b")) == (
        KICredit("a", shown_right=1, shown_wrong=1),  # "a" twice in one episode counts once
        KICredit("b", shown_right=1),
    )
    # resumed from disk: the same run id again changes nothing, a new run adds
    again = CreditLedger(path)
    assert again.record_run("loop:it0:tune", [_ep("q1", True, "a", "b")]) is False
    assert again.record_run("loop:it1:tune", [_ep("q1", True, "a"), _ep("q2", True, "a", "b")])
    assert again.credit("a") == KICredit("a", shown_right=3, shown_wrong=1)
    # q2 went wrong → right when "b" appeared in its retrieval: helpful
    assert again.credit("b") == KICredit("b", shown_right=2, helpful=1, helpful_in=("loop:it1:tune:q2",))
    assert again.credit("never") == KICredit("never")
    reread = CreditLedger(path)
    assert reread.run_ids == ["loop:it0:tune", "loop:it1:tune"]
    assert reread.kis == again.kis
    assert json.loads(path.read_text(encoding="utf-8"))["runs"][1] == {
        "id": "loop:it1:tune",
        "episodes": 2,
        "counted": 2,
    }
    assert not path.with_name("ki_credit.json.tmp").exists()


def test_harmful_blames_only_kis_that_appeared_when_the_question_flipped_right_to_wrong() -> None:
    ledger = CreditLedger()
    ledger.record_run("r1", [_ep("q1", True, "a"), _ep("q2", True, "a", "b"), _ep("q3", False, "x")])
    ledger.record_run(
        "r2",
        [
            _ep("q1", False, "a", "c"),  # flipped; "c" appeared → harmful, "a" was there before
            _ep("q2", False, "a", "b"),  # flipped, but nothing new: nobody blamed
            _ep("q3", False, "x", "c"),  # wrong before and after: not a flip
            _ep("q4", False, "c"),  # first measurement: not a flip
        ],
    )
    assert ledger.credit("c") == KICredit("c", shown_right=0, shown_wrong=3, harmful=1, harmful_in=("r2:q1",))
    assert ledger.credit("a").harmful == 0
    assert ledger.credit("b").harmful == 0
    assert credit_verdict(ledger.credit("c")) == "demote"
    assert ledger.penalties() == {"c": DEMOTE_FACTOR}


def test_failed_or_ungraded_episodes_are_not_counted_and_keep_the_last_verdict() -> None:
    ledger = CreditLedger()
    ledger.record_run("r1", [_ep("q1", True, "a")])
    ledger.record_run("r2", [_ep("q1", None, "a", "c")])  # an outage: skipped entirely
    ledger.record_run("r3", [_ep("q1", False, "a", "c")])  # compared with r1 (right): "c" appeared
    assert ledger.credit("c") == KICredit("c", shown_wrong=1, harmful=1, harmful_in=("r3:q1",))
    assert ledger.runs[1] == {"id": "r2", "episodes": 1, "counted": 0}


def test_demote_then_retire_exactly_as_documented() -> None:
    ledger = CreditLedger()
    ledger.record_run("r1", [_ep("q1", True, "a"), _ep("q2", True, "n")])
    ledger.record_run("r2", [_ep("q1", False, "a", "n"), _ep("q2", True, "n")])
    # "n": harmful 1 but shown right 2 > wrong 1 → keep (demotion needs more wrong than right)
    assert ledger.credit("n") == KICredit("n", shown_right=2, shown_wrong=1, harmful=1, harmful_in=("r2:q1",))
    assert ledger.verdicts()["n"] == "keep"
    ledger.record_run("r3", [_ep("q1", True, "a")])  # "n" gone from q1's retrieval
    ledger.record_run("r4", [_ep("q1", False, "a", "n")])  # ... and back: blamed again
    assert ledger.credit("n").harmful == 2
    assert ledger.verdicts()["n"] == "retire"
    assert ledger.penalties() == {"n": 0.0}
    assert ledger.to_retire() == ["n"]
    ledger.mark_retired(["n", "n"])
    assert (ledger.to_retire(), ledger.retired) == ([], ["n"])
    assert ledger.summary() == {
        "runs": 4,
        "kis": 2,
        "harmful": 1,
        "helpful": 0,
        "demoted": 0,
        "retire": 1,
        "retired": 1,
    }
    assert ledger.to_metrics()["credit_retire"] == 1.0


def test_credit_verdict_boundaries() -> None:
    assert credit_verdict(KICredit("k", shown_right=0, shown_wrong=9, harmful=0)) == "keep"
    assert credit_verdict(KICredit("k", shown_right=3, shown_wrong=3, harmful=1)) == "keep"
    assert credit_verdict(KICredit("k", shown_right=3, shown_wrong=4, harmful=1)) == "demote"
    assert credit_verdict(KICredit("k", shown_right=9, shown_wrong=0, harmful=2)) == "retire"
    assert [rank_factor(v) for v in ("keep", "demote", "retire")] == [1.0, 0.5, 0.0]


@dataclass(frozen=True)
class _Item:
    id: str
    score: float


def test_demote_ranked_multiplies_scores_keeps_ties_and_drops_retired() -> None:
    items = [_Item("a", 0.9), _Item("b", 0.6), _Item("c", 0.45), _Item("d", 0.3), _Item("e", 0.2)]
    penalties = {"a": 0.5, "d": 0.0}
    out = demote_ranked(items, penalties, id_of=lambda i: i.id, score_of=lambda i: i.score)
    # a: 0.45 ties with c (0.45): input order decides (a before c); d retired
    assert [i.id for i in out] == ["b", "a", "c", "e"]
    assert out[1] is items[0]  # items are returned, not rebuilt
    positional = demote_ranked(items, {"a": 0.5}, id_of=lambda i: i.id)  # scores 1, 1/2, 1/3 …
    assert [i.id for i in positional] == ["a", "b", "c", "d", "e"]  # 0.5 ties with b: input order
    assert [i.id for i in demote_ranked(items, {"a": 0.3}, id_of=lambda i: i.id)] == ["b", "c", "a", "d", "e"]
    with pytest.raises(ValueError, match="negative"):
        demote_ranked([_Item("x", -1.0)], {}, id_of=lambda i: i.id, score_of=lambda i: i.score)


def test_retire_kis_sets_status_and_never_deletes() -> None:
    store = MemoryStore()
    bad, good = make_ki("Harwick", "Sweden", docid="d1"), make_ki("Harwick", "Norway", docid="d2")
    store.upsert([bad, good])
    assert retire_kis(store, [bad.id, bad.id, "ki-unknown"]) == 1
    assert store.get(bad.id).payload.status == "expired"
    assert store.count(Filter(statuses=())) == 2  # still stored
    served = [h.ki.id for h in store.search(QueryPlan.plain("Harwick", size=10)).hits]
    assert served == [good.id]
    assert retire_kis(store, [bad.id]) == 0  # idempotent


def test_markdown_table_lists_harmful_kis_most_severe_first() -> None:
    ledger = CreditLedger()
    ledger.record_run("r1", [_ep("q1", True), _ep("q2", True)])
    ledger.record_run("r2", [_ep("q1", False, "x"), _ep("q2", False, "y")])
    ledger.record_run("r3", [_ep("q1", True)])
    ledger.record_run("r4", [_ep("q1", False, "x")])
    assert ledger.to_markdown() == (
        "2 KIs credited over 4 runs: 2 with a harmful record, 1 demoted, 1 to retire (0 retired).\n"
        "\n"
        "| KI | shown right | shown wrong | harmful | helpful | verdict | flipped (run:question) |\n"
        "|---|---|---|---|---|---|---|\n"
        "| x | 0 | 2 | 2 | 0 | retire | r2:q1, r4:q1 |\n"
        "| y | 0 | 1 | 1 | 0 | demote | r2:q2 |\n"
    )
    assert ledger.to_markdown(limit=1).splitlines()[-1] == "| … 1 more | | | | | | |"


def test_bad_input_is_refused_with_the_fix(tmp_path: Path) -> None:
    ledger = CreditLedger()
    with pytest.raises(ValueError, match="run_id is blank"):
        ledger.record_run(" ", [])
    with pytest.raises(ValueError, match="query id twice"):
        ledger.record_run("r", [_ep("q1", True), _ep("q1", False)])
    assert ledger.run_ids == []
    broken = tmp_path / "ki_credit.json"
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="not a KI credit ledger"):
        CreditLedger(broken)


def test_episodes_from_traces_reads_correctness_and_the_shown_ids() -> None:
    def t(qid: str, **kw: object) -> Trace:
        return Trace(query_id=qid, skill="in-context", question="?", gold_answer="g", **kw)  # type: ignore[arg-type]

    traces = [
        t("1", status="answered", judge_status="graded", judge_correct=True),
        t("2", status="answered", judge_status="graded", judge_correct=False),
        t("3", status="failed", failure="LMTimeoutError: slow"),
        t("4", status="answered", judge_status="grader_error"),
        t("5", status="answered", em=True),  # ungraded: exact match decides
    ]
    eps = episodes_from_traces(traces, {"1": ["a", "b"], "2": ("c",)})
    assert eps == [
        ShownEpisode("1", True, ("a", "b")),
        ShownEpisode("2", False, ("c",)),
        ShownEpisode("3", None, ()),
        ShownEpisode("4", None, ()),
        ShownEpisode("5", True, ()),
    ]


RUN_24 = Path(__file__).resolve().parents[2] / "experiments" / "loop-fixture-24"


def test_credit_replayed_on_loop_fixture_24_retires_the_ki_behind_both_validation_breaks() -> None:
    """Three store states of experiments/loop-fixture-24, each split one run, in loop order."""
    if not (RUN_24 / "evals" / "observations.jsonl").is_file():
        pytest.skip(f"committed run not found at {RUN_24}")
    states = ["ffea4be9b8c4cfd8", "8632401159a06710", "656f74ffb8f6447f"]
    shown: dict[tuple[str, str], list[str]] = {}
    for line in (RUN_24 / "evals" / "observations.jsonl").read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        shown[(rec["store"], rec["query_id"])] = [i for c in rec["calls"] for i in c["ki_ids"]]
    split = {
        q: e["split"]
        for q, e in json.loads((RUN_24 / "failure_ledger.json").read_text(encoding="utf-8"))[
            "questions"
        ].items()
    }
    ledger = CreditLedger()
    for i, state in enumerate(states):
        traces = read_traces(RUN_24 / "evals" / f"c41552d3-{state}.jsonl")
        for s in ("tune", "validation"):
            ts = [t for t in traces if split[t.query_id] == s]
            ledger.record_run(
                f"it{i}:{s}", episodes_from_traces(ts, {t.query_id: shown[(state, t.query_id)] for t in ts})
            )
    # it broke validation 187 and 9 and fixed tuning 58 (the question it was written for): 2 > 1, retired
    assert ledger.credit("ki-113576d9264e350ca4a567fc") == KICredit(
        "ki-113576d9264e350ca4a567fc",
        2,
        6,
        2,
        ("it1:validation:187", "it1:validation:9"),
        1,
        ("it1:tune:58",),
    )
    assert ledger.verdicts()["ki-113576d9264e350ca4a567fc"] == "retire"
    c = ledger.credit("ki-2d80d86a38cc1be1821a96e7")
    assert (c.shown_right, c.shown_wrong, c.harmful, c.harmful_in) == (4, 2, 1, ("it1:validation:9",))
    assert ledger.verdicts()["ki-2d80d86a38cc1be1821a96e7"] == "keep"  # more right than wrong
    s = ledger.summary()
    assert (s["runs"], s["kis"], s["harmful"], s["demoted"], s["retire"], s["retired"]) == (
        6,
        108,
        2,
        0,
        1,
        0,
    )


def test_markdown_without_harmful_kis_says_so_instead_of_an_empty_table() -> None:
    # `kitune stats` printed a bare table header (newcomer check, issue 25)
    ledger = CreditLedger()
    ledger.record_run("r1", [_ep("q1", True, "a")])
    ledger.record_run("r2", [_ep("q1", True, "a")])
    assert ledger.to_markdown() == (
        "1 KIs credited over 2 runs: 0 with a harmful record, 0 demoted, 0 to retire (0 retired).\n"
        "no KI has a harmful record\n"
    )


def test_helpful_flips_spare_a_ki_and_change_its_ranking_as_documented() -> None:
    ledger = CreditLedger()
    ledger.record_run("r1", [_ep("q1", True, "a"), _ep("q2", False, "a"), _ep("q3", False)])
    # "m" appears everywhere: q1 right → wrong (harmful), q2 and q3 wrong, q3 stays wrong
    ledger.record_run("r2", [_ep("q1", False, "a", "m"), _ep("q2", False, "a", "m"), _ep("q3", False, "m")])
    assert ledger.credit("m") == KICredit("m", shown_wrong=3, harmful=1, harmful_in=("r2:q1",))
    assert ledger.verdicts()["m"] == "demote"  # broke 1, fixed 0, shown wrong 3 > right 0
    items = [("m", 0.9), ("a", 0.6)]
    ranked = demote_ranked(items, ledger.penalties(), id_of=lambda x: x[0], score_of=lambda x: x[1])
    assert [i for i, _ in ranked] == ["a", "m"]  # 0.9 × 0.5 = 0.45 < 0.6: "m" ranks second
    # a ledger in which "m" also fixed a question (q4 wrong → right when it appeared): 1 broken, 1 fixed
    other = CreditLedger()
    other.record_run("r1", [_ep("q1", True, "a"), _ep("q4", False)])
    other.record_run("r2", [_ep("q1", False, "a", "m"), _ep("q4", True, "m"), _ep("q3", False, "m")])
    assert (other.credit("m").harmful, other.credit("m").helpful) == (1, 1)
    assert other.verdicts()["m"] == "keep" and other.penalties() == {}
    ranked = demote_ranked(items, other.penalties(), id_of=lambda x: x[0], score_of=lambda x: x[1])
    assert [i for i, _ in ranked] == ["m", "a"]  # not demoted: it keeps the first place
    # retire needs harmful ≥ 2 AND more broken than fixed
    assert credit_verdict(KICredit("k", shown_wrong=5, harmful=2, helpful=1)) == "retire"
    assert credit_verdict(KICredit("k", shown_wrong=5, harmful=2, helpful=2)) == "keep"
    assert credit_verdict(KICredit("k", shown_right=1, shown_wrong=5, harmful=3, helpful=3)) == "keep"
    assert credit_verdict(KICredit("k", shown_wrong=5, harmful=1, helpful=0)) == "demote"


def test_load_run_credit_sums_a_ki_over_runs_and_skips_what_is_not_a_ledger(tmp_path: Path) -> None:
    for run, flips in (("a", [("q1", True), ("q1", False)]), ("b", [("q2", True), ("q2", False)])):
        ledger = CreditLedger(tmp_path / run / "ki_credit.json")
        (qid, first), (_, second) = flips
        ledger.record_run("r1", [_ep(qid, first)])
        ledger.record_run("r2", [_ep(qid, second, "k")])
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "ki_credit.json").write_text("not json", encoding="utf-8")
    merged = load_run_credit(sorted(tmp_path.glob("*/ki_credit.json")))
    assert merged == {"k": KICredit("k", shown_wrong=2, harmful=2, harmful_in=("r2:q1", "r2:q2"))}
    assert credit_verdict(merged["k"]) == "retire"  # once in each run: twice in all
