"""``kitune signals``: failure signals over a batch of traces, with the KI store's facts, logged to MLflow.

Sources (:func:`load_signal_traces`), any mix of:

* a run folder of ``kitune eval`` (its ``traces.jsonl``; the latest trace per question);
* a kitune traces JSONL file (``traces.jsonl`` of a run or of an imported trace source);
* a production trace file, OpenAI-style chat JSONL or MLflow traces (``.jsonl`` / ``.json``),
  read with :func:`kitune.service.workflows.traces.read_trace_file` and converted with
  :func:`~kitune.service.workflows.traces.to_trace` — no gold answer or label needed;
* a folder of such files (every ``*.jsonl`` / ``*.json`` in it, sorted by name).

A file is a kitune traces file when its first record has ``query_id``, ``skill`` and ``steps``.
Evidence ids: a kitune trace is ``<run or file name>:<query_id>`` (``:2``, ``:3`` … when a
question repeats in one file); a production trace keeps its source id (OpenAI ``id``, MLflow
``trace_id``, else the record's content hash).

The store's facts (:func:`store_facts`) add the coverage gap (entity tags the KIs carry) and
the confidence floor (``retrieval.confidence_floor``): KIs of every status but ``expired``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kitune.config import KituneConfig
from kitune.errors import DataError
from kitune.evaluation.harness import read_traces
from kitune.evaluation.metrics import Trace
from kitune.evaluation.signals import SignalReport, SignalRules, aggregate_signals, compute_signals
from kitune.schema import Filter
from kitune.service.workflows.traces import TraceFolder, read_trace_file, to_trace

if TYPE_CHECKING:
    from kitune.data.loaders import SkippedLine
    from kitune.optimizers.protocols import Tracker
    from kitune.retrieval.base import Store

__all__ = [
    "LoadedTraces",
    "StoreFacts",
    "load_signal_traces",
    "log_signals",
    "signal_report",
    "store_facts",
    "to_chat_record",
    "trace_sources",
]


@dataclass(frozen=True)
class LoadedTraces:
    """Traces read from the sources, each with the id its evidence uses."""

    traces: list[tuple[str, Trace]]
    """``(trace id, trace)`` in source order."""
    sources: list[str]
    """The files read."""
    skipped: list[SkippedLine]
    """Production records that could not be read (line and reason)."""


def _is_kitune_file(path: Path) -> bool:
    with path.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.strip():
                try:
                    first = json.loads(line)
                except json.JSONDecodeError:
                    return False
                return isinstance(first, dict) and {"query_id", "skill", "steps"} <= set(first)
    return False


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        if (path / "traces.jsonl").is_file():
            return [path / "traces.jsonl"]
        return sorted(p for pattern in ("*.jsonl", "*.json") for p in path.glob(pattern) if p.is_file())
    if path.is_file():
        return [path]
    raise DataError(
        f"no traces at {path}: pass a run folder, a traces JSONL, a chat/MLflow trace file or a folder",
        path=str(path),
    )


def trace_sources(cfg: KituneConfig, paths: Sequence[Path] | None, name: str | None) -> list[Path]:
    """The sources a command names: ``paths`` plus, with ``name``, the imported source's traces.

    Args:
        cfg: the configuration (``workdir`` holds ``traces/<name>``).
        paths: run folders, trace files or folders, as given.
        name: an imported trace source (``kitune traces import --name``), or None.

    Returns:
        ``paths`` in order, then ``<workdir>/traces/<name>/traces.jsonl``.

    Raises:
        ValueError: no path and no name.
        DataError: ``name`` has characters other than letters, digits, ``._-``.
    """
    out = list(paths or [])
    if name is not None:
        out.append(TraceFolder.of(cfg, name).traces)
    if not out:
        raise ValueError("no traces given: pass run folders or trace files, or --name SOURCE")
    return out


def load_signal_traces(paths: Sequence[Path | str]) -> LoadedTraces:
    """Read every source (see the module docstring).

    Raises:
        DataError: a path does not exist, or a kitune traces file has a bad complete line.
    """
    out: list[tuple[str, Trace]] = []
    sources: list[str] = []
    skipped: list[SkippedLine] = []
    for raw in paths:
        root = Path(raw)
        for file in _files(root):
            sources.append(str(file))
            if _is_kitune_file(file):
                label = file.parent.name if file.name == "traces.jsonl" else file.stem
                seen: dict[str, int] = {}
                for t in read_traces(file):
                    seen[t.query_id] = seen.get(t.query_id, 0) + 1
                    n = seen[t.query_id]
                    out.append((f"{label}:{t.query_id}" + (f":{n}" if n > 1 else ""), t))
                continue
            pts, bad = read_trace_file(file)
            skipped.extend(bad)
            out.extend((pt.trace_id, to_trace(pt)) for pt in pts)
    return LoadedTraces(out, sources, skipped)


@dataclass(frozen=True)
class StoreFacts:
    """What the signals need from the KI store."""

    entities: frozenset[str]
    """Entity slugs some KI carries (``entity:<slug>`` tags)."""
    confidence: dict[str, int]
    """KI id → confidence (0–100)."""


def store_facts(store: Store) -> StoreFacts:
    """Entity slugs and confidences of every KI that is not expired (one pass over the store)."""
    entities: set[str] = set()
    confidence: dict[str, int] = {}
    for ki in store.iter_kis(Filter(statuses=("active", "stale"))):
        entities.update(ki.entities)
        confidence[ki.id] = ki.payload.confidence
    return StoreFacts(frozenset(entities), confidence)


def signal_report(
    cfg: KituneConfig,
    traces: Sequence[tuple[str, Trace]],
    *,
    facts: StoreFacts | None = None,
    rules: SignalRules | None = None,
) -> SignalReport:
    """Signals of every trace, aggregated.

    Args:
        cfg: ``retrieval.confidence_floor`` is the floor (unless ``rules`` is given).
        traces: ``(trace id, trace)`` pairs (:func:`load_signal_traces`).
        facts: the store's facts (None: no coverage gap, no confidence floor).
        rules: tool groups and thresholds (default: :class:`SignalRules` with the config's floor).
    """
    r = rules or SignalRules(confidence_floor=cfg.retrieval.confidence_floor)
    per = [
        compute_signals(
            t,
            trace_id=tid,
            rules=r,
            known_entities=facts.entities if facts else None,
            ki_confidence=facts.confidence if facts else None,
        )
        for tid, t in traces
    ]
    return aggregate_signals(per, coverage_computed=facts is not None)


def to_chat_record(trace: Trace, *, trace_id: str, labelled: bool = False) -> dict[str, Any]:
    """A kitune episode as an OpenAI-style chat record, the shape production agents export.

    The user asks the question; each tool step is an assistant tool call (its arguments) answered
    by a tool message holding the recorded observation; the final assistant message carries
    ``Exact Answer: <answer>`` when there is one. ``doc_ids_seen`` is kept; tokens go on the
    assistant messages as ``usage``. Without ``labelled`` no gold answer, aliases, evidence ids
    or verdict are written: the record is what an unlabelled production log holds.
    :func:`kitune.data.trace_formats.parse_openai_record` reads it back with the same tool
    steps, arguments and observations, so its signals are the episode's.

    Args:
        trace: the episode (steps with their observations, as ``kitune eval`` writes them).
        trace_id: the record's ``id``.
        labelled: also write ``gold_answer``, ``aliases``, ``evidence_docids`` and ``correct``.
    """
    msgs: list[dict[str, Any]] = [{"role": "user", "content": trace.question}]
    for s in trace.steps:
        usage = {
            "prompt_tokens": int(s.get("input_tokens") or 0),
            "completion_tokens": int(s.get("output_tokens") or 0),
        }
        if s.get("kind") == "tool" and s.get("tool"):
            cid = f"{trace_id}-s{s.get('index')}"
            call = {
                "id": cid,
                "type": "function",
                "function": {
                    "name": s["tool"],
                    "arguments": json.dumps(s.get("args") or {}, ensure_ascii=False),
                },
            }
            msgs.append({"role": "assistant", "content": None, "tool_calls": [call], "usage": usage})
            text = s.get("observation")
            if text is None:
                text = f"ERROR: {s['error']}" if s.get("error") else ""
            msgs.append({"role": "tool", "tool_call_id": cid, "content": text})
    final = f"Exact Answer: {trace.exact_answer}" if trace.exact_answer else ""
    msgs.append({"role": "assistant", "content": final})
    record: dict[str, Any] = {"id": trace_id, "messages": msgs, "doc_ids_seen": list(trace.doc_ids_seen)}
    if trace.status == "failed":
        record["error"] = trace.failure or "failed"
    if labelled:
        record.update(
            gold_answer=trace.gold_answer,
            aliases=list(trace.aliases),
            evidence_docids=list(trace.evidence_docids),
            query_id=trace.query_id,
        )
        if trace.is_graded:
            record["correct"] = bool(trace.judge_correct)
    return record


def log_signals(
    tracker: Tracker, report: SignalReport, *, name: str, params: dict[str, Any] | None = None
) -> str | None:
    """Log a report as its own tracking run ``signals-<name>``.

    Metrics: :meth:`SignalReport.metrics` (``signals_<kind>`` counts and rates). Artefact
    ``signals/report.json`` (:meth:`SignalReport.to_dict`). Tags ``kitune.kind=signals``.

    Returns:
        The run id (None when the tracker could not open a run; failures are recorded by it).
    """
    with tracker.run(f"signals-{name}", params or {}, tags={"kitune.kind": "signals"}, nested=False) as h:
        tracker.log_metrics(report.metrics(), run_id=h.run_id)
        tracker.log_dict(report.to_dict(), "signals/report.json", run_id=h.run_id)
        return h.run_id
