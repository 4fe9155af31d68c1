"""``kitune lm models``, ``kitune lm smoke`` (with a stand-in LM layer) and the bench scorer."""

from __future__ import annotations

import json
import sys
import types
from typing import Any

import pytest
from typer.testing import CliRunner

from kitune.cli import _register, app
from kitune.cli.lm_cmds import _score_facts, _timings
from kitune.usage import CallRecord, TokenLedger, current_stage

runner = CliRunner()


def test_lm_models_lists_every_packaged_model() -> None:
    _register()
    result = runner.invoke(app, ["lm", "models"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in ("qwen2.5-coder-1.5b", "qwen2.5-0.5b", "gemma3-270m"):
        assert name in result.output
    assert "runtime: " in result.output


def test_lm_smoke_calls_build_lm_and_prints_the_ledger(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any]] = []

    class FakeLM:
        def __init__(self, ledger: TokenLedger) -> None:
            self.ledger = ledger

        def __call__(self, messages: list[dict[str, str]]) -> list[str]:
            calls.append(("call", messages))
            self.ledger.record(
                CallRecord(
                    role="judge",
                    stage=current_stage(),
                    model="openai/fake",
                    input_tokens=12,
                    output_tokens=5,
                    latency_s=0.01,
                )
            )
            return ["  a short fact  "]

    def build_lm(cfg: Any, role: str, *, ledger: TokenLedger) -> FakeLM:
        calls.append(("build", role))
        return FakeLM(ledger)

    monkeypatch.setitem(sys.modules, "kitune.lm", types.SimpleNamespace(build_lm=build_lm))
    monkeypatch.setenv("KITUNE_LM__GATEWAY__DEFAULT_MODEL", "openai/fake")  # no local server
    _register()
    result = runner.invoke(
        app, ["lm", "smoke", "--role", "judge", "--prompt", "hello?"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert calls[0] == ("build", "judge")
    assert calls[1] == ("call", [{"role": "user", "content": "hello?"}])
    assert "reply: a short fact" in result.output
    assert "5 output tokens" in result.output
    assert "token ledger" in result.output and "smoke" in result.output and "12" in result.output


def test_lm_smoke_rejects_an_unknown_role() -> None:
    _register()
    result = runner.invoke(app, ["lm", "smoke", "--role", "boss"])
    assert result.exit_code == 2
    assert "is not a role" in result.output


def test_score_facts_counts_verbatim_spans_and_supported_objects() -> None:
    doc = "Kalandula Falls are waterfalls in Malanje Province, Angola. They are 105 m high."
    content = json.dumps(
        {
            "facts": [
                {
                    "subject": "Kalandula Falls",
                    "predicate": "located_in",
                    "object": "Angola",
                    "evidence_span": "waterfalls in Malanje Province, Angola",
                },
                {
                    "subject": "Kalandula Falls",
                    "predicate": "height",
                    "object": "105 m",
                    "evidence_span": "They are 105\u00a0m high.",
                },  # NBSP folds to a space
                {
                    "subject": "Kalandula Falls",
                    "predicate": "height",
                    "object": "1050 m",
                    "evidence_span": "They are 105 m high.",
                },
                {"subject": "X", "predicate": "y", "object": "z", "evidence_span": "not in the document"},
            ]
        }
    )
    score = _score_facts(doc, content)
    assert (score["valid_json"], score["n_facts"], score["n_span_verbatim"], score["n_object_in_span"]) == (
        True,
        4,
        3,
        2,
    )
    assert _score_facts(doc, "{not json")["valid_json"] is False
    fact = {"subject": "a", "predicate": "b", "object": "c", "evidence_span": "Angola"}
    fenced = f"```json\n{json.dumps({'facts': [fact]})}\n```"
    assert _score_facts(doc, fenced)["n_span_verbatim"] == 1
    assert _score_facts(doc, '{"facts": "none"}')["n_facts"] == 0


def test_timings_parses_llama_log_lines() -> None:
    log = (
        "Llama.generate: 111 prefix-match hit, remaining 195 prompt tokens to eval\n"
        "llama_perf_context_print: prompt eval time =       0.09 ms /   195 tokens\n"
        "llama_perf_context_print:        eval time =   20189.74 ms /   289 runs   (69.86 ms per token)\n"
    )
    assert _timings(log) == {"prompt_eval_tokens": 195, "decode_tps": 14.31}
    assert _timings("nothing") == {"prompt_eval_tokens": None, "decode_tps": None}
