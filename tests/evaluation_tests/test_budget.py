from __future__ import annotations

import pytest

from kitune.config import KituneConfig
from kitune.evaluation.budget import Budget, BudgetMeter
from kitune.testing.chat import ScriptedChatModel, ScriptExhaustedError


def test_budget_defaults_and_validation() -> None:
    assert Budget() == Budget(max_steps=43, max_tokens=64_000, timeout_s=None)
    assert Budget.from_config(KituneConfig().agent) == Budget()
    for bad in ({"max_steps": 0}, {"max_tokens": 0}, {"timeout_s": 0}):
        with pytest.raises(ValueError):
            Budget(**bad)


def test_meter_limits() -> None:
    now = [0.0]
    m = BudgetMeter(Budget(max_steps=2, max_tokens=150, timeout_s=5), clock=lambda: now[0])
    assert m.exhausted_by() is None
    m.charge(input_tokens=100, output_tokens=3)
    assert (m.steps, m.steps_left, m.exhausted_by()) == (1, 1, None)
    now[0] = 6.0
    assert m.exhausted_by() == "timeout"
    m.charge(input_tokens=60, output_tokens=3, step=False)
    assert m.exhausted_by() == "tokens" and m.input_tokens == 160 and m.output_tokens == 6
    m.charge(input_tokens=0, output_tokens=0)
    assert m.exhausted_by() == "steps"


def test_scripted_chat_model_records_and_exhausts() -> None:
    model = ScriptedChatModel(["a", lambda msgs: msgs[-1]["content"].upper()], usage=(7, 2))
    r1 = model.complete([{"role": "user", "content": "hi"}], json_mode=True)
    r2 = model.complete([{"role": "user", "content": "yo"}], max_tokens=5)
    assert (r1.text, r1.input_tokens, r1.output_tokens, r2.text) == ("a", 7, 2, "YO")
    assert [c.json_mode for c in model.calls] == [True, False] and model.calls[1].max_tokens == 5
    with pytest.raises(ScriptExhaustedError, match="no turns left after 2"):
        model.complete([])
