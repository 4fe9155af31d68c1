from __future__ import annotations

import pytest
from dspy.utils import DummyLM

from kitune.errors import LMRateLimitError
from kitune.ki import KI
from kitune.programs.disambiguator import Disambiguator, accept_if_retrieved, contains_folded
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.memory import MemoryStore
from kitune.schema import QueryPlan

DOC = (
    "The Old Mill Bakery in Harwick was opened by Tom O\u2019Neill in 1921. "
    "His cousin Tomas O'Neil ran a bakery in Dunmore from 1930."
)
QUESTION = "Who opened the Old Mill Bakery in Harwick?"
GOLD = "Tom O'Neill"  # straight apostrophe
WRONG = "Tomas O'Neil"


def _lm(
    title: str,
    description: str = "Tom O'Neill opened the Harwick bakery in 1921; Tomas O'Neil ran "
    "one in Dunmore from 1930.",
    evidence: str = "opened by Tom O'Neill in 1921",
) -> DummyLM:
    return DummyLM([{"title": title, "description": description, "evidence": evidence}])


def test_curly_quotes_in_title_are_accepted_and_ki_is_tagged() -> None:
    # the model writes curly apostrophes in the title; gold/prediction use straight ones
    title = "The Old Mill Bakery in Harwick was opened by Tom O\u2019Neill, not his cousin Tomas O\u2019Neil."
    res = Disambiguator().disambiguate(QUESTION, GOLD, WRONG, DOC, "d42", lm=_lm(title))
    assert res.rejected_reason is None and res.accepted
    ki = res.ki
    assert ki is not None
    assert ki.title == title
    assert ki.payload.subtype == "disambiguation"
    assert ki.payload.properties.subject == GOLD
    assert ki.payload.properties.predicate == "distinguished_from"
    assert ki.payload.properties.object == WRONG
    # the stored evidence is cut from the original text (curly apostrophe kept)
    assert ki.payload.evidence == ["opened by Tom O\u2019Neill in 1921"]
    assert ki.tags == ["disambiguation", "entity:tom-o-neill", "entity:tomas-o-neil", "doc:d42"]
    assert ki.evidence_doc_ids == ["d42"]
    assert ki.prompt_version.startswith("disambiguator@")


@pytest.mark.parametrize("wrong", ["", "   ", "\u00a0\u200b"])
def test_empty_prediction_is_rejected_without_calling_the_lm(wrong: str) -> None:
    lm = _lm("unused")
    res = Disambiguator().disambiguate(QUESTION, GOLD, wrong, DOC, "d42", lm=lm)
    assert res.ki is None
    assert res.rejected_reason == "empty_prediction: the wrong prediction is blank"
    assert lm.history == []


DESC = "Tom O'Neill opened it in 1921."
EVIDENCE = "opened by Tom O'Neill in 1921"


def test_title_missing_gold_is_regenerated_once_told_why() -> None:
    bad = "Tomas O'Neil ran a bakery in Dunmore, not the one in Harwick."
    good = "Tom O'Neill opened the Harwick bakery in 1921; Tomas O'Neil only ran one in Dunmore."
    lm = DummyLM([{"title": t, "description": DESC, "evidence": EVIDENCE} for t in (bad, good)])
    res = Disambiguator().disambiguate(QUESTION, GOLD, WRONG, DOC, "d42", lm=lm)
    assert res.ki is not None and res.ki.title == good
    assert (res.regenerations, res.title_source) == (1, "regenerated")
    assert [f.split(":", 1)[0] for f in res.title_failures] == ["title_missing_gold"]
    second_prompt = lm.history[-1]["messages"][-1]["content"]
    assert "does not contain the correct answer spelled exactly as given" in second_prompt
    assert "Tom O'Neill" in second_prompt


def test_title_failing_twice_gets_the_template_title_and_is_counted() -> None:
    first = "The Old Mill Bakery in Harwick was opened by Tom O'Neill in 1921."
    second = "Tom O'Neill opened the Old Mill Bakery in Harwick in 1921, his cousin did not."
    lm = DummyLM([{"title": t, "description": DESC, "evidence": EVIDENCE} for t in (first, second)])
    res = Disambiguator().disambiguate(QUESTION, GOLD, WRONG, DOC, "d42", lm=lm)
    assert res.ki is not None
    assert res.ki.title == (
        "Tom O'Neill (not Tomas O'Neil) — Tom O'Neill opened the Old Mill Bakery in Harwick in 1921, "
        "his cousin did not."
    )
    assert (res.regenerations, res.title_source) == (1, "template")
    assert [f.split(":", 1)[0] for f in res.title_failures] == ["title_missing_prediction"] * 2
    assert len(lm.history) == 2  # one regeneration, never more


def test_template_title_is_cut_to_140_characters_at_a_word() -> None:
    from kitune.programs.disambiguator import template_title

    long_rest = "word " * 60
    title = template_title("Tom O'Neill", "Tomas O'Neil", long_rest)
    assert len(title) <= 140 and title.endswith("word…")
    assert title.startswith("Tom O'Neill (not Tomas O'Neil) — word word")
    assert template_title("A", "B", "") == "A (not B)"


def test_first_title_passing_is_not_regenerated() -> None:
    title = "Tom O'Neill opened the Harwick bakery; Tomas O'Neil did not."
    res = Disambiguator().disambiguate(QUESTION, GOLD, WRONG, DOC, "d42", lm=_lm(title))
    assert (res.regenerations, res.title_source, res.title_failures) == (0, "model", ())


def test_quoted_evidence_is_found_verbatim() -> None:
    title = "Tom O'Neill opened the Harwick bakery; Tomas O'Neil did not."
    res = Disambiguator().disambiguate(
        QUESTION,
        GOLD,
        WRONG,
        DOC,
        "d42",
        lm=_lm(title, evidence='"...opened by Tom O\u2019Neill in 1921..."'),
    )
    assert res.ki is not None and res.evidence_source == "model"
    assert res.ki.payload.evidence == ["opened by Tom O\u2019Neill in 1921"]


def test_paraphrased_evidence_falls_back_to_the_gold_sentence() -> None:
    title = "Tom O'Neill opened the Harwick bakery; Tomas O'Neil did not."
    res = Disambiguator().disambiguate(
        QUESTION, GOLD, WRONG, DOC, "d42", lm=_lm(title, evidence="Tom O'Neill founded it in 1921")
    )
    assert res.ki is not None and res.evidence_source == "gold_sentence"
    sentence = "The Old Mill Bakery in Harwick was opened by Tom O\u2019Neill in 1921."
    assert res.ki.payload.evidence == [sentence]


def test_evidence_rejected_when_gold_is_not_in_the_document() -> None:
    title = "Tom O'Neill opened the Harwick bakery; Tomas O'Neil did not."
    res = Disambiguator().disambiguate(
        QUESTION,
        GOLD,
        WRONG,
        "Tomas O'Neil ran a bakery in Dunmore.",
        "d42",
        lm=_lm(title, evidence="Tom O'Neill founded it in 1921"),
    )
    assert res.ki is None
    assert res.rejected_reason is not None and res.rejected_reason.startswith("evidence_not_in_document:")


def test_overlong_title_becomes_the_template_instead_of_an_invalid_ki() -> None:
    # was: rejected as invalid_ki (what killed the 1.5B writer's KIs in the fixture loop run)
    title = "Tom O'Neill and Tomas O'Neil " + "x" * 140
    res = Disambiguator().disambiguate(QUESTION, GOLD, WRONG, DOC, "d42", lm=_lm(title))
    assert res.ki is not None and res.title_source == "template" and len(res.ki.title) <= 140
    assert res.ki.title.startswith("Tom O'Neill (not Tomas O'Neil)")


def test_same_answer_and_lm_error_are_rejected() -> None:
    res = Disambiguator().disambiguate(QUESTION, GOLD, "tom o\u2019neill", DOC, "d42", lm=_lm("x"))
    assert res.rejected_reason == "same_answer: the prediction equals the gold answer"

    class Failing(DummyLM):
        def forward(self, prompt=None, messages=None, **kwargs):
            raise LMRateLimitError("429 slow down")

    res = Disambiguator().disambiguate(QUESTION, GOLD, WRONG, DOC, "d42", lm=Failing([]))
    assert res.rejected_reason == "lm_error: LMRateLimitError: 429 slow down"


def test_contains_folded() -> None:
    assert contains_folded("Tom O\u2019NEILL here", "tom o'neill")
    assert not contains_folded("Tom ONeill", "Tom O'Neill")
    assert not contains_folded("anything", "  ")


# --- accept_if_retrieved ---------------------------------------------------------------------


def _fact(docid: str, title: str, subject: str, obj: str) -> KI:
    return KI.from_fact(
        docid=docid,
        title=title,
        description=title + " Evidence from the record.",
        subject=subject,
        predicate="related_to",
        obj=obj,
        evidence=[title],
        confidence=80,
    )


@pytest.fixture
def store() -> MemoryStore:
    s = MemoryStore(embedder=HashEmbedder(dim=64))
    s.upsert(
        [
            _fact("d1", "Harwick is a market town in the north.", "Harwick", "market town"),
            _fact("d2", "Dunmore has a harbour built in 1880.", "Dunmore", "harbour"),
            _fact("d3", "The Old Mill in Harwick was restored in 1990.", "Old Mill", "restored 1990"),
        ]
    )
    return s


def _ids(store: MemoryStore):
    return lambda q: [h.ki.id for h in store.search(QueryPlan.plain(q, size=10)).hits]


def _disambig_ki() -> KI:
    title = "The Old Mill Bakery in Harwick was opened by Tom O'Neill, not Tomas O'Neil."
    res = Disambiguator().disambiguate(QUESTION, GOLD, WRONG, DOC, "d42", lm=_lm(title))
    assert res.ki is not None
    return res.ki


def test_accept_if_retrieved_keeps_a_retrieved_ki(store: MemoryStore) -> None:
    ki = _disambig_ki()
    assert accept_if_retrieved(ki, QUESTION, store, _ids(store), top_k=3) is True
    assert store.get(ki.id).title == ki.title
    assert store.count() == 4


def test_accept_if_retrieved_removes_a_ki_outside_top_k(store: MemoryStore) -> None:
    ki = _disambig_ki()
    assert accept_if_retrieved(ki, QUESTION, store, lambda q: ["other-1", "other-2", ki.id], top_k=2) is False
    assert store.count() == 3
    assert ki.id not in [k.id for k in store.iter_kis()]


def test_accept_if_retrieved_restores_a_previous_version(store: MemoryStore) -> None:
    ki = _disambig_ki()
    store.upsert([ki])
    newer = ki.model_copy(update={"title": "Tom O'Neill, not Tomas O'Neil, opened the Harwick bakery."})
    assert accept_if_retrieved(newer, QUESTION, store, lambda q: [], top_k=5) is False
    assert store.get(ki.id).title == ki.title
    with pytest.raises(ValueError, match="top_k=0"):
        accept_if_retrieved(ki, QUESTION, store, lambda q: [], top_k=0)


def test_long_or_missing_description_is_fitted_not_rejected() -> None:
    # the embedded 1.5B writer produced descriptions the KI model refused (invalid_ki) in 6 of 9
    # fixture failures; whole sentences that fit are kept, and a missing one falls back to the title
    import dspy
    from dspy.utils import DummyLM

    from kitune.programs.disambiguator import Disambiguator

    doc = "The Harwick bridge was finished in 1932. It replaced a ferry. The ferry ran from 1850."
    long_desc = "The bridge was finished in 1932, not 1931. " + "It is a steel bridge over the river. " * 12
    lm = DummyLM(
        [
            {
                "title": "The Harwick bridge was finished in 1932, not 1931.",
                "description": long_desc,
                "evidence": "finished in 1932",
            }
        ]
    )
    with dspy.context(lm=lm):
        res = Disambiguator(corpus="t").disambiguate(
            "When was the Harwick bridge finished?", "1932", "1931", doc, "d2"
        )
    assert res.ki is not None and res.description_trimmed
    assert len(res.ki.description) <= 350 and res.ki.description.startswith("The bridge was finished in 1932")
    assert res.ki.description.endswith(".")


def test_an_over_long_title_that_names_both_becomes_the_template() -> None:
    # seen with the 1.5B writer: a 170-character title naming both answers failed the KI model
    import dspy
    from dspy.utils import DummyLM

    from kitune.programs.disambiguator import Disambiguator

    doc = "The Harwick bridge was finished in 1932. It replaced a ferry."
    title = "The Harwick bridge was finished in 1932, not 1931, " + "as the records of the county show " * 4
    lm = DummyLM([{"title": title, "description": "Finished in 1932.", "evidence": "finished in 1932"}])
    with dspy.context(lm=lm):
        res = Disambiguator(corpus="t").disambiguate("When was it finished?", "1932", "1931", doc, "d2")
    assert res.ki is not None and res.title_source == "template"
    assert res.ki.title.startswith("1932 (not 1931) — The Harwick bridge") and len(res.ki.title) <= 140
    assert res.title_failures[-1].startswith("title_too_long: ")
