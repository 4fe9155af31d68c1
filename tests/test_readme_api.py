"""The README's Python-API example runs, unchanged, and does what it says (issue 38, item 8).

The fenced block after ``<!-- readme-api-example -->`` in README.md is executed as written. Only
the model is substituted: ``KITUNE_CONFIG`` points ``load_config()`` at a config whose every LLM
role goes to :class:`kitune.testing.openai_stub.StubServer` (scripted replies: one fact per
sentence of a document, an agent that answers the gold answer when its look-up showed it, a
reflection that proposes an instruction), with the hash embedder and the deterministic ``match``
grader, so nothing reaches a network or a real LLM. The assertions read the example's own
variables: the KIs stored, the KI ``get_context`` returned, the eval's counts and the
optimisation's outcome — so the test fails when the example or the API it calls breaks.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from kitune.data.bundled import packaged_fixture
from kitune.data.loaders import load_corpus, load_questions
from kitune.testing.faults import dspy_docid, request_text
from kitune.testing.openai_stub import RecordedRequest, Reply, StubServer

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = "<!-- readme-api-example -->"
_SENTENCE = re.compile(r"[^.!?]+[.!?]")
_QUESTION = re.compile(r"Question: (?P<q>[^\n]*)")


def readme_example() -> str:
    """The Python block right after the marker in README.md."""
    text = README.read_text(encoding="utf-8")
    assert MARKER in text, f"README.md lost its {MARKER} marker before the Python-API example"
    m = re.search(r"```python\n(?P<code>.*?)```", text[text.index(MARKER) :], flags=re.DOTALL)
    assert m is not None, "no ```python block after the marker"
    return m.group("code")


class Gateway:
    """Scripted replies by request kind: extraction, the agent's turns, GEPA's reflection."""

    def __init__(self) -> None:
        fixture = packaged_fixture()
        self.docs = {d.docid: d.text for d in load_corpus(fixture)}
        self.gold = {q.query: q.answer for q in load_questions(fixture)}
        self.extract_calls = 0

    def facts(self, docid: str) -> list[dict[str, Any]]:
        out = []
        for sentence in (s.strip() for s in _SENTENCE.findall(self.docs.get(docid, ""))):
            words = sentence.rstrip(".!?").split()
            if len(words) < 4 or len(sentence) > 400:
                continue
            out.append(
                {
                    "title": " ".join(words[:12]),
                    "description": sentence,
                    "subject": words[0],
                    "predicate": "stated_as",
                    "object": " ".join(words[-3:]),
                    "evidence_span": sentence,
                    "confidence": 80,
                    "tags": [docid.lower()],
                }
            )
        return out[:3]

    def __call__(self, request: RecordedRequest) -> Reply:
        text = request_text(request)
        if "new_instruction" in text:
            instruction = (
                "Extract every fact the document states, one self-contained fact per sentence, "
                "quoting its evidence verbatim."
            )
            return Reply.ok(json.dumps({"new_instruction": instruction}), usage=(300, 40))
        docid = dspy_docid(request)
        if docid:
            self.extract_calls += 1
            return Reply.ok(json.dumps({"facts": self.facts(docid)}), usage=(200, 60))
        messages = request.body.get("messages", [])
        m = _QUESTION.search(text)
        question = m.group("q").strip() if m else ""
        if len(messages) <= 2:
            return Reply.ok(json.dumps({"tool": "get_context", "args": {"query": question}}), usage=(120, 10))
        seen = " ".join(str(x.get("content", "")) for x in messages[2:])
        gold = self.gold.get(question, "")
        answer = gold if gold and gold.lower() in seen.lower() else "unknown"
        reply = {"answer": {"explanation": "from the KIs", "exact_answer": answer, "confidence": 70}}
        return Reply.ok(json.dumps(reply), usage=(150, 12))


@pytest.mark.slow
def test_readme_python_api_example_runs_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg_path = tmp_path / "kitune.yaml"
    cfg_path.write_text(
        f"workdir: {tmp_path / 'work'}\n"
        "embedder: {type: hash, dim: 32}\n"
        "grading: {grader: match}\n"
        "agent: {max_steps: 4, concurrency: 1}\n"
        "extraction: {concurrency: 1}\n"
        "optimize: {seed: 0}\n"
        "lm:\n"
        "  gateway: {base_url_env: KI_GW_URL, api_key_env: KI_GW_KEY, default_model: m-small}\n",
        encoding="utf-8",
    )
    gateway = Gateway()
    code = readme_example()
    ns: dict[str, Any] = {"__name__": "readme_example"}
    out = io.StringIO()
    with StubServer(responder=gateway) as stub:
        monkeypatch.setenv("KI_GW_URL", stub.base_url)
        monkeypatch.setenv("KI_GW_KEY", "sk-test")
        monkeypatch.setenv("KITUNE_CONFIG", str(cfg_path))
        monkeypatch.chdir(tmp_path)
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(README), "exec"), ns)  # the README's own example, as written

    questions = load_questions(packaged_fixture())[:4]
    evidence = {d for q in questions for d in q.evidence_docids}
    report, store = ns["report"], ns["store"]
    # extraction: every evidence document of the 4 questions, and its KIs in the served table
    assert report.docs_total == len(evidence) == report.docs_done
    assert report.docs_failed == 0
    assert report.kis_written > 0
    # stable KI ids: the loop's own extraction of the same documents rewrote the same KIs
    extracted = [
        k
        for k in store.iter_kis()
        if k.payload.subtype == "dataset_fact" and set(k.evidence_doc_ids) <= evidence
    ]
    assert len(extracted) == report.kis_written
    assert f"{report.kis_written} KIs from {report.docs_done} documents" in out.getvalue()
    # get_context: the first question's look-up returns a KI of the example's store
    ctx = ns["get_context"](questions[0].query, store=store, cfg=ns["cfg"])
    assert ctx.kis and ctx.kis[0].title in out.getvalue()
    assert set(ctx.kis[0].evidence_doc_ids) <= evidence
    # the eval: 4 questions graded by match; the scripted agent answers what its look-up showed
    summary = ns["run"].summary
    assert (summary.n_total, summary.n_failed) == (4, 0)
    answered = [t for t in ns["run"].traces if t.exact_answer == t.gold_answer]
    assert summary.n_correct == len(answered) == 2  # the other two questions' answers were not shown
    assert f"{summary.n_correct}/4 correct" in out.getvalue()
    # the optimisation: one iteration over the extractor, decided and recorded
    opt = ns["opt"]
    assert len(opt.loop.history) == 1
    last = opt.loop.history[-1]
    assert last.reason and last.reason in out.getvalue()
    assert (opt.state_dir / "loop_state.json").is_file()
    # GEPA saw every minibatch already perfect, so nothing changed and nothing is staged
    assert not last.accepted and not opt.staged and opt.loop.accepted == 0
