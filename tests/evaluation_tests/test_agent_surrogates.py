"""The agent's replies and tool-call arguments holding half an emoji pair (issue 25).

The JSON escape ``"\\ud83d"`` decodes to a lone surrogate; the tool then searched with a string no
store can encode and the trace could not be written. Both tool modes read it as U+FFFD.
"""

from __future__ import annotations

import json

import pytest
from eval_fakes import DOCS, FakeCorpusStore

from kitune.data.loaders import Question
from kitune.evaluation.agent import Agent
from kitune.evaluation.metrics import Trace, build_trace
from kitune.evaluation.tools import baseline_toolbox
from kitune.testing.chat import ScriptedChatModel, native_turn

# As the model wrote them: ASCII JSON with escapes (a pair, then a lone high half).
SEARCH = '{"tool": "search", "args": {"query": "capital France \\ud83d\\ude00 \\ud83d"}}'
ANSWER = '{"answer": {"explanation": "see [d1] \\ud83d", "exact_answer": "Paris \\ud83d", "confidence": 80}}'
Q = Question(query_id="q1", query="Capital of France?", answer="Paris", evidence_docids=("d1",))


@pytest.mark.parametrize("mode", ["json", "native"])
def test_half_an_emoji_pair_is_read_as_fffd_and_the_trace_is_written(mode: str) -> None:
    script = [SEARCH, ANSWER]
    turns = script if mode == "json" else [native_turn(t, call_id=f"c{i}") for i, t in enumerate(script)]
    assert all(t.isascii() for t in script)
    store = FakeCorpusStore(DOCS)
    episode = Agent(ScriptedChatModel(turns), baseline_toolbox(store), tool_mode=mode).run(Q.query)  # type: ignore[arg-type]
    assert episode.status == "answered"
    assert store.searches == ["capital France \U0001f600 \ufffd"]
    assert episode.steps[0].args == {"query": "capital France \U0001f600 \ufffd"}
    assert (episode.exact_answer, episode.explanation) == ("Paris \ufffd", "see [d1] \ufffd")
    trace = build_trace(Q, "baseline", episode)
    line = trace.to_json().encode("utf-8")  # what the harness appends to traces.jsonl
    assert Trace.from_dict(json.loads(line)).exact_answer == "Paris \ufffd"
