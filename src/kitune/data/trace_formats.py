r"""Read a production agent's traces: OpenAI-style chat-message JSONL and MLflow traces.

Each input record becomes one :class:`ProductionTrace`: the question, the agent's final
answer, the gold answer and/or a correct/incorrect label, the agent's steps and tokens.
:mod:`kitune.service.workflows.traces` turns them into tuning questions and kitune trace records.

**OpenAI chat-message JSONL** — one conversation per line::

    {"id": "conv-17",                       # optional; else a content hash
     "messages": [{"role": "user", "content": "Which city …?"},
                  {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "search", "arguments": "{\"query\": \"…\"}"}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "…"},
                  {"role": "assistant", "content": "Seattle"}],
     "gold_answer": "Seattle", "aliases": ["Seattle, WA"], "correct": true,
     "usage": {"prompt_tokens": 5120, "completion_tokens": 64},
     "evidence_docids": ["d7"], "doc_ids_seen": ["d7", "d9"]}

``messages`` may also sit under ``request`` / ``body`` (OpenAI batch and stored-completion
exports), with the reply in ``response.choices[0].message``. The question is ``question`` /
``query`` if given, else the first user message; the final answer is ``final_answer`` /
``prediction`` if given, else the last assistant message without tool calls (its ``Exact
Answer:`` line when it has one). The gold answer is ``gold_answer`` / ``gold`` /
``expected_answer`` / ``expected_response`` / ``reference_answer``; the label is ``correct`` /
``is_correct`` / ``label`` (``true``/``false``, ``correct``/``incorrect``, ``yes``/``no``,
``pass``/``fail``, 1/0). Any of these keys may also sit in a ``metadata`` object. Per-message
``usage`` gives per-step tokens; a record-level ``usage`` gives the totals.

**MLflow traces** — ``Trace.to_json()`` output (``{"info": …, "data": {"spans": …}}``), a JSON
list of them, JSONL of them, or ``mlflow.search_traces(...)`` rows saved with
``df.to_json(path, orient="records", lines=True)`` (their ``trace`` column holds the full trace;
rows without it use ``request`` / ``response`` / ``assessments``). Parsed with MLflow's own
``Trace.from_dict``. Question: the root span's inputs (``question`` / ``query`` / ``input`` /
the last user message of ``messages``), else the request preview; final answer: the root span's
outputs (a string, ``exact_answer`` / ``answer`` / ``output`` / ``response`` / ``content``, or
a chat completion), else the response preview. Gold: the first *expectation* assessment named
``expected_response`` / ``expected_answer`` / ``gold_answer`` / ``answer`` (else any
expectation with a text value). Label: a *feedback* assessment named ``correctness`` /
``correct`` / ``is_correct`` / ``answer_correct`` / ``user_feedback`` (or the ``label_name``
given), else the ``kitune.correct`` tag. Steps: the spans in start order — an ``LLM`` /
``CHAT_MODEL`` span opens a step (its ``mlflow.chat.tokenUsage`` gives the tokens), a
``TOOL`` / ``RETRIEVER`` span fills that step's tool call (or opens one), and retriever outputs
give the documents seen.

Every tool step keeps the result text the agent was shown (``observation``: an OpenAI tool
message's content, a span's outputs as text; None when a tool call has no result message) and,
for a retriever span, the number of documents it returned (``n_results``); the failure signals
(:mod:`kitune.evaluation.signals`) read them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "LABEL_NAMES",
    "ProductionTrace",
    "TraceFormat",
    "detect_format",
    "parse_label",
    "parse_mlflow_trace",
    "parse_openai_record",
]

TraceFormat = Literal["openai", "mlflow"]

LABEL_NAMES = ("correctness", "correct", "is_correct", "answer_correct", "user_feedback", "label")
"""Assessment / field names read as a correct/incorrect label, in order."""

_GOLD_KEYS = ("gold_answer", "gold", "expected_answer", "expected_response", "reference_answer")
_EXPECTATION_NAMES = ("expected_response", "expected_answer", "gold_answer", "answer")
_TRUE = {"true", "correct", "yes", "pass", "passed", "1", "right", "thumbs_up", "good"}
_FALSE = {"false", "incorrect", "no", "fail", "failed", "0", "wrong", "thumbs_down", "bad"}
_EXACT = re.compile(r"^\s*\**exact answer\**\s*:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class ProductionTrace:
    """One production episode, whatever format it came in."""

    trace_id: str
    """The source's id (OpenAI ``id``, MLflow ``trace_id``) or ``sha256:<16 hex>`` of the record."""
    fmt: TraceFormat
    question: str
    final_answer: str
    """The agent's answer (its ``Exact Answer:`` line when present)."""
    gold_answer: str | None = None
    aliases: tuple[str, ...] = ()
    correct: bool | None = None
    """The production label; None when the source has none."""
    query_id: str | None = None
    """The source's question id, when it names one."""
    evidence_docids: tuple[str, ...] = ()
    gold_docids: tuple[str, ...] = ()
    doc_ids_seen: tuple[str, ...] = ()
    steps: list[dict[str, Any]] = field(default_factory=list)
    """Step records in the shape of ``kitune.evaluation.agent.Step.to_dict``."""
    input_tokens: int = 0
    output_tokens: int = 0
    status: str = "answered"
    """``answered``, or ``failed`` when the source marks the episode as an error."""
    errors: tuple[str, ...] = ()


def parse_label(value: Any) -> bool | None:
    """A correct/incorrect label from a bool, number or word; None when it is none of them."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        v = value.strip().lower()
        if v in _TRUE:
            return True
        if v in _FALSE:
            return False
    return None


def record_hash(record: Any) -> str:
    """``sha256:<16 hex>`` of a record's canonical JSON (the id of a record that has none)."""
    text = json.dumps(record, sort_keys=True, default=str, ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def detect_format(record: Mapping[str, Any]) -> TraceFormat | None:
    """``mlflow`` for a trace dict or search_traces row, ``openai`` for chat messages, else None."""
    if ("info" in record and "data" in record) or ("trace_id" in record and "messages" not in record):
        return "mlflow"
    if "messages" in record or any(
        isinstance(record.get(k), Mapping) and "messages" in record[k] for k in ("request", "body")
    ):
        return "openai"
    return None


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "\n".join(
            str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content
        ).strip()
    return json.dumps(content, ensure_ascii=False, default=str)


def _exact(answer: str) -> str:
    m = _EXACT.search(answer)
    return (m.group(1) if m else answer).strip()


def _strs(value: Any) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Sequence):
        return tuple(str(v) for v in value if v not in (None, ""))
    return ()


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _first(record: Mapping[str, Any], keys: Sequence[str]) -> Any:
    for src in (record, _mapping(record.get("metadata"))):
        for k in keys:
            if src.get(k) not in (None, ""):
                return src[k]
    return None


def _gold(record: Mapping[str, Any]) -> tuple[str | None, tuple[str, ...]]:
    raw: Any = _first(record, _GOLD_KEYS)
    aliases = _strs(_first(record, ("aliases", "answer_aliases")))
    if isinstance(raw, list):
        raw, aliases = (raw[0] if raw else None), (*_strs(raw[1:]), *aliases)
    text = str(raw).strip() if raw is not None else ""
    return text or None, aliases


def _label(record: Mapping[str, Any]) -> bool | None:
    for key in ("correct", "is_correct", *LABEL_NAMES):
        value = _first(record, (key,))
        if value is not None:
            parsed = parse_label(value)
            if parsed is not None:
                return parsed
    return None


def _usage(u: Any) -> tuple[int, int]:
    if not isinstance(u, Mapping):
        return 0, 0
    i = u.get("prompt_tokens", u.get("input_tokens", 0)) or 0
    o = u.get("completion_tokens", u.get("output_tokens", 0)) or 0
    return int(i), int(o)


def _args(raw: Any) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            return {"arguments": raw}
        return dict(parsed) if isinstance(parsed, Mapping) else {"arguments": parsed}
    return {}


def _step(index: int, kind: str, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "index": index,
        "kind": kind,
        "tool": None,
        "args": {},
        "observation_chars": 0,
        "doc_ids": [],
        "error": None,
        "input_tokens": 0,
        "output_tokens": 0,
        "reply": "",
    }
    return {**base, **kw}


def _messages(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    msgs: Any = record.get("messages")
    if msgs is None:
        for k in ("request", "body"):
            if isinstance(record.get(k), Mapping) and "messages" in record[k]:
                msgs = record[k]["messages"]
                break
    out = [m for m in (msgs or []) if isinstance(m, Mapping)]
    response = record.get("response")
    if isinstance(response, Mapping) and isinstance(response.get("body"), Mapping):
        response = response["body"]  # batch output lines wrap the completion in response.body
    if isinstance(response, Mapping) and response.get("choices"):
        message = response["choices"][0].get("message")
        if isinstance(message, Mapping):
            out.append({**message, "usage": response.get("usage")})
    return out


def parse_openai_record(record: Mapping[str, Any]) -> ProductionTrace:
    """One OpenAI-style conversation (see the module docstring for the accepted keys).

    Raises:
        ValueError: no question (no ``question`` key and no user message).
    """
    msgs = _messages(record)
    question = _first(record, ("question", "query"))
    if question is None:
        question = next((_text(m.get("content")) for m in msgs if m.get("role") == "user"), "")
    if not str(question).strip():
        raise ValueError("no question: give a 'question' field or a user message")
    observations = {
        str(m.get("tool_call_id")): _text(m.get("content")) for m in msgs if m.get("role") == "tool"
    }
    steps: list[dict[str, Any]] = []
    final = ""
    for m in msgs:
        if m.get("role") != "assistant":
            continue
        in_tok, out_tok = _usage(m.get("usage"))
        calls = [c for c in m.get("tool_calls") or [] if isinstance(c, Mapping)]
        if not calls:
            final = _text(m.get("content"))
            steps.append(
                _step(len(steps) + 1, "answer", input_tokens=in_tok, output_tokens=out_tok, reply=final[:500])
            )
            continue
        for j, call in enumerate(calls):
            fn = _mapping(call.get("function"))
            steps.append(
                _step(
                    len(steps) + 1,
                    "tool",
                    tool=str(fn.get("name") or call.get("name") or "tool"),
                    args=_args(fn.get("arguments", call.get("arguments"))),
                    observation_chars=len(observations.get(str(call.get("id")), "")),
                    observation=observations.get(str(call.get("id"))),
                    input_tokens=in_tok if j == 0 else 0,
                    output_tokens=out_tok if j == 0 else 0,
                )
            )
    given = _first(record, ("final_answer", "prediction"))
    answer = _exact(_text(given) if given is not None else final)
    in_total, out_total = _usage(record.get("usage"))
    if not in_total:
        in_total = sum(s["input_tokens"] for s in steps)
        out_total = sum(s["output_tokens"] for s in steps)
    gold, aliases = _gold(record)
    qid = _first(record, ("query_id", "question_id"))
    rid = record.get("id") or _first(record, ("trace_id", "conversation_id"))
    error = _first(record, ("error",))
    return ProductionTrace(
        trace_id=str(rid) if rid else record_hash(record),
        fmt="openai",
        question=str(question).strip(),
        final_answer=answer,
        gold_answer=gold,
        aliases=aliases,
        correct=_label(record),
        query_id=str(qid) if qid is not None else None,
        evidence_docids=_strs(_first(record, ("evidence_docids", "evidence_doc_ids"))),
        gold_docids=_strs(_first(record, ("gold_docids", "gold_doc_ids"))),
        doc_ids_seen=_strs(_first(record, ("doc_ids_seen", "doc_ids", "retrieved_doc_ids"))),
        steps=steps,
        input_tokens=in_total,
        output_tokens=out_total,
        status="failed" if error else "answered",
        errors=(str(error),) if error else (),
    )


# -- MLflow ---------------------------------------------------------------------------------------


def _question_from(inputs: Any) -> str:
    if isinstance(inputs, str):
        return inputs
    if isinstance(inputs, Mapping):
        for k in ("question", "query", "input", "prompt", "request"):
            if isinstance(inputs.get(k), str) and inputs[k].strip():
                return str(inputs[k])
        msgs = inputs.get("messages")
        if isinstance(msgs, list):
            users = [
                _text(m.get("content")) for m in msgs if isinstance(m, Mapping) and m.get("role") == "user"
            ]
            if users:
                return users[-1]
    return ""


def _answer_from(outputs: Any) -> str:
    if isinstance(outputs, str):
        return outputs
    if isinstance(outputs, Mapping):
        for k in ("exact_answer", "answer", "output", "response", "content", "text"):
            if isinstance(outputs.get(k), str):
                return str(outputs[k])
        choices = outputs.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
            return _text((choices[0].get("message") or {}).get("content"))
    return ""


def _docs_from(outputs: Any) -> list[str]:
    items = outputs if isinstance(outputs, list) else []
    out: list[str] = []
    for d in items:
        if not isinstance(d, Mapping):
            continue
        meta = _mapping(d.get("metadata"))
        did = d.get("id") or d.get("docid") or d.get("doc_id") or meta.get("doc_uri") or meta.get("docid")
        if did:
            out.append(str(did))
    return out


def _trace_dict(record: Mapping[str, Any]) -> Mapping[str, Any] | None:
    if "info" in record and "data" in record:
        return record
    raw = record.get("trace")
    if isinstance(raw, str) and raw.strip().startswith("{"):
        return dict(json.loads(raw))
    return raw if isinstance(raw, Mapping) else None


def _assessment_values(assessments: Sequence[Any]) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """``(expectations, feedbacks)`` as ``(name, value)`` from entities or their dicts."""
    exps: list[tuple[str, Any]] = []
    fbs: list[tuple[str, Any]] = []
    for a in assessments:
        if isinstance(a, Mapping):
            name = str(a.get("assessment_name") or a.get("name") or "")
            if isinstance(a.get("expectation"), Mapping):
                exps.append((name, a["expectation"].get("value")))
            elif isinstance(a.get("feedback"), Mapping):
                fbs.append((name, a["feedback"].get("value")))
            continue
        kind = type(a).__name__
        (exps if kind == "Expectation" else fbs).append(
            (str(getattr(a, "name", "")), getattr(a, "value", None))
        )
    return exps, fbs


def _gold_label(
    assessments: Sequence[Any], tags: Mapping[str, Any], label_name: str | None
) -> tuple[str | None, tuple[str, ...], bool | None]:
    exps, fbs = _assessment_values(assessments)
    gold: str | None = None
    aliases: tuple[str, ...] = ()
    for wanted in _EXPECTATION_NAMES:
        for name, value in exps:
            if name == wanted and value not in (None, ""):
                if isinstance(value, list):
                    gold, aliases = str(value[0]), _strs(value[1:])
                else:
                    gold = str(value)
                break
        if gold is not None:
            break
    if gold is None:
        gold = next((str(v) for _n, v in exps if isinstance(v, str) and v.strip()), None)
    names = (label_name,) if label_name else LABEL_NAMES
    label: bool | None = None
    for wanted in names:
        label = next((parse_label(v) for n, v in fbs if n == wanted and parse_label(v) is not None), None)
        if label is not None:
            break
    if label is None and not label_name:
        label = parse_label(tags.get("kitune.correct"))
    return gold, aliases, label


def _span_error(span: Any) -> str | None:
    status = getattr(span, "status", None)
    code = getattr(getattr(status, "status_code", None), "value", getattr(status, "status_code", None))
    return (getattr(status, "description", "") or "error") if code == "ERROR" else None


def _kitune_step(span: Any, index: int) -> dict[str, Any]:
    """A span written by ``Tracker.log_episodes``: its ``kitune.*`` attributes are the step."""
    a = span.attributes or {}
    return _step(
        index,
        str(a.get("kitune.kind") or "tool"),
        tool=a.get("kitune.tool") or None,
        args=dict(span.inputs) if isinstance(span.inputs, Mapping) else {},
        observation_chars=int(a.get("kitune.observation_chars") or 0),
        doc_ids=[str(d) for d in a.get("kitune.doc_ids") or []],
        error=a.get("kitune.error") or None,
        input_tokens=int(a.get("kitune.input_tokens") or 0),
        output_tokens=int(a.get("kitune.output_tokens") or 0),
    )


def _mlflow_steps(spans: Sequence[Any]) -> tuple[list[dict[str, Any]], list[str]]:
    steps: list[dict[str, Any]] = []
    seen: list[str] = []
    open_llm: dict[str, Any] | None = None
    for span in sorted((s for s in spans if s.parent_id is not None), key=lambda s: s.start_time_ns):
        kind = str(span.span_type or "")
        attrs = span.attributes or {}
        if "kitune.kind" in attrs:
            steps.append(_kitune_step(span, len(steps) + 1))
            seen.extend(steps[-1]["doc_ids"])
            continue
        err = _span_error(span)
        if kind in ("LLM", "CHAT_MODEL"):
            usage = attrs.get("mlflow.chat.tokenUsage") or {}
            open_llm = _step(
                len(steps) + 1,
                "answer",
                input_tokens=int(usage.get("input_tokens", 0) or 0),
                output_tokens=int(usage.get("output_tokens", 0) or 0),
                error=err,
                reply=_answer_from(span.outputs)[:500],
            )
            steps.append(open_llm)
        elif kind in ("TOOL", "RETRIEVER"):
            docs = _docs_from(span.outputs) if kind == "RETRIEVER" else []
            seen.extend(docs)
            obs = span.outputs if isinstance(span.outputs, str) else json.dumps(span.outputs, default=str)
            call = {
                "kind": "tool",
                "tool": span.name,
                "args": dict(span.inputs) if isinstance(span.inputs, Mapping) else {"input": span.inputs},
                "observation_chars": len(obs or ""),
                "observation": obs or "",
                "n_results": len(span.outputs)
                if kind == "RETRIEVER" and isinstance(span.outputs, list)
                else None,
                "doc_ids": docs,
                "error": err,
            }
            if open_llm is not None:  # the model call that asked for this tool
                open_llm.update(call)
            else:
                steps.append({**_step(len(steps) + 1, "tool"), **call})
            open_llm = None
    return steps, list(dict.fromkeys(seen))


def parse_mlflow_trace(record: Mapping[str, Any], *, label_name: str | None = None) -> ProductionTrace:
    """One MLflow trace (``Trace.to_json()`` dict) or ``search_traces`` row (see the module docstring).

    Raises:
        ValueError: no question could be found; ImportError: mlflow is not installed.
    """
    from mlflow.entities import Trace as MlflowTrace

    full = _trace_dict(record)
    if full is not None:
        mt = MlflowTrace.from_dict(dict(full))
        info, spans = mt.info, list(mt.data.spans)
        root = next((s for s in spans if s.parent_id is None), None)
        question = _question_from(root.inputs if root else None) or str(info.request_preview or "")
        answer = _answer_from(root.outputs if root else None) or str(info.response_preview or "")
        tags = dict(info.tags or {})
        gold, aliases, label = _gold_label(list(info.assessments or []), tags, label_name)
        steps, seen = _mlflow_steps(spans)
        usage = info.token_usage or {}
        trace_id = str(info.trace_id)
        failed = str(getattr(info.state, "value", info.state)) == "ERROR"
        qid = tags.get("kitune.query_id") or (info.trace_metadata or {}).get("query_id")
    else:
        question = _question_from(record.get("request")) or _text(record.get("request"))
        answer = _answer_from(record.get("response")) or _text(record.get("response"))
        tags = dict(record.get("tags") or {})
        gold, aliases, label = _gold_label(list(record.get("assessments") or []), tags, label_name)
        steps, seen, usage = [], [], {}
        trace_id = str(record.get("trace_id") or record_hash(record))
        failed = str(record.get("state")) == "ERROR"
        qid = tags.get("kitune.query_id") or (record.get("trace_metadata") or {}).get("query_id")
    if not question.strip():
        raise ValueError("no question: the root span has no inputs and the trace no request preview")
    in_tok = int(usage.get("input_tokens", 0) or 0) or sum(s["input_tokens"] for s in steps)
    out_tok = int(usage.get("output_tokens", 0) or 0) or sum(s["output_tokens"] for s in steps)
    return ProductionTrace(
        trace_id=trace_id,
        fmt="mlflow",
        question=question.strip(),
        final_answer=_exact(answer),
        gold_answer=gold,
        aliases=aliases,
        correct=label,
        query_id=str(qid) if qid else None,
        doc_ids_seen=tuple(seen),
        steps=steps,
        input_tokens=in_tok,
        output_tokens=out_tok,
        status="failed" if failed else "answered",
    )
