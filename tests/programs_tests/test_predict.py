"""predict_typed: the one way programs call a predictor (adapter choice, unreadable replies, raw text)."""

from __future__ import annotations

import json

import dspy
import pytest
from dspy.utils import DummyLM

from kitune.errors import LMRateLimitError
from kitune.lm import KituneChatAdapter, KituneJSONAdapter, Records, reset_format_memory
from kitune.programs.predict import predict_typed
from kitune.programs.records import FactRecord, PlanDraft
from kitune.testing.lm import stub_server_lm
from kitune.testing.openai_stub import Reply, StubServer


class Facts(dspy.Signature):  # type: ignore[misc]
    """Extract."""

    text: str = dspy.InputField()
    facts: list[FactRecord] = dspy.OutputField()


class Plan(dspy.Signature):  # type: ignore[misc]
    """Plan."""

    question: str = dspy.InputField()
    plan: PlanDraft = dspy.OutputField()


FACT = {
    "title": "Acme was founded in 1999",
    "description": "Acme was founded in 1999.",
    "subject": "Acme",
    "predicate": "founded_in",
    "object": "1999",
    "evidence_span": "Acme was founded in 1999",
    "confidence": "0.9",
}


def test_typed_records_with_drops_and_the_models_own_text() -> None:
    reply = json.dumps([FACT, {**FACT, "confidence": 140}])
    lm = DummyLM([{"facts": reply}])
    with dspy.context(lm=lm):
        got = predict_typed(dspy.Predict(Facts), text="Acme was founded in 1999.")
    assert got.error is None and got.prediction is not None
    facts = got.prediction.facts
    assert isinstance(facts, Records) and [(f.object, f.confidence) for f in facts] == [("1999", 90)]
    assert [(e.index, e.reason) for e in facts.errors] == [(1, "bad_confidence")]
    # the raw text is the reply as the adapter received it (DummyLM: with its field markers)
    assert got.raw == f"[[ ## facts ## ]]\n{reply}"
    assert got.finish_reason is None and got.calls == ()  # not a KituneLM: calls are not tracked


def test_an_unreadable_reply_is_an_error_not_an_exception() -> None:
    lm = DummyLM([{"facts": "I could not find any facts."}])
    with dspy.context(lm=lm):
        got = predict_typed(dspy.Predict(Facts), text="t")
    assert got.prediction is None and got.error is not None
    assert got.error.reason == "no_json" and got.error.detail.startswith("no JSON object found")
    assert "I could not find any facts." in got.raw
    assert len(lm.history) == 1  # the default adapter for a non-kitune LM makes no JSON second call


def test_a_callers_own_adapter_wins_and_its_failure_is_read_leniently() -> None:
    # dspy's JSONAdapter cannot read the plan from prose; the same reply is read leniently
    raw = 'Sure! {"lexical": "acme hq", "entity_tags": "Acme"} Hope this helps.'

    class Raw(DummyLM):
        def _format_answer_fields(self, v):  # type: ignore[override]
            return v

    lm = Raw([raw], adapter=dspy.JSONAdapter())
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        got = predict_typed(dspy.Predict(Plan), question="Where is Acme?")
    assert got.error is None and got.prediction is not None
    assert got.prediction.plan == PlanDraft(lexical="acme hq", entity_tags=["Acme"])
    assert '"plan"' in lm.history[-1]["messages"][0]["content"]  # dspy's JSON format was sent


def test_the_program_default_adapter_is_used_only_without_a_context_adapter() -> None:
    seen: list[str] = []

    def pick(_lm: object) -> dspy.Adapter:
        seen.append("default")
        return KituneJSONAdapter()

    lm = DummyLM([{"plan": '{"lexical": "x"}'}, {"plan": '{"lexical": "y"}'}])
    with dspy.context(lm=lm):
        first = predict_typed(dspy.Predict(Plan), adapter=pick, question="q")
        with dspy.context(adapter=KituneChatAdapter()):
            second = predict_typed(dspy.Predict(Plan), adapter=pick, question="q")
    assert seen == ["default"]
    assert first.prediction is not None and first.prediction.plan.lexical == "x"
    assert second.prediction is not None and second.prediction.plan.lexical == "y"


def test_finish_reason_and_raw_text_of_a_kitune_lm_call() -> None:
    reset_format_memory()
    cut = '{"facts": [' + json.dumps(FACT) + ', {"title": "cut'
    with StubServer() as stub:
        stub.push(Reply.ok(cut, finish_reason="length"))
        with dspy.context(lm=stub_server_lm(stub.base_url, max_tokens=64)):
            got = predict_typed(dspy.Predict(Facts), config={"max_tokens": 64}, text="t")
        assert stub.chat_requests[0].body["max_tokens"] == 64
    assert got.finish_reason == "length" and got.raw == cut and len(got.calls) == 1
    assert got.prediction is not None
    facts = got.prediction.facts
    assert [f.object for f in facts] == ["1999"] and facts.counters["truncated_salvaged"] == 1


def test_lm_errors_propagate() -> None:
    class Failing(DummyLM):
        def forward(self, prompt=None, messages=None, **kwargs):
            raise LMRateLimitError("429", model="m")

    with dspy.context(lm=Failing([])), pytest.raises(LMRateLimitError):
        predict_typed(dspy.Predict(Plan), question="q")
