"""Feedback routes: the one table from failure kind to what the loop writes, and the ``out_of_budget`` route.

**The table** (:data:`FAILURE_ROUTES`, one :class:`Route` per kind of
:data:`kitune.evaluation.failures.FAILURE_KINDS`, checked by a test) is read by the loop (the
``disambiguation`` improver's :func:`~kitune.optimizers.improvers.disambiguation.route_feedback`,
the extractor's and the rewriter's tasks order their examples by it), by the review queue
(:func:`kitune.service.workflows.review.measure_effect` names the failure kinds a proposal
kind addresses) and by the docs (:func:`routes_markdown` renders it into
``docs/loop-stages.md``; a test keeps the two equal).

**The ``out_of_budget`` route** (what the look-ups missed, per program):

An ``out_of_budget`` failure (:func:`kitune.evaluation.failures.classify_failure`: the step
budget ran out and no answer was committed) was the commonest failure on LoCoMo and had no
route, so the loop could not learn from it. From the trace alone — the look-ups the agent issued
and the documents each returned (``steps[*].args`` / ``doc_ids``) — :func:`route_out_of_budget`
builds, per failure:

* **rewriter feedback** (:func:`rewriter_feedback`): every look-up and what it returned
  ("searched X (got documents …)"), then, for each gold document that never surfaced,
  "got nothing about <its title> (document <id>; its facts name <entities>)" — the entities are
  the subjects of the KIs extracted from it, or "no KI was extracted from it", which tells a
  rewriting problem from an extraction one;
* **extractor feedback items** (:class:`ExtractorItem`) for those never-surfaced gold documents:
  the document id and its answer-bearing sentence(s)
  (:func:`kitune.evaluation.stage_feedback.answer_sentences`).

Gold documents are ``gold_docids`` when given for the question, else the trace's evidence
documents; "surfaced" means shown in full (``Trace.doc_ids_seen``). Pure functions: no LLM, no
store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from kitune.evaluation.failures import FailureKind, classify_failure
from kitune.evaluation.stage_feedback import answer_sentences

if TYPE_CHECKING:
    from kitune.evaluation.metrics import Trace
    from kitune.ki import KI
    from kitune.schema import Document

__all__ = [
    "FAILURE_ROUTES",
    "ExtractorItem",
    "OutOfBudgetRoute",
    "Route",
    "describe_document",
    "describe_lookups",
    "extractor_items",
    "kinds_for_proposal",
    "kinds_routed_to",
    "rewriter_feedback",
    "route_out_of_budget",
    "routes_markdown",
    "unsurfaced_gold_docs",
]


@dataclass(frozen=True)
class Route:
    """Where one failure kind goes (a row of :data:`FAILURE_ROUTES`).

    Attributes:
        kind: the failure kind.
        to: who receives it: the ``disambiguation`` improver, or program names whose tuning
            examples it feeds (``extractor``, ``rewriter``); empty: nothing is written (not a
            prompt's mistake).
        writes: what is written, one sentence (the docs' table).
        from_trace: the feedback is built from the trace's look-ups (:func:`route_out_of_budget`,
            only the gold documents that never surfaced) rather than from the whole question.
        proposals: the review queue's proposal kinds
            (:data:`kitune.service.workflows.proposals.PROPOSAL_KINDS`) that address this kind.
    """

    kind: FailureKind
    to: tuple[str, ...]
    writes: str
    from_trace: bool = False
    proposals: tuple[str, ...] = ()


_DISAMBIGUATE = (
    "a disambiguation KI that tells the gold answer from the committed one, kept only if the gate "
    "finds it breaks no re-run question"
)
_NOTHING = "nothing: {why}; counted in the failure kinds, never tuned on"

FAILURE_ROUTES: Mapping[str, Route] = MappingProxyType(
    {
        r.kind: r
        for r in (
            Route("wrong_entity", ("disambiguation",), _DISAMBIGUATE, proposals=("add_ki", "retire_ki")),
            Route("wrong_number", ("disambiguation",), _DISAMBIGUATE, proposals=("add_ki", "retire_ki")),
            Route(
                "no_candidate",
                ("extractor", "rewriter"),
                "its gold documents first among the extractor's coverage examples and its question first "
                "among the rewriter's recall examples",
                proposals=("re_extract", "add_ki", "rewriter_feedback"),
            ),
            Route(
                "out_of_budget",
                ("extractor", "rewriter"),
                "the look-ups and the never-surfaced gold documents as rewriter feedback, those documents' "
                "answer sentences as extractor feedback, both first among their examples",
                from_trace=True,
                proposals=("re_extract", "rewriter_feedback"),
            ),
            Route(
                "malformed_calls",
                (),
                _NOTHING.format(why="the model's replies or tool calls could not be run"),
            ),
            Route("grader_error", (), _NOTHING.format(why="the judge could not grade the answer")),
            Route(
                "failed", (), _NOTHING.format(why="the LLM calls failed (auth, outage), not a model mistake")
            ),
        )
    }
)
"""Failure kind → its one :class:`Route` (see the module docstring)."""


def kinds_routed_to(receiver: str, *, from_trace: bool | None = None) -> frozenset[str]:
    """The failure kinds whose route goes to ``receiver`` (``disambiguation``, ``extractor``, ``rewriter``).

    Args:
        receiver: an improver or program name of :attr:`Route.to`.
        from_trace: only routes built from the trace (True) or from the whole question (False);
            None: both.
    """
    return frozenset(
        k
        for k, r in FAILURE_ROUTES.items()
        if receiver in r.to and (from_trace is None or r.from_trace == from_trace)
    )


def kinds_for_proposal(proposal_kind: str) -> tuple[str, ...]:
    """The failure kinds a review-queue proposal kind addresses, in :data:`FAILURE_ROUTES` order."""
    return tuple(k for k, r in FAILURE_ROUTES.items() if proposal_kind in r.proposals)


def routes_markdown() -> str:
    """:data:`FAILURE_ROUTES` as the markdown table in ``docs/loop-stages.md``."""
    rows = [
        "| failure kind | goes to | what is written | review proposals |",
        "|---|---|---|---|",
    ]
    for r in FAILURE_ROUTES.values():
        to = ", ".join(f"`{t}`" for t in r.to) or "—"
        props = ", ".join(f"`{p}`" for p in r.proposals) or "—"
        rows.append(f"| `{r.kind}` | {to} | {r.writes} | {props} |")
    return "\n".join(rows) + "\n"


MAX_LOOKUPS = 8
"""Look-ups named in the rewriter feedback (the rest are counted)."""
MAX_ENTITIES = 3
"""Entities named per never-surfaced document."""


def _result(step: Mapping[str, Any]) -> str:
    if step.get("blocked"):
        return "blocked: a repeat"
    if step.get("error"):
        return f"error: {str(step['error'])[:80]}"
    docs = list(step.get("doc_ids") or ())
    cut = "; cut at the cap" if step.get("truncated") else ""
    return f"got documents {', '.join(docs)}{cut}" if docs else f"got nothing{cut}"


def describe_lookups(trace: Trace, *, limit: int = MAX_LOOKUPS) -> str:
    """``Searched 'X' (got documents a, b), search 'Y' (got nothing), … and N more.`` (empty: none).

    ``get_context`` look-ups show their query; other tools are prefixed with the tool name.
    """
    parts: list[str] = []
    for step in trace.steps:
        if step.get("kind") != "tool":
            continue
        tool, args = str(step.get("tool") or "?"), step.get("args") or {}
        target = args.get("query") or args.get("docid") or args.get("doc_id") or ""
        label = f"{target!r}" if tool == "get_context" else f"{tool} {target!r}"
        parts.append(f"{label} ({_result(step)})")
    if not parts:
        return ""
    more = f" and {len(parts) - limit} more" if len(parts) > limit else ""
    return "Searched " + ", ".join(parts[:limit]) + more + "."


def unsurfaced_gold_docs(trace: Trace, gold_docids: Sequence[str] | None = None) -> list[str]:
    """Gold documents (``gold_docids``, else the trace's evidence documents) never shown in full."""
    seen = set(trace.doc_ids_seen)
    return [d for d in dict.fromkeys(gold_docids or trace.evidence_docids) if d not in seen]


def describe_document(
    docid: str, documents: Mapping[str, Document], kis_by_doc: Mapping[str, Sequence[KI]] | None
) -> str:
    """How feedback names a document: ``"Title" (document d7; its facts name A, B)``.

    Without a title: ``document d7 (…)``; with ``kis_by_doc`` given and no KI from the document:
    ``… no KI was extracted from it``; ``kis_by_doc`` None: entities not named.
    """
    doc = documents.get(docid)
    notes: list[str] = []
    if doc is not None and doc.title:
        head = f'"{doc.title}"'
        notes.append(f"document {docid}")
    else:
        head = f"document {docid}"
    if kis_by_doc is not None:
        subjects = list(dict.fromkeys(k.payload.properties.subject for k in kis_by_doc.get(docid, ())))
        notes.append(
            f"its facts name {', '.join(subjects[:MAX_ENTITIES])}"
            if subjects
            else "no KI was extracted from it"
        )
    return f"{head} ({'; '.join(notes)})" if notes else head


def rewriter_feedback(
    trace: Trace,
    *,
    documents: Mapping[str, Document],
    gold_docids: Sequence[str] | None = None,
    kis_by_doc: Mapping[str, Sequence[KI]] | None = None,
) -> str:
    """Rewriter feedback for one ``out_of_budget`` trace (see the module docstring).

    Args:
        trace: the failed question's trace.
        documents: docid → document (for titles; an unknown id is named by its id).
        gold_docids: the question's answer-bearing documents (None: the trace's evidence docs).
        kis_by_doc: docid → extracted KIs (for the entities; None: entities not named).

    Returns:
        Two or three lines of plain text; deterministic.
    """
    gold = trace.gold_answer
    lines = [f"The step budget ran out after {trace.n_steps} steps with no answer; gold answer {gold!r}."]
    lines.append(describe_lookups(trace) or "No look-ups were issued.")
    missing = unsurfaced_gold_docs(trace, gold_docids)
    if missing:
        about = "; ".join(describe_document(d, documents, kis_by_doc) for d in missing)
        lines.append(f"Got nothing about {about}: plan look-ups whose entity tags and text name it.")
    elif gold_docids or trace.evidence_docids:
        golds = ", ".join(dict.fromkeys(gold_docids or trace.evidence_docids))
        lines.append(f"Every gold document surfaced ({golds}) but no answer was committed: answer from them.")
    return "\n".join(lines)


@dataclass(frozen=True)
class ExtractorItem:
    """A gold document the agent never surfaced, as extractor feedback."""

    docid: str
    query_id: str
    question: str
    answer: str
    sentences: tuple[str, ...]
    """The document's answer-bearing sentence(s); empty when it does not state the answer verbatim."""

    def text(self, max_chars: int = 300) -> str:
        """One feedback line for the extractor's reflection."""
        head = f"Document {self.docid} never surfaced for {self.question!r}"
        if not self.sentences:
            return f"{head}; it does not state {self.answer!r} verbatim: extract its entities and relations."
        quoted = " ".join(f'"{s[:max_chars]}"' for s in self.sentences)
        return f"{head}; extract a fact stating {self.answer!r} from {quoted}"


def extractor_items(
    trace: Trace, *, documents: Mapping[str, Document], gold_docids: Sequence[str] | None = None
) -> list[ExtractorItem]:
    """One :class:`ExtractorItem` per never-surfaced gold document that is in ``documents``."""
    golds = [trace.gold_answer, *trace.aliases]
    out: list[ExtractorItem] = []
    for docid in unsurfaced_gold_docs(trace, gold_docids):
        doc = documents.get(docid)
        if doc is not None:
            sentences = tuple(answer_sentences(doc.text, golds))
            out.append(ExtractorItem(docid, trace.query_id, trace.question, trace.gold_answer, sentences))
    return out


@dataclass(frozen=True)
class OutOfBudgetRoute:
    """The ``out_of_budget`` failures of a run, routed to the rewriter and the extractor."""

    rewriter: Mapping[str, str]
    """Query id → rewriter feedback text, in trace order."""
    extractor: tuple[ExtractorItem, ...]
    """Never-surfaced gold documents, in trace order."""

    def to_metrics(self) -> dict[str, float]:
        """``route_oob_*`` counts: questions routed, extractor items, items with a sentence."""
        return {
            "route_oob_questions": float(len(self.rewriter)),
            "route_oob_extractor_items": float(len(self.extractor)),
            "route_oob_items_with_sentence": float(sum(bool(i.sentences) for i in self.extractor)),
        }


def route_out_of_budget(
    traces: Sequence[Trace],
    *,
    documents: Mapping[str, Document],
    gold_docids: Mapping[str, Sequence[str]] | None = None,
    kis_by_doc: Mapping[str, Sequence[KI]] | None = None,
) -> OutOfBudgetRoute:
    """Route every ``out_of_budget`` trace (others are ignored) to rewriter and extractor feedback.

    Args:
        traces: a run's traces.
        documents: docid → document.
        gold_docids: query id → answer-bearing documents (``Evaluation.gold_docids``).
        kis_by_doc: docid → extracted KIs (names the entities in the rewriter feedback).
    """
    rewriter: dict[str, str] = {}
    items: list[ExtractorItem] = []
    for t in traces:
        golds = (gold_docids or {}).get(t.query_id)
        kind = classify_failure(t, golds)
        if kind is None or not FAILURE_ROUTES[kind].from_trace:  # the table's trace-built routes
            continue
        rewriter[t.query_id] = rewriter_feedback(
            t, documents=documents, gold_docids=golds, kis_by_doc=kis_by_doc
        )
        items.extend(extractor_items(t, documents=documents, gold_docids=golds))
    return OutOfBudgetRoute(rewriter, tuple(items))
