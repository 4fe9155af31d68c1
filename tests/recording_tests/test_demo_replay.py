"""`kitune demo --record` against a scripted provider, then `kitune demo --replay` offline: same tables."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kitune.cli import _register, app
from kitune.lm import reset_format_memory
from kitune.recording import reset_recorders
from kitune.testing.openai_stub import RecordedRequest, Reply, StubServer

BASE = """corpus_name: fixture
embedder: {type: hash, dim: 64}
lm:
  gateway: {base_url_env: KI_GW_URL, api_key_env: KI_GW_KEY, default_model: stub-small}
extraction: {max_facts_per_doc: 6, concurrency: 1}
retrieval: {default_size: 5, search_hits: 3, snippets_per_hit: 1, snippet_chars: 300}
agent: {max_steps: 6, observation_max_chars: 1500, concurrency: 1}
optimize: {iterations: 1, validation_fraction: 0.5, seed: 0}
"""


def _field(text: str, name: str) -> str:
    m = re.search(r"\[\[ ## " + name + r" ## \]\]\n(.*?)(?:\n\n\[\[ ## |\Z)", text, re.S)
    return m.group(1).strip() if m else ""


def _responder(req: RecordedRequest) -> Reply:
    msgs: list[dict[str, Any]] = req.body.get("messages", [])
    system = str(msgs[0].get("content")) if msgs else ""
    user = str(msgs[-1].get("content")) if msgs else ""
    if system.startswith("You answer a question"):  # the agent, JSON protocol
        if not any("Observation from" in str(m.get("content")) for m in msgs):
            tool = "get_context" if "get_context" in system else "search"
            return Reply.ok(
                json.dumps({"tool": tool, "args": {"query": msgs[1]["content"][10:70]}}), usage=(300, 20)
            )
        words = user.split()
        answer = {
            "explanation": "see the observation",
            "exact_answer": words[1] if len(words) > 1 else "x",
            "confidence": 60,
        }
        return Reply.ok(json.dumps({"answer": answer}), usage=(900, 25))
    if "facts_json" in system:  # the extractor: one fact quoting the document's first sentence
        sent = re.split(r"(?<=[.!?])\s", _field(user, "text"))[0][:180]
        words = re.findall(r"[A-Za-z]+", sent)
        facts = []
        if len(words) >= 4:
            facts.append(
                {
                    "title": f"{words[0]} {words[1]} is linked to {words[-1]}.",
                    "description": f"{sent} The document says so.",
                    "subject": f"{words[0]} {words[1]}",
                    "predicate": "linked_to",
                    "object": words[-1],
                    "evidence_span": sent,
                    "confidence": 70,
                    "tags": ["demo"],
                }
            )
        return Reply.ok(json.dumps({"facts_json": json.dumps(facts)}), usage=(500, 60))
    if "correct_answer" in system or "correct_answer" in user:  # the judge
        verdict = "yes" if len(user) % 2 else "no"
        return Reply.ok(
            f"[[ ## grading ## ]]\nextracted_final_answer: x\nreasoning: r\ncorrect: {verdict}\n"
            "confidence: 70\n\n[[ ## completed ## ]]",
            usage=(200, 30),
        )
    return Reply.ok(
        json.dumps({"reasoning": "r", "new_instruction": "Extract facts carefully."}), usage=(100, 10)
    )


@pytest.fixture
def fresh() -> Iterator[None]:
    reset_recorders()
    reset_format_memory()
    yield
    reset_recorders()
    reset_format_memory()


def _demo(root: Path, name: str, flag: list[str], fixture_dir: Path) -> Any:
    cfg = root / f"{name}.yaml"
    cfg.write_text(BASE + f"workdir: {root / name}\n", encoding="utf-8")
    args = [
        "demo",
        "--data",
        str(fixture_dir),
        "--config",
        str(cfg),
        "--questions",
        "2",
        "--distractors",
        "1",
        "--max-metric-calls",
        "2",
        "--knob-trials",
        "0",
        "--no-progress",
        *flag,
    ]
    return CliRunner().invoke(app, args)


def _table(output: str) -> str:
    return output[output.index("kitune demo: baseline") : output.index("report:")]


def _traces(root: Path) -> dict[str, list[dict[str, Any]]]:
    out = {}
    demo = root / "demo"
    for path in sorted([*demo.glob("runs/*.jsonl"), *demo.glob("optimize/*/evals/*.jsonl")]):
        if path.name == "observations.jsonl":  # the loop's look-up log, not traces
            continue
        rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
        for r in rows:
            r.pop("wall_time_s")
        out[str(path.relative_to(demo))] = sorted(rows, key=lambda r: r["query_id"])
    return out


@pytest.mark.slow
def test_demo_replays_offline_with_the_same_table_and_traces(
    tmp_path: Path, fixture_dir: Path, monkeypatch: pytest.MonkeyPatch, fresh: None
) -> None:
    _register()
    rec = tmp_path / "rec"
    with StubServer(responder=_responder) as stub:
        monkeypatch.setenv("KI_GW_URL", stub.base_url)
        monkeypatch.setenv("KI_GW_KEY", "sk-stub-0000")
        first = _demo(tmp_path, "a", ["--record", str(rec)], fixture_dir)
        assert first.exit_code == 0, first.output
        provider_calls = len(stub.chat_requests)
    recorded = [json.loads(x) for x in (rec / "calls.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(recorded) == provider_calls > 20
    assert {"extract", "agent", "judge"} <= {c["role"] for c in recorded}
    monkeypatch.delenv("KI_GW_URL")
    monkeypatch.delenv("KI_GW_KEY")
    reset_format_memory()
    second = _demo(tmp_path, "b", ["--replay", str(rec)], fixture_dir)
    assert second.exit_code == 0, second.output
    assert f"replayed {provider_calls} LLM call(s)" in " ".join(second.output.split())
    assert _table(first.output) == _table(second.output)
    ta, tb = _traces(tmp_path / "a"), _traces(tmp_path / "b")
    assert len(ta) >= 3 and sum(len(v) for v in ta.values()) >= 6 and ta == tb
