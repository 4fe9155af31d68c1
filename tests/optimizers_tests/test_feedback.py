"""Tests for kitune.optimizers.feedback: failures → disambiguation KIs, and flip counting."""

from __future__ import annotations

from dspy.utils import DummyLM

from kitune.config import KituneConfig
from kitune.data.loaders import Question
from kitune.errors import DocumentNotFoundError
from kitune.evaluation.trace import Trace
from kitune.optimizers.feedback import collect_failures, count_flips, write_disambiguation_kis
from kitune.programs.disambiguator import Disambiguator
from kitune.retrieval.memory import MemoryStore
from kitune.schema import Document, Filter
from kitune.service.serving.context import context_ids

DOCS = {
    "d1": Document(
        docid="d1", title="Bakery", text="The Old Mill Bakery in Harwick was opened by Tom O'Neill in 1921."
    ),
    "d2": Document(docid="d2", title="Bridge", text="The Harwick bridge was finished in 1932."),
}


def _get(docid: str) -> Document:
    if docid not in DOCS:
        raise DocumentNotFoundError(docid)
    return DOCS[docid]


def _t(qid: str, answer: str, correct: bool | None, em: bool = False) -> Trace:
    return Trace(
        query_id=qid,
        skill="in-context",
        question=f"q{qid}",
        gold_answer="g",
        status="answered",
        exact_answer=answer,
        judge_correct=correct,
        judge_status="graded" if correct is not None else "not_run",
        em=em,
    )


def test_count_flips_hand_made_case() -> None:
    before = [
        _t("1", "a", False),
        _t("2", "b", False),
        _t("3", "c", True),
        _t("4", "d", True),
        _t("5", "e", None),
    ]
    after = [
        _t("1", "g", True),
        _t("2", "b", False),
        _t("3", "x", False),
        _t("4", "d", True),
        _t("5", "g", None, em=True),
        _t("9", "g", True),
    ]
    flips = count_flips(before, after)
    assert flips.fixed == ("1", "5")  # 5: ungraded, exact match flipped
    assert flips.still_wrong == ("2",)
    assert flips.newly_wrong == ("3",)
    assert flips.still_right == ("4",)
    assert flips.to_metrics()["flips_newly_wrong"] == 1.0


def test_collect_failures_skips_right_and_docless_keeps_blank() -> None:
    qs = [
        Question("1", "Who opened the Old Mill Bakery?", "Tom O'Neill", gold_docids=("d1",)),
        Question("2", "When?", "1932", evidence_docids=("d2",)),
        Question("3", "Blank?", "x", gold_docids=("d1",)),
        Question("4", "No docs?", "y"),
    ]
    traces = [_t("1", "Tomas O'Neil", False), _t("2", "1932", True), _t("3", " ", False), _t("4", "z", False)]
    failures = collect_failures(traces, qs)
    # a blank answer is kept (counted later as a rejected empty_prediction candidate, not skipped)
    assert [(f.query_id, f.prediction, f.gold_docids) for f in failures] == [
        ("1", "Tomas O'Neil", ("d1",)),
        ("3", "", ("d1",)),
    ]


def test_write_disambiguation_kis_keeps_retrieved_and_counts_rejections() -> None:
    cfg = KituneConfig()
    store = MemoryStore(retrieval=cfg.retrieval)
    qs = [
        Question("1", "Who opened the Old Mill Bakery in Harwick?", "Tom O'Neill", gold_docids=("d1",)),
        Question("2", "When was the Harwick bridge finished?", "1932", gold_docids=("d2",)),
        Question("3", "Missing doc?", "x", gold_docids=("nope",)),
        Question("4", "Blank answer?", "x", gold_docids=("d1",)),
    ]
    traces = [_t("1", "Tomas O'Neil", False), _t("2", "1931", False), _t("3", "y", False), _t("4", "", False)]
    failures = collect_failures(traces, qs)
    lm = DummyLM(
        [
            {
                "title": "The Old Mill Bakery in Harwick was opened by Tom O'Neill, not Tomas O'Neil.",
                "description": "Tom O'Neill opened it in 1921.",
                "evidence": "opened by Tom O'Neill in 1921",
            },
            {"title": "The bridge was finished in 1932.", "description": "d", "evidence": "finished in 1932"},
            # the regeneration (told the title lacked the wrong answer) fails again → template title
            {
                "title": "The Harwick bridge was finished in 1932.",
                "description": "d",
                "evidence": "finished in 1932",
            },
        ]
    )
    seen: list[tuple[int, int]] = []
    report = write_disambiguation_kis(
        failures,
        store=store,
        disambiguator=Disambiguator(corpus="t"),
        get_document=_get,
        context_fn=context_ids(store=store, cfg=cfg),
        lm=lm,
        on_progress=lambda i, n: seen.append((i, n)),
    )
    # issue 12 item 10: a failed title is regenerated once, then falls back to a template naming both
    assert report.attempted == 4 and report.written == 2
    assert report.rejected == {"no_gold_document": 1, "empty_prediction": 1}
    assert [(q, p, ki is not None, why) for q, p, ki, why in report.outcomes] == [
        ("1", "Tomas O'Neil", True, None),
        ("2", "1931", True, None),
        ("3", "y", False, "no_gold_document"),
        ("4", "", False, "empty_prediction"),
    ]
    stored = list(store.iter_kis(Filter(subtypes=("disambiguation",))))
    assert sorted(k.id for k in stored) == sorted(report.ki_ids)
    assert "1932 (not 1931) — The Harwick bridge was finished in 1932." in {k.title for k in stored}
    assert "disambiguation" in stored[0].tags
    assert seen[-1] == (4, 4)
    assert report.to_metrics()["feedback_written"] == 2.0


def test_feedback_ki_is_indexed_under_the_agents_lookups() -> None:
    from kitune.evaluation.trace import Trace
    from kitune.optimizers.feedback import with_lookup_tags
    from kitune.testing.store_contract import make_ki

    q = Question("7", "Which river is Victoria Falls on?", "Zambezi", gold_docids=("d1",))
    t = Trace(
        query_id="7",
        skill="in-context",
        question=q.query,
        gold_answer="Zambezi",
        status="answered",
        exact_answer="Limpopo",
        judge_correct=False,
        judge_status="graded",
        steps=[
            {"kind": "tool", "tool": "get_context", "args": {"query": "Victoria Falls river"}},
            {"kind": "tool", "tool": "search", "args": {"query": "Mosi-oa-Tunya"}},
            {
                "kind": "tool",
                "tool": "get_context",
                "args": {"query": "Mosi-oa-Tunya Zambia Zimbabwe border"},
            },
        ],
    )
    (f,) = collect_failures([t], [q])
    assert f.queries == ("Victoria Falls river", "Mosi-oa-Tunya Zambia Zimbabwe border")  # get_context only
    ki = make_ki("Zambezi", "Limpopo", docid="d1", subtype="disambiguation")
    tagged = with_lookup_tags(ki, [f.question, *f.queries])
    added = [tag for tag in tagged.tags if tag not in ki.tags]
    assert added == ["entity:victoria-falls", "entity:mosi-oa-tunya-zambia-zimbabwe"]
    assert tagged.id == ki.id  # same KI, more ways to reach it
    assert with_lookup_tags(ki, ["lower case only"]) is ki
