"""Failure signals read off one agent trace, labelled or not: what production can see without gold answers.

Pure and deterministic: the same trace (and the same store facts passed in) always gives the
same signals. A trace is a :class:`~kitune.evaluation.metrics.Trace` — kitune's own episodes or an
imported production trace (:func:`kitune.service.workflows.traces.to_trace`); each step is a
``Step.to_dict`` record. The signals and their exact rules:

``empty_retrieval``
    A retrieval step (a KI look-up tool, or a raw *search* tool — not a fetch) that ran without
    error and returned nothing: its ``n_results`` is 0 when the tool counted results; else its
    recorded ``observation`` text is empty, ``[]``, ``{}``, ``null`` or one of kitune's
    "nothing matched" lines (``no KIs found for: …``, ``No knowledge indicators matched …``,
    ``No documents matched …``); else (no count, no text) it showed no document and 0
    characters. A KI look-up whose KIs are all below ``confidence_floor`` (when the KIs'
    confidences are known) is empty too: nothing above the floor.
``fell_back_to_raw``
    A raw tool step (search or fetch) that ran without error *after* the trace's first KI
    look-up: the KIs did not answer and the agent read raw documents. The documents those
    steps showed are the trace's *fallback documents* (when no step of the trace records doc
    ids, as in chat-message traces: the trace's ``doc_ids_seen`` that a raw result cites as
    ``[<doc id>]``, else all of them).
``looped``
    The same look-up repeated: two or more tool steps (``loop_min_repeats``) with the same
    *look-up key* — the tool name plus its query (``query``, else ``docid``, else the sorted
    argument values) normalised by :func:`normalise_query` (Unicode folded, case-folded, only
    word characters kept, whitespace collapsed), so ``"Marie  Curie?"`` and ``"marie curie"``
    are the same look-up.
``budget_exhausted``
    The step budget ran out: status ``budget_exhausted`` (or ``context_overflow``), a timeout,
    a force-commit, or a ``force_commit`` step.
``answer_unsupported``
    The agent answered, and its answer is absent from everything it was shown: no recorded tool
    result (observation text of the steps that ran without error — KI titles and descriptions,
    search snippets, fetched documents) contains it as whole words after
    :func:`kitune.text.normalize_answer` on both sides (:func:`kitune.text.contains_answer`).
    A trace with no tool step at all is unsupported when it answers. A trace whose tool steps
    recorded no observation text (traces written before observations were kept, kitune
    episodes logged to MLflow) cannot be assessed: ``supported is None``, no signal.
``coverage_gap``
    A question entity that no KI covers. Entities are found without an LLM
    (:func:`question_entities`): runs of capitalised words (leading question and function words
    dropped) and quoted phrases of the question, plus any ``entity_tags`` a step's arguments
    carry (a query plan); each becomes an ``entity:<slug>`` slug. An entity is covered when a
    KI carries its ``entity:<slug>`` tag (``known_entities``, from the store). Without
    ``known_entities`` this signal is not computed.
``query_error``
    A tool step that returned an error, except a blocked identical repeat (that is a loop) and
    the in-context fallback gate refusing an early search (a model mistake, not a failed query).
    A step's error is its ``error`` field, or — in chat traces, which have none — a result text
    starting ``ERROR:`` (:func:`step_error`). Steps with an error count for no other signal.

Each signal carries its evidence: the 1-based step indices (spans) and a detail line.
:func:`aggregate_signals` sums a batch per signal, per KI shown (KI ids read off the look-up
observations, ``[ki-…]``), per document shown and per question entity.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from kitune.evaluation.metrics import Trace
from kitune.ki import slugify
from kitune.text import contains_answer, fold_text

__all__ = [
    "FETCH_TOOLS",
    "LOOKUP_TOOLS",
    "RAW_TOOLS",
    "SIGNAL_KINDS",
    "SignalHit",
    "SignalKind",
    "SignalReport",
    "SignalRules",
    "TraceSignals",
    "aggregate_signals",
    "compute_signals",
    "ki_ids_shown",
    "lookup_key",
    "normalise_query",
    "question_entities",
    "signals_markdown",
    "step_error",
]

SignalKind = Literal[
    "empty_retrieval",
    "fell_back_to_raw",
    "looped",
    "budget_exhausted",
    "answer_unsupported",
    "coverage_gap",
    "query_error",
]
SIGNAL_KINDS: tuple[SignalKind, ...] = get_args(SignalKind)
"""Every signal, in report order (the order :data:`SignalKind` lists them)."""

LOOKUP_TOOLS = frozenset({"get_context"})
"""Tools that look up KIs (kitune's agent tool and MCP tool)."""
RAW_TOOLS = frozenset({"search", "search_documents", "get_by_doc_id", "get_document"})
"""Tools that read raw documents (kitune's baseline tools and MCP tools)."""
FETCH_TOOLS = frozenset({"get_by_doc_id", "get_document"})
"""Raw tools that fetch one document by id (never "empty": a missing id is an error)."""

_EMPTY_TEXT = re.compile(
    r"^\s*(?:|\[\s*\]|\{\s*\}|null|no KIs found for:.*"
    r"|No knowledge indicators matched.*|No documents matched.*)\s*$",
    re.DOTALL,
)
_KI_ID = re.compile(r"(?<![\w-])(ki-[0-9a-f]{24})(?![\w-])")
_GATE_ERRORS = ("not allowed yet", "search is a fallback")
"""The in-context fallback gate's refusal (its error field, and its text as the agent saw it)."""
_BLOCKED_TEXT = "identical call already returned"
"""How a blocked identical repeat reads in the agent's transcript."""
_QUOTED = re.compile(r"[\"“”]([^\"“”]{2,80})[\"“”]")
_CAP_RUN = re.compile(r"(?:[A-Z][\w'’.-]*)(?:\s+(?:of|the|de|von|van|[A-Z][\w'’.-]*))*")
_STOP = frozenset(
    "which what who whom whose when where why how in on at the a an is was were are did does do of "
    "for to from by with and or name list give tell i it its this that these those if after before "
    "during since as can could would should will has have had".split()
)


def normalise_query(text: str) -> str:
    """The look-up identity of a query: folded, case-folded, word characters only, one space apart.

    ``"Marie  Curie?"`` → ``"marie curie"``; ``"Zürich—Bern"`` → ``"zürich bern"``.
    """
    return " ".join(re.findall(r"\w+", fold_text(text).casefold()))


def lookup_key(step: Mapping[str, Any]) -> str | None:
    """``<tool>:<normalised query>`` of a tool step (see the module docstring); None for other steps."""
    tool = step.get("tool")
    if step.get("kind") != "tool" or not tool:
        return None
    args = step.get("args") or {}
    if not isinstance(args, Mapping):
        return f"{tool}:{normalise_query(str(args))}"
    for name in ("query", "docid", "doc_id", "input"):
        if isinstance(args.get(name), str | int):
            return f"{tool}:{normalise_query(str(args[name]))}"
    values = " ".join(json.dumps(args[k], sort_keys=True, default=str) for k in sorted(args))
    return f"{tool}:{normalise_query(values)}"


def ki_ids_shown(step: Mapping[str, Any]) -> tuple[str, ...]:
    """KI ids a step's observation showed (``ki-<24 hex>`` tokens: ``[ki-…]``, JSON ids), first-seen order."""
    text = step.get("observation")
    if not isinstance(text, str):
        return ()
    return tuple(dict.fromkeys(_KI_ID.findall(text)))


def question_entities(question: str, steps: Sequence[Mapping[str, Any]] = ()) -> tuple[str, ...]:
    """Entity slugs of a question, found without an LLM (see the module docstring).

    Args:
        question: the question text.
        steps: the trace's steps; ``entity_tags`` in a step's arguments (``entity:<slug>``) are added.

    Returns:
        Slugs (``marie-curie``), first-seen order, no duplicates, none empty.
    """
    text = " ".join(question.split())
    names = [m.group(1) for m in _QUOTED.finditer(text)]
    for run in _CAP_RUN.findall(text):
        words = run.split()
        while words and words[0].lower().strip("'’.") in _STOP:
            words = words[1:]
        while words and words[-1].lower() in ("of", "the", "de", "von", "van"):
            words = words[:-1]
        if words:
            names.append(" ".join(words))
    slugs = [slugify(n) for n in names]
    for step in steps:
        args = step.get("args") or {}
        tags = args.get("entity_tags") if isinstance(args, Mapping) else None
        if isinstance(tags, list | tuple):
            slugs.extend(str(t).split(":", 1)[-1] for t in tags if str(t).startswith("entity:"))
    return tuple(s for s in dict.fromkeys(slugs) if s)


@dataclass(frozen=True)
class SignalRules:
    """Which tools are which, and the thresholds of the signals."""

    lookup_tools: frozenset[str] = LOOKUP_TOOLS
    raw_tools: frozenset[str] = RAW_TOOLS
    fetch_tools: frozenset[str] = FETCH_TOOLS
    confidence_floor: int = 0
    """0–100: a look-up whose KIs all score below it counts as empty (when confidences are known)."""
    loop_min_repeats: int = 2
    """Occurrences of one look-up key that make a loop (≥ 2)."""


@dataclass(frozen=True)
class SignalHit:
    """One signal in one trace, with its evidence."""

    kind: SignalKind
    steps: tuple[int, ...] = ()
    """1-based indices of the steps that show it (empty for whole-trace signals)."""
    detail: str = ""
    """What was seen: the query, the error, the entities, the answer."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return {"kind": self.kind, "steps": list(self.steps), "detail": self.detail}


@dataclass(frozen=True)
class TraceSignals:
    """Every signal of one trace plus what the aggregations need."""

    trace_id: str
    query_id: str
    question: str
    answer: str
    correct: bool | None
    """The trace's verdict when it was graded (labelled), else None."""
    hits: tuple[SignalHit, ...] = ()
    kis_shown: tuple[str, ...] = ()
    docs_shown: tuple[str, ...] = ()
    fallback_docs: tuple[str, ...] = ()
    """Documents shown by raw steps after the first KI look-up."""
    entities: tuple[str, ...] = ()
    missing_entities: tuple[str, ...] = ()
    """Entities no KI covers (empty when coverage was not computed)."""
    empty_lookups: tuple[str, ...] = ()
    """Queries (as written) of the KI look-ups that returned nothing, first-seen order."""
    supported: bool | None = None
    """The answer appears in what was shown; None when there is no answer or it cannot be assessed."""

    @property
    def kinds(self) -> frozenset[SignalKind]:
        """The signal kinds present."""
        return frozenset(h.kind for h in self.hits)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return {
            "trace_id": self.trace_id,
            "query_id": self.query_id,
            "question": self.question,
            "answer": self.answer,
            "correct": self.correct,
            "signals": [h.to_dict() for h in self.hits],
            "kis_shown": list(self.kis_shown),
            "docs_shown": list(self.docs_shown),
            "fallback_docs": list(self.fallback_docs),
            "entities": list(self.entities),
            "missing_entities": list(self.missing_entities),
            "empty_lookups": list(self.empty_lookups),
            "supported": self.supported,
        }


def step_error(step: Mapping[str, Any]) -> str | None:
    """A tool step's error: its ``error``, else what its observation says went wrong.

    That is the first line of an observation starting ``ERROR:``, or the ``message`` of an
    observation that is a JSON error object (``{"error": {...}}``, what kitune's agent sends).

    Chat-message traces carry no error field: a tool result written as ``ERROR: …`` (kitune's
    tools, and many others, report failures that way) is read as the error.
    """
    if step.get("error"):
        return str(step["error"])
    text = step.get("observation")
    if isinstance(text, str) and text.lstrip().startswith("ERROR:"):
        return text.lstrip()[len("ERROR:") :].strip().split("\n", 1)[0]
    if isinstance(text, str) and text.lstrip().startswith('{"error"'):  # kitune's JSON error object
        try:
            body = json.JSONDecoder().raw_decode(text.lstrip())[0].get("error")
        except (json.JSONDecodeError, AttributeError):
            return None
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"])
    return None


def _query_text(step: Mapping[str, Any]) -> str:
    args = step.get("args") or {}
    if isinstance(args, Mapping):
        for name in ("query", "docid", "doc_id", "input"):
            if isinstance(args.get(name), str | int):
                return str(args[name])
        return json.dumps(dict(args), sort_keys=True, default=str)
    return str(args)


def _is_empty(step: Mapping[str, Any], ki_confidence: Mapping[str, int] | None, floor: int) -> bool:
    n = step.get("n_results")
    if isinstance(n, int) and not isinstance(n, bool):
        empty = n == 0
    elif isinstance(step.get("observation"), str):
        empty = bool(_EMPTY_TEXT.match(step["observation"]))
    elif step.get("observation") is None and "observation" in step:
        return False  # the result message is missing: nothing known
    else:
        empty = not step.get("doc_ids") and not int(step.get("observation_chars") or 0)
    if empty or floor <= 0 or ki_confidence is None:
        return empty
    shown = [k for k in ki_ids_shown(step) if k in ki_confidence]
    return bool(shown) and all(ki_confidence[k] < floor for k in shown)


def compute_signals(
    trace: Trace,
    *,
    trace_id: str | None = None,
    rules: SignalRules | None = None,
    known_entities: Collection[str] | None = None,
    ki_confidence: Mapping[str, int] | None = None,
) -> TraceSignals:
    """Every signal of one trace (rules in the module docstring).

    Args:
        trace: the trace (kitune's or imported); its steps are ``Step.to_dict`` records.
        trace_id: the id evidence refers to (default: the trace's query id).
        rules: tool groups and thresholds (default :class:`SignalRules`).
        known_entities: entity slugs some KI carries (``entity:<slug>`` tags); None: the
            coverage gap is not computed.
        ki_confidence: KI id → confidence (0–100) for the confidence-floor rule; None: not applied.

    Returns:
        The trace's signals, in :data:`SIGNAL_KINDS` order; deterministic.
    """
    r = rules or SignalRules()
    steps = [s for s in trace.steps if isinstance(s, Mapping)]
    tool_steps = [s for s in steps if s.get("kind") == "tool" and s.get("tool")]
    hits: list[SignalHit] = []
    empty_steps: list[int] = []
    empty_queries: list[str] = []
    for s in tool_steps:
        tool = str(s["tool"])
        retrieval = tool in r.lookup_tools or (tool in r.raw_tools and tool not in r.fetch_tools)
        if retrieval and not step_error(s) and _is_empty(s, ki_confidence, r.confidence_floor):
            empty_steps.append(int(s.get("index") or 0))
            if tool in r.lookup_tools:
                empty_queries.append(_query_text(s))
    if empty_steps:
        hits.append(SignalHit("empty_retrieval", tuple(empty_steps), "; ".join(dict.fromkeys(empty_queries))))

    first_lookup = next((int(s.get("index") or 0) for s in tool_steps if s["tool"] in r.lookup_tools), None)
    fallback = [
        s
        for s in tool_steps
        if first_lookup is not None
        and s["tool"] in r.raw_tools
        and int(s.get("index") or 0) > first_lookup
        and not step_error(s)
    ]
    fallback_docs = tuple(dict.fromkeys(str(d) for s in fallback for d in s.get("doc_ids") or ()))
    if fallback and not fallback_docs and not any(s.get("doc_ids") for s in tool_steps):
        # chat-message traces carry doc ids per trace only: those a raw result cites as [id],
        # else all of them, stand in for the raw steps'
        seen = [str(d) for d in trace.doc_ids_seen]
        texts = [str(s.get("observation") or "") for s in fallback]
        cited = [d for d in seen if any(f"[{d}]" in t for t in texts)]
        fallback_docs = tuple(dict.fromkeys(cited or seen))
    if fallback:
        hits.append(
            SignalHit(
                "fell_back_to_raw",
                tuple(int(s.get("index") or 0) for s in fallback),
                "read " + (", ".join(fallback_docs) or "no document"),
            )
        )

    keys: dict[str, list[int]] = {}
    for s in tool_steps:
        key = lookup_key(s)
        if key is not None:
            keys.setdefault(key, []).append(int(s.get("index") or 0))
    loops = {k: v for k, v in keys.items() if len(v) >= max(2, r.loop_min_repeats)}
    if loops:
        idx = tuple(sorted(i for v in loops.values() for i in v))
        hits.append(SignalHit("looped", idx, "; ".join(f"{k} ×{len(v)}" for k, v in loops.items())))

    fc_steps = tuple(int(s.get("index") or 0) for s in steps if s.get("kind") == "force_commit")
    if (
        trace.status in ("budget_exhausted", "context_overflow")
        or trace.force_committed
        or trace.timed_out
        or fc_steps
    ):
        why = trace.exhausted_by or trace.status
        hits.append(
            SignalHit("budget_exhausted", fc_steps, f"{why}; force-committed={trace.force_committed}")
        )

    answer = (trace.exact_answer or "").strip()
    supported: bool | None = None
    if answer:
        shown = [s for s in tool_steps if not step_error(s)]
        texts = [s["observation"] for s in shown if isinstance(s.get("observation"), str)]
        if not tool_steps:
            supported = False
        elif texts:
            supported = contains_answer("\n".join(texts), [answer])
        elif not shown:
            supported = False  # every tool call failed: nothing was shown
    if supported is False:
        hits.append(SignalHit("answer_unsupported", (), f"answer {answer!r} is in no result shown"))

    entities = question_entities(trace.question, steps)
    missing: tuple[str, ...] = ()
    if known_entities is not None:
        known = set(known_entities)
        missing = tuple(e for e in entities if e not in known)
        if missing:
            hits.append(SignalHit("coverage_gap", (), "no KI for " + ", ".join(missing)))

    errors = [
        s
        for s in tool_steps
        if (err := step_error(s))
        and not s.get("blocked")
        and _BLOCKED_TEXT not in err
        and not any(g in err for g in _GATE_ERRORS)
    ]
    if errors:
        hits.append(
            SignalHit(
                "query_error",
                tuple(int(s.get("index") or 0) for s in errors),
                "; ".join(f"{s['tool']}: {step_error(s)}" for s in errors),
            )
        )

    kis = tuple(dict.fromkeys(k for s in tool_steps if s["tool"] in r.lookup_tools for k in ki_ids_shown(s)))
    order = {k: i for i, k in enumerate(SIGNAL_KINDS)}
    return TraceSignals(
        trace_id=trace_id or trace.query_id,
        query_id=trace.query_id,
        question=trace.question,
        answer=answer,
        correct=trace.judge_correct if trace.is_graded else None,
        hits=tuple(sorted(hits, key=lambda h: order[h.kind])),
        kis_shown=kis,
        docs_shown=tuple(dict.fromkeys(str(d) for d in trace.doc_ids_seen)),
        fallback_docs=fallback_docs,
        entities=entities,
        missing_entities=missing,
        empty_lookups=tuple(dict.fromkeys(empty_queries)),
        supported=supported,
    )


@dataclass(frozen=True)
class SignalReport:
    """Signals of a batch of traces, aggregated (see :func:`aggregate_signals`)."""

    traces: list[TraceSignals]
    by_kind: dict[str, int] = field(default_factory=dict)
    """Signal kind → traces showing it (every kind present, 0 included)."""
    unassessed: int = 0
    """Answered traces whose answer support could not be assessed (no observation text)."""
    coverage_computed: bool = False
    """True when a KI store told which entities are covered."""
    by_ki: dict[str, dict[str, int]] = field(default_factory=dict)
    """KI id → ``{"shown": traces, <kind>: traces showing it with the KI}``."""
    by_doc: dict[str, dict[str, int]] = field(default_factory=dict)
    """Doc id → ``{"shown": …, "fallback": traces that fell back to it, <kind>: …}``."""
    by_entity: dict[str, dict[str, int]] = field(default_factory=dict)
    """Entity slug → ``{"questions": …, "missing": …, <kind>: …}``."""

    @property
    def n_traces(self) -> int:
        """Traces in the batch."""
        return len(self.traces)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (``kitune signals --json``)."""
        return {
            "n_traces": self.n_traces,
            "by_kind": dict(self.by_kind),
            "unassessed_support": self.unassessed,
            "coverage_computed": self.coverage_computed,
            "by_ki": self.by_ki,
            "by_doc": self.by_doc,
            "by_entity": self.by_entity,
            "traces": [t.to_dict() for t in self.traces],
        }

    def metrics(self) -> dict[str, float]:
        """Flat metrics: ``signals_traces``, ``signals_<kind>`` (trace counts), ``signals_<kind>_rate``."""
        n = self.n_traces
        out = {"signals_traces": float(n), "signals_unassessed_support": float(self.unassessed)}
        for kind, count in self.by_kind.items():
            out[f"signals_{kind}"] = float(count)
            out[f"signals_{kind}_rate"] = count / n if n else 0.0
        return out


def _bump(table: dict[str, Counter[str]], key: str, names: Iterable[str]) -> None:
    table.setdefault(key, Counter()).update(names)


def aggregate_signals(traces: Sequence[TraceSignals], *, coverage_computed: bool = False) -> SignalReport:
    """Sum signals per kind, per KI shown, per document shown and per question entity.

    Each count is a number of traces (a trace counts once per key and kind, whatever its steps).

    Args:
        traces: per-trace signals, in any order.
        coverage_computed: whether ``coverage_gap`` was computed (a store gave the entities).

    Returns:
        The report; dict keys sorted, counts sorted by name inside each entry.
    """
    by_kind: dict[str, int] = dict.fromkeys(SIGNAL_KINDS, 0)
    ki: dict[str, Counter[str]] = {}
    doc: dict[str, Counter[str]] = {}
    ent: dict[str, Counter[str]] = {}
    unassessed = 0
    for t in traces:
        kinds = sorted(t.kinds)
        for k in kinds:
            by_kind[k] += 1
        if t.answer and t.supported is None:
            unassessed += 1
        for k_id in t.kis_shown:
            _bump(ki, k_id, ["shown", *kinds])
        for d in t.docs_shown:
            _bump(doc, d, ["shown", *kinds])
        for d in t.fallback_docs:
            _bump(doc, d, ["fallback"])
        for e in t.entities:
            _bump(ent, e, ["questions", *kinds, *(["missing"] if e in t.missing_entities else [])])

    def plain(table: dict[str, Counter[str]]) -> dict[str, dict[str, int]]:
        return {k: dict(sorted(v.items())) for k, v in sorted(table.items())}

    return SignalReport(
        traces=list(traces),
        by_kind=by_kind,
        unassessed=unassessed,
        coverage_computed=coverage_computed,
        by_ki=plain(ki),
        by_doc=plain(doc),
        by_entity=plain(ent),
    )


def _top(table: Mapping[str, Mapping[str, int]], limit: int) -> list[tuple[str, Mapping[str, int]]]:
    bad = [k for k in SIGNAL_KINDS]

    def weight(item: tuple[str, Mapping[str, int]]) -> tuple[int, str]:
        return (-sum(item[1].get(k, 0) for k in bad), item[0])

    return sorted(table.items(), key=weight)[:limit]


def signals_markdown(report: SignalReport, *, title: str = "Failure signals", limit: int = 10) -> list[str]:
    """Markdown lines: the per-signal counts, then the KIs, documents and entities with most signals."""
    n = report.n_traces
    md = [f"## {title}", "", f"{n} traces; each count is a number of traces.", ""]
    md += ["| signal | traces | share |", "|---|---|---|"]
    for kind, count in report.by_kind.items():
        shown = (
            "not computed (no KI store)" if kind == "coverage_gap" and not report.coverage_computed else ""
        )
        share = f"{100 * count / n:.1f}%" if n else "–"
        md.append(f"| {kind.replace('_', ' ')} | {shown or count} | {'–' if shown else share} |")
    if report.unassessed:
        md.append(
            f"\n{report.unassessed} answered trace(s) recorded no tool output: answer support not assessed."
        )
    tables = (
        ("KI", "KIs", report.by_ki),
        ("document", "Documents", report.by_doc),
        ("entity", "Entities", report.by_entity),
    )
    for name, plural, table in tables:
        rows = [(k, v) for k, v in _top(table, limit) if any(v.get(s, 0) for s in SIGNAL_KINDS)]
        if not rows:
            continue
        md += ["", f"### {plural} with the most signals", "", f"| {name} | counts |", "|---|---|"]
        md += [f"| {k} | {', '.join(f'{c} {x}' for x, c in v.items())} |" for k, v in rows]
    return md
