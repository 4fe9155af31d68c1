from __future__ import annotations

import json

import pytest
from dspy.utils import DummyLM

from kitune.errors import LMConnectionError
from kitune.lm import KituneJSONAdapter, ReplyParseError
from kitune.lm import read_json_object as extract_json_object
from kitune.programs.query_rewriter import QueryRewriter, RewriteQuery, RewriteTokens, plan_from_draft
from kitune.schema import Filter, QueryPlan
from kitune.usage import CallRecord, TokenLedger

Q = "Where is Acme Corp headquartered?"


def _lm(*plans: str) -> DummyLM:
    return DummyLM([{"plan": p} for p in plans])


class FailingLM(DummyLM):
    def __init__(self, exc: Exception) -> None:
        super().__init__([])
        self.exc = exc

    def forward(self, prompt=None, messages=None, **kwargs):
        raise self.exc


def test_valid_plan_with_fence_and_think_block() -> None:
    raw = (
        "<think>the user wants the HQ {not json}</think>\n```json\n"
        '{"entity_tags": ["Acme Corp", "entity:springfield", "Acme Corp"], '
        '"lexical": "Acme Corp  headquarters", "semantic": "Acme Corp is headquartered in a city.", '
        '"filters": {"tags_any": ["org"], "statuses": ["expired"]}, "size": 999}\n```'
    )
    res = QueryRewriter(ground_tags=False).rewrite(Q, size=7, lm=_lm(raw))
    assert res.fell_back is False and res.reason is None
    assert res.plan == QueryPlan(
        entity_tags=("entity:acme-corp", "entity:springfield"),
        lexical="Acme Corp headquarters",
        semantic="Acme Corp is headquartered in a city.",
        filters=Filter(tags_any=("org",)),  # statuses from the LM are ignored
        size=7,  # the caller's size, never the LM's
    )
    # the adapter read the typed plan through the think block and fence; raw is its values as JSON
    assert json.loads(res.raw)["lexical"] == "Acme Corp  headquarters"


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("Let me think about the entities step by step.", "no_json"),
        ('{"entity_tags": ["entity:Acme Corp"], "lexical": "acme"}', "invalid_plan"),
        (json.dumps({"lexical": "x" * 501}), "invalid_plan"),
        ('{"entity_tags": "", "lexical": "  ", "semantic": ""}', "empty_plan"),
        ('{"lexical": "acme", "filters": {"raw_query": "FROM kis | DROP"}}', "invalid_plan"),
        ('{"lexical": ["acme"]}', "invalid_plan"),
    ],
    ids=["no-json", "bad-tag", "over-long", "nothing-usable", "unknown-filter", "wrong-type"],
)
def test_invalid_output_falls_back_to_plain_plan_and_is_counted(raw: str, code: str) -> None:
    rw = QueryRewriter()
    res = rw.rewrite(Q, size=5, lm=_lm(raw))
    assert res.fell_back is True
    assert res.reason is not None and res.reason.startswith(code + ":")
    assert res.plan == QueryPlan.plain(Q, size=5)
    assert rw.fallbacks == {code: 1}


def test_fallback_counter_accumulates_and_successes_do_not_count() -> None:
    rw = QueryRewriter()
    lm = _lm("nope", '{"lexical": "acme hq"}', "still nope")
    results = [rw.rewrite(Q, lm=lm) for _ in range(3)]
    assert [r.fell_back for r in results] == [True, False, True]
    assert rw.fallbacks == {"no_json": 2}


def test_lm_error_falls_back_with_reason() -> None:
    rw = QueryRewriter()
    res = rw.rewrite(Q, lm=FailingLM(LMConnectionError("proxy answered 502")))
    assert res.fell_back and res.reason == "lm_error: LMConnectionError: proxy answered 502"
    assert res.plan == QueryPlan.plain(Q) and res.raw == ""
    assert rw.fallbacks == {"lm_error": 1}


def test_a_recording_miss_is_not_swallowed_as_an_lm_error() -> None:
    """A replay without the rewriter's call must stop the run, not fall back to a plain plan (the
    replay would then diverge from the recording and fail later, far from the cause)."""
    from kitune.recording import RecordingMissError

    rw = QueryRewriter()
    miss = RecordingMissError("no recorded reply for rewrite", hash="abc123", role="rewrite")
    with pytest.raises(RecordingMissError, match="no recorded reply for rewrite"):
        rw.rewrite(Q, lm=FailingLM(miss))
    assert rw.fallbacks == {}


def test_tokens_from_ledger_when_lm_reports_none() -> None:
    ledger = TokenLedger()

    class RecordingLM(DummyLM):
        def forward(self, prompt=None, messages=None, **kwargs):
            ledger.record(CallRecord("rewrite", "context", "dummy", 120, 30))
            ledger.record(CallRecord("agent", "context", "dummy", 999, 999))  # other role: ignored
            return super().forward(prompt=prompt, messages=messages, **kwargs)

    lm = RecordingLM([{"plan_json": '{"lexical": "acme"}'}])
    res = QueryRewriter().rewrite(Q, lm=lm, ledger=ledger)
    assert res.tokens == RewriteTokens(input=120, output=30)


def plan_from_output(raw: str, *, size: int = 10) -> QueryPlan:
    """A raw reply read as the rewriter reads it: kitune's adapter, then :func:`plan_from_draft`."""
    return plan_from_draft(KituneJSONAdapter().parse(RewriteQuery, raw)["plan"], size=size)


def test_plan_from_output_unwraps_plan_and_json_string() -> None:
    inner = json.dumps({"lexical": "acme", "entity_tags": ["Zürich"]})
    assert plan_from_output(json.dumps({"json": inner})).entity_tags == ("entity:zurich",)
    wrapped = json.dumps({"plan": {"semantic": "s"}})
    assert plan_from_output(wrapped, size=3) == QueryPlan(semantic="s", size=3)
    with pytest.raises(ReplyParseError) as ei:
        plan_from_output("[1, 2]")
    assert ei.value.lm_response == "[1, 2]" and ei.value.reason == "no_json"


def test_extract_json_object_skips_non_json_braces() -> None:
    assert extract_json_object('see {this} then {"a": 1} and {"b": 2}') == {"a": 1}
    assert extract_json_object("") is None


def test_blank_question_and_bad_size_raise() -> None:
    with pytest.raises(ValueError, match="blank"):
        QueryRewriter().rewrite("   ", lm=_lm("{}"))
    with pytest.raises(ValueError, match="size=0"):
        QueryRewriter().rewrite(Q, size=0, lm=_lm("{}"))


def test_instruction_is_packaged_prompt_and_optimisable() -> None:
    rw = QueryRewriter()
    assert [n for n, _ in rw.named_predictors()] == ["planner"]
    assert "Tag only the proper names" in rw.planner.signature.instructions
    # the format lives in the typed output, not in the (optimisable) instruction
    assert "entity_tags" not in rw.planner.signature.instructions
    assert "entity_tags" in rw.planner.signature.output_fields["plan"].annotation.model_fields
    assert rw.prompt_version.startswith("rewriter@")
    custom = QueryRewriter("Only output JSON.")
    assert custom.planner.signature.instructions == "Only output JSON."


def test_python_literal_dict_from_stringified_object_is_read() -> None:
    # JSONAdapter str()-ifies an object value: single quotes, not JSON
    raw = str({"entity_tags": ["Acme Corp"], "lexical": "acme hq", "semantic": "where acme is"})
    assert plan_from_output(raw).entity_tags == ("entity:acme-corp",)
    assert extract_json_object("{'a': __import__('os')}") is None


def test_adapter_is_scoped_around_the_call() -> None:
    import dspy

    lm = DummyLM([{"plan": {"lexical": "acme hq"}}], adapter=dspy.JSONAdapter())
    rw = QueryRewriter(adapter=dspy.JSONAdapter())
    res = rw.rewrite(Q, lm=lm)
    assert res.fell_back is False and res.plan.lexical == "acme hq"
    assert '"plan"' in lm.history[-1]["messages"][0]["content"]
    assert json.loads(res.raw)["lexical"] == "acme hq"  # typed: the plan values as JSON


def test_entity_tags_not_in_the_question_are_dropped_and_reported() -> None:
    q = "What district is LaHave, the birthplace of David Morse, in?"
    raw = json.dumps(
        {
            "entity_tags": ["entity:la-have", "David Morse", "entity:country", "entity:topic-districts"],
            "lexical": "LaHave district",
            "semantic": "LaHave is located in a district.",
        }
    )
    res = QueryRewriter().rewrite(q, lm=_lm(raw))
    assert res.fell_back is False
    assert res.plan.entity_tags == ("entity:la-have", "entity:david-morse")
    assert res.dropped_tags == ("entity:country", "entity:topic-districts")
    # with grounding off the LM's bridge entities are kept
    kept = QueryRewriter(ground_tags=False).rewrite(q, lm=_lm(raw))
    assert len(kept.plan.entity_tags) == 4 and kept.dropped_tags == ()


def test_common_nouns_from_the_question_are_not_entities() -> None:
    q = "What country was the author of Brand a citizen of?"
    raw = json.dumps({"entity_tags": ["author", "Brand", "citizen", "country"], "lexical": "author Brand"})
    res = QueryRewriter().rewrite(q, lm=_lm(raw))
    assert res.plan.entity_tags == ("entity:brand",)
    assert res.dropped_tags == ("entity:author", "entity:citizen", "entity:country")
    # an all-lowercase question keeps every tag grounded in its words
    lm = _lm(json.dumps({"entity_tags": ["brand"], "lexical": "x"}))
    low = QueryRewriter().rewrite("who wrote brand", lm=lm)
    assert low.plan.entity_tags == ("entity:brand",) and low.dropped_tags == ()
