"""The agent's tools, by skill, over the store protocols.

Skills:

* ``baseline`` — ``search(query)`` over a :class:`kitune.retrieval.base.CorpusStore` (up to
  ``search_hits`` documents, up to ``snippets_per_hit`` snippets of at most ``snippet_chars``
  characters each) and ``get_by_doc_id(docid)``.
* ``in-context`` — ``get_context(query)`` (a caller-supplied function returning rendered KI
  text and the doc ids it cites) and, when a corpus store is given, a raw ``search`` fallback
  that only works after two *failed* KI look-ups; earlier calls return an instructive error
  observation (``Observation.refused``, which the agent counts). A look-up fails when it returns
  no KI or errors, or when the agent does not answer after it but looks up again or turns to
  search (the KIs it got did not answer); an identical look-up the agent answers from its trace
  is booked the same way (:meth:`Toolbox.note_repeat`), so repeating it moves toward the fallback.
* ``closed-book`` — no tools.

Every tool returns an :class:`Observation`: its text, the doc ids it showed, and an error string
for a failed call. Tools never raise for a model mistake or a backend failure; the error is in
the observation.

The search result is the published BrowseComp-Plus baseline's: up to ``search_hits`` (10) hits,
each with its doc id, title, score (and url when the store gives one) and up to
``snippets_per_hit`` (3) snippets of at most ``snippet_chars`` (700) characters. The one cap on
a tool result, ``max_chars`` (``agent.observation_max_chars``), is optional (None: no cap) and
the same for every skill. When it cuts a result (case A1), whole results are dropped, a marker
says how many were shown, and **only what was shown in full counts as seen**
(``Observation.doc_ids`` → ``Episode.doc_ids_seen`` → evidence recall):

* a result made of parts (search hits; a fetched document is one part): the parts that fit
  whole are shown and their doc ids kept; when not even the first part fits, its head is shown
  and no doc id is kept (a fetched document cut by the cap is not counted as seen);
* a result without parts (rendered KIs): the text is cut and only the doc ids still cited in its
  complete visible lines are kept.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from kitune.errors import DocumentNotFoundError, HarnessError
from kitune.recording import RecordingMissError

if TYPE_CHECKING:
    from kitune.config import KituneConfig
    from kitune.retrieval.base import CorpusStore

__all__ = [
    "SKILLS",
    "ContextItem",
    "ContextObservation",
    "Observation",
    "ObservationPart",
    "Skill",
    "Tool",
    "Toolbox",
    "baseline_toolbox",
    "build_toolbox",
    "canonical_call",
    "cap_observation",
    "cap_text",
    "closed_book_toolbox",
    "in_context_toolbox",
]

Skill = Literal["baseline", "in-context", "closed-book"]
SKILLS: tuple[Skill, ...] = ("baseline", "in-context", "closed-book")

FAILED_LOOKUPS_BEFORE_SEARCH = 2


@dataclass(frozen=True)
class ObservationPart:
    """One result inside an observation (a search hit): the unit a cap keeps or drops whole."""

    text: str
    """The part's text as shown (no trailing newline); parts are joined with one newline."""
    doc_ids: tuple[str, ...] = ()
    """Documents this part shows."""


@dataclass(frozen=True)
class Observation:
    """What one tool call returned to the agent."""

    text: str
    """Text shown to the model, at most the toolbox's ``max_chars`` characters when it has one."""
    doc_ids: tuple[str, ...] = ()
    """Documents this observation showed in full (cited KI evidence, search hits, a fetched
    doc); a cap removes the ids of what it cut."""
    error: str | None = None
    """Set when the call failed (bad arguments, unknown tool, backend error, not allowed yet)."""
    truncated: bool = False
    """True when ``text`` was cut to the cap."""
    n_results: int | None = None
    """Results found (hits, KIs), when the tool counts them."""
    input_tokens: int = 0
    """LLM input tokens the tool itself spent (e.g. a query rewrite); 0 for plain tools."""
    output_tokens: int = 0
    """LLM output tokens the tool itself spent."""
    parts: tuple[ObservationPart, ...] = ()
    """The results ``text`` is made of (``text == "\\n".join(p.text for p in parts)``), when the
    tool has separable results; a cap then keeps whole parts. Empty: ``text`` is one block."""
    malformed: bool = False
    """The call itself was wrong and was not run (unknown tool, missing or unexpected arguments,
    empty or ``<placeholder>`` values); False for a call that ran, even when its backend failed."""
    refused: bool = False
    """The tool declined to run a well-formed call because a precondition was not met (the
    in-context ``search`` fallback before two failed look-ups). The agent counts refusals: a
    refused call costs a step, and a repeated refusal ends the episode with a force-commit."""
    code: str | None = None
    """A short machine-readable name of the error (``unknown_tool``, ``invalid_arguments``,
    ``not_allowed_yet``, ``backend_error``, ``not_found``), None when the call succeeded."""


@dataclass(frozen=True)
class ContextItem:
    """One KI of a ``get_context`` result, rendered both ways (for per-episode de-duplication)."""

    id: str
    """The KI id."""
    line: str
    """The full rendering (without the rank number): ``[ki-…] <title> — <description> (docs: …)``."""
    compact: str
    """The compact rendering: the fact once, documents as ``[docid]``
    (:func:`kitune.service.serving.context.compact_line`)."""
    doc_ids: tuple[str, ...] = ()
    """The KI's evidence documents."""


@dataclass(frozen=True)
class ContextObservation:
    """What a ``get_context`` function returns for one query."""

    text: str
    """Rendered KIs (titles, descriptions, cited doc ids)."""
    doc_ids: tuple[str, ...] = ()
    """Evidence doc ids of the KIs shown."""
    n_results: int = 0
    """KIs returned; 0 counts as a failed look-up."""
    input_tokens: int = 0
    """LLM input tokens the look-up spent (query rewrite), 0 without a rewriter."""
    output_tokens: int = 0
    """LLM output tokens the look-up spent."""
    items: tuple[ContextItem, ...] = ()
    """The KIs one by one, best first (empty: the toolbox shows ``text`` as it is)."""
    facets: str = ""
    """The facet line of the full rendering (shown with ``ki_render="full"``)."""


def cap_text(text: str, max_chars: int) -> tuple[str, bool]:
    """Cap ``text`` at ``max_chars`` characters, ending with a marker that says how much was cut.

    Returns:
        ``(text, truncated)``; ``len(text) <= max_chars`` always (for ``max_chars >= 80``).
    """
    if len(text) <= max_chars:
        return text, False
    marker = f"\n…[truncated: showed {{}} of {len(text)} characters; narrow the query or fetch less]"
    keep = max(0, max_chars - len(marker.format(max_chars)))
    return text[:keep] + marker.format(keep), True


_PART_MARKER = (
    "\n…[truncated: showed {shown} of {total} results ({chars} of {all_chars} characters); "
    "the rest is not shown: narrow the query]"
)


def _cited(text: str, docid: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(docid)}(?![\w-])", text) is not None


def cap_observation(obs: Observation, max_chars: int | None) -> Observation:
    """Cap an observation's text at ``max_chars``, keeping only the doc ids it still shows in full.

    Args:
        obs: the tool's observation (uncapped).
        max_chars: the cap in characters (>= 200 in practice); None: no cap.

    Returns:
        ``obs`` unchanged when it fits (or no cap). Otherwise a copy with ``truncated=True``,
        ``len(text) <= max_chars``, and ``doc_ids`` reduced to what was shown in full: with
        ``parts``, the ids of the parts kept whole (in order, a prefix of the parts; none when
        even the first part does not fit, whose head is then shown); without ``parts``, the ids
        still cited (as whole tokens) in the complete lines of the visible text (a partly shown
        last line does not count).
    """
    if max_chars is None or len(obs.text) <= max_chars:
        return obs
    if obs.parts:
        total = len(obs.parts)
        reserve = len(_PART_MARKER.format(shown=total, total=total, chars=max_chars, all_chars=len(obs.text)))
        shown: list[ObservationPart] = []
        used = 0
        for part in obs.parts:
            add = len(part.text) + (1 if shown else 0)
            if used + add + reserve > max_chars:
                break
            shown.append(part)
            used += add
        if shown:
            body = "\n".join(p.text for p in shown)
            marker = _PART_MARKER.format(
                shown=len(shown), total=total, chars=len(body), all_chars=len(obs.text)
            )
            ids = tuple(dict.fromkeys(d for p in shown for d in p.doc_ids))
            return replace(obs, text=body + marker, doc_ids=ids, truncated=True, parts=tuple(shown))
        text, _ = cap_text(obs.text, max_chars)
        return replace(obs, text=text, doc_ids=(), truncated=True, parts=())
    text, _ = cap_text(obs.text, max_chars)
    visible = text[: text.rfind("\n…[truncated:")]
    complete = visible[: visible.rfind("\n")] if "\n" in visible else ""
    ids = tuple(d for d in obs.doc_ids if _cited(complete, d))
    return replace(obs, text=text, doc_ids=ids, truncated=True)


@dataclass(frozen=True)
class Tool:
    """One tool: name, prompt description, argument names → descriptions, and the function."""

    name: str
    description: str
    args: Mapping[str, str]
    fn: Callable[..., Observation]
    on_repeat: Callable[[Observation], None] | None = None
    """Called with the earlier result when the agent answers an identical call from its trace
    instead of running the tool again, so a stateful tool books the repeat as if it had run
    (``get_context``: a repeated look-up is one more look-up that did not answer)."""


@dataclass
class Toolbox:
    """The tools of one episode (stateful: the in-context fallback counts failed look-ups).

    Build a fresh toolbox per question.
    """

    skill: Skill
    tools: dict[str, Tool] = field(default_factory=dict)
    max_chars: int | None = None
    """Cap on one tool result in characters (see :func:`cap_observation`); None: no cap."""
    failed_lookups: int = 0
    pending_lookup: bool = False
    """True while the last ``get_context`` returned KIs and the agent has not acted on it yet."""
    shown_kis: dict[str, None] = field(default_factory=dict)
    """KI ids shown in this episode, first-seen order (the in-context de-duplication)."""

    def describe(self) -> str:
        """The tool list as prompt text (one line per tool with its JSON arguments)."""
        if not self.tools:
            return "You have no tools. Answer from your own knowledge."
        lines = []
        for t in self.tools.values():
            args = ", ".join(f'"{k}": <{v}>' for k, v in t.args.items())
            lines.append(f'- {t.name}: {t.description} Call as {{"tool": "{t.name}", "args": {{{args}}}}}')
        return "\n".join(lines)

    def note_repeat(self, name: str, earlier: Observation) -> None:
        """Book an identical call answered from the agent's trace (see :attr:`Tool.on_repeat`).

        Args:
            name: the tool name of the repeated call (unknown names are ignored).
            earlier: the result the first identical call returned.
        """
        tool = self.tools.get(name)
        if tool is not None and tool.on_repeat is not None:
            tool.on_repeat(earlier)

    def call(self, name: str, args: Mapping[str, Any]) -> Observation:
        """Run one tool; never raises for a bad call or a backend failure.

        Returns:
            The observation capped by :func:`cap_observation` (``doc_ids`` only what was shown
            in full); ``error`` set on failure, and ``malformed`` too when the call itself was
            wrong (unknown tool, wrong argument names, empty or placeholder values) and not run.
        """
        tool = self.tools.get(name)
        if tool is None:
            known = ", ".join(self.tools) or "none"
            return self._malformed(f"unknown tool {name!r}; available tools: {known}", "unknown_tool")
        missing = [a for a in tool.args if a not in args]
        extra = [a for a in args if a not in tool.args]
        if missing or extra:
            return self._malformed(
                f"{name} takes arguments {list(tool.args)}; missing {missing}, unexpected {extra}",
                "invalid_arguments",
            )
        bad = [a for a in tool.args if not isinstance(args[a], str | int) or str(args[a]).strip() == ""]
        if bad:
            return self._malformed(
                f"{name}: argument(s) {bad} must be non-empty strings", "invalid_arguments"
            )
        templated = [a for a in tool.args if re.fullmatch(r"\s*<[^<>]*>\s*", str(args[a]))]
        if templated:
            return self._malformed(
                f"{name}: argument(s) {templated} still hold the <placeholder>: write real values",
                "invalid_arguments",
            )
        try:
            obs = tool.fn(**{a: str(args[a]).strip() for a in tool.args})
        except DocumentNotFoundError as e:
            return self._error(f"{e}; use a doc id shown by an earlier result", "not_found")
        except (HarnessError, RecordingMissError):
            raise  # a bug, or a replay without this call (e.g. the rewriter's): not the model's doing
        except Exception as e:  # a backend failure is data for the trace, not a crash
            return self._error(f"{name} failed: {type(e).__name__}: {e}", "backend_error")
        return cap_observation(obs, self.max_chars)

    def _error(self, message: str, code: str) -> Observation:
        obs = Observation(text=f"ERROR: {message}", error=message, code=code)
        return cap_observation(obs, self.max_chars)

    def _malformed(self, message: str, code: str) -> Observation:
        obs = Observation(text=f"ERROR: {message}", error=message, malformed=True, code=code)
        return cap_observation(obs, self.max_chars)


def _render_hits(store: CorpusStore, query: str, k: int, snippets: int, chars: int) -> Observation:
    hits = store.search(query, k=k, snippets_per_hit=snippets, snippet_chars=chars)
    if not hits:
        return Observation(text=f"No documents matched {query!r}. Try other keywords.", n_results=0)
    parts = []
    for i, h in enumerate(hits[:k], start=1):
        url = str(getattr(h, "url", "") or "")
        head = f"{i}. [{h.docid}] {h.title} (score {h.score:.4g}{f'; url {url}' if url else ''})"
        body = "".join(f"\n  … {s[:chars]}" for s in h.snippets[:snippets])
        parts.append(ObservationPart(text=head + body, doc_ids=(h.docid,)))
    return Observation(
        text="\n".join(p.text for p in parts),
        doc_ids=tuple(h.docid for h in hits[:k]),
        n_results=len(parts),
        parts=tuple(parts),
    )


def _get_doc(store: CorpusStore, docid: str) -> Observation:
    doc = store.get(docid.strip("[] "))
    title = f" {doc.title}" if doc.title else ""
    text = f"[{doc.docid}]{title}\n{doc.text}"
    part = ObservationPart(text=text, doc_ids=(doc.docid,))
    return Observation(text=text, doc_ids=(doc.docid,), n_results=1, parts=(part,))


def baseline_toolbox(
    store: CorpusStore,
    *,
    search_hits: int = 10,
    snippets_per_hit: int = 3,
    snippet_chars: int = 700,
    max_chars: int | None = None,
) -> Toolbox:
    """``search`` + ``get_by_doc_id`` over a corpus store (the search-and-fetch baseline).

    Defaults are the published baseline's: 10 hits, 3 snippets of at most 700 characters each,
    no cap on a tool result (``max_chars`` None; see :func:`cap_observation`).
    """
    box = Toolbox(skill="baseline", max_chars=max_chars)
    box.tools["search"] = Tool(
        "search",
        f"Search the document collection; returns up to {search_hits} documents as [docid] title "
        f"with their score and up to {snippets_per_hit} snippets each.",
        {"query": "keywords"},
        lambda query: _render_hits(store, query, search_hits, snippets_per_hit, snippet_chars),
    )
    box.tools["get_by_doc_id"] = Tool(
        "get_by_doc_id",
        "Fetch the full text of one document by its docid.",
        {"docid": "docid"},
        lambda docid: _get_doc(store, docid),
    )
    return box


def _entity_facet(facets: str) -> str:
    """The entities part of a facet line (``entities: a 2, b 1``), or "" when it has none."""
    _, sep, entities = facets.partition("| entities: ")
    return f"entities: {entities.strip()}" if sep and entities.strip() not in ("", "-") else ""


def _render_items(
    ctx: ContextObservation, box: Toolbox, *, compact: bool, dedupe: bool
) -> tuple[str, tuple[str, ...], int]:
    """The look-up's text from its items: ``(text, doc ids shown, KIs shown)``."""
    items = [it for it in ctx.items if not (dedupe and it.id in box.shown_kis)]
    skipped = len(ctx.items) - len(items)
    lines = [f"{i}. {it.compact if compact else it.line}" for i, it in enumerate(items, start=1)]
    if skipped:
        lines.append(
            f"({skipped} more matching KI(s) already shown earlier in this episode; not repeated)"
            if items
            else f"(all {skipped} matching KI(s) were already shown earlier in this episode; not repeated)"
        )
    if items and ctx.facets:
        lines.append(ctx.facets if not compact else _entity_facet(ctx.facets))
    for it in items:
        box.shown_kis.setdefault(it.id, None)
    docs = tuple(dict.fromkeys(d for it in items for d in it.doc_ids))
    return "\n".join(line for line in lines if line), docs, len(items)


def in_context_toolbox(
    get_context: Callable[[str], ContextObservation],
    *,
    corpus_store: CorpusStore | None = None,
    search_hits: int = 10,
    snippets_per_hit: int = 3,
    snippet_chars: int = 700,
    max_chars: int | None = None,
    ki_render: Literal["full", "compact"] = "full",
    dedupe_kis: bool = False,
) -> Toolbox:
    """``get_context`` over pre-computed KIs, plus a gated raw ``search`` when a store is given.

    Limits and the cap are the same as :func:`baseline_toolbox`'s, so both skills are cut alike.

    Args:
        get_context: query → :class:`ContextObservation`.
        corpus_store: enables the gated ``search`` fallback.
        search_hits: see :func:`baseline_toolbox`.
        snippets_per_hit: see :func:`baseline_toolbox`.
        snippet_chars: see :func:`baseline_toolbox`.
        max_chars: see :func:`baseline_toolbox`.
        ki_render: ``compact`` shows each KI's fact once with its documents as ``[docid]`` and of
            the facet line only its entities (they can carry the answer in another form, e.g. a
            date); ``full`` the title, description, documents and the whole facet line. Applies when the
            observation has ``items``; otherwise its ``text`` is shown as it is.
        dedupe_kis: a KI already shown in this episode is not shown again (a count line says
            how many were left out, order kept); a look-up with nothing new counts as one that
            did not answer.
    """
    box = Toolbox(skill="in-context", max_chars=max_chars)

    def _settle_pending() -> None:
        if box.pending_lookup:  # looking up again: the previous KIs did not answer
            box.failed_lookups += 1
            box.pending_lookup = False

    def _book(n_results: int) -> None:
        if n_results <= 0:
            box.failed_lookups += 1
        else:
            box.pending_lookup = True

    def _repeat(earlier: Observation) -> None:
        # The same look-up again, answered from the trace: booked as if it had run, so the
        # look-ups that did not answer move toward the search fallback (issue 39.4).
        _settle_pending()
        _book(earlier.n_results or 0)

    def _lookup(query: str) -> Observation:
        _settle_pending()
        try:
            ctx = get_context(query)
        except Exception:
            box.failed_lookups += 1
            raise
        n, docs, text = ctx.n_results, ctx.doc_ids, ctx.text
        if ctx.items and (ki_render == "compact" or dedupe_kis):
            text, docs, n = _render_items(ctx, box, compact=ki_render == "compact", dedupe=dedupe_kis)
        _book(n)
        if ctx.n_results <= 0:
            text = ctx.text or f"No knowledge indicators matched {query!r}."
        return Observation(
            text=text,
            doc_ids=docs,
            n_results=max(0, n),
            input_tokens=ctx.input_tokens,
            output_tokens=ctx.output_tokens,
        )

    box.tools["get_context"] = Tool(
        "get_context",
        "Look up pre-computed knowledge indicators (short evidence-backed facts citing [docid]) "
        "for a query. Use this first; one entity or relation per query works best.",
        {"query": "question or entity and relation"},
        _lookup,
        on_repeat=_repeat,
    )
    if corpus_store is not None:
        store = corpus_store

        def _search(query: str) -> Observation:
            failed = box.failed_lookups + int(box.pending_lookup)  # searching: last KIs did not answer
            if failed < FAILED_LOOKUPS_BEFORE_SEARCH:
                left = FAILED_LOOKUPS_BEFORE_SEARCH - failed
                return Observation(
                    text=(
                        f"ERROR: search is a fallback: it opens after {FAILED_LOOKUPS_BEFORE_SEARCH} "
                        f"get_context look-ups that did not answer ({left} more to go). "
                        "Call get_context with a different query first."
                    ),
                    error="search not allowed yet: fewer than 2 failed get_context look-ups",
                    refused=True,
                    code="not_allowed_yet",
                )
            return _render_hits(store, query, search_hits, snippets_per_hit, snippet_chars)

        box.tools["search"] = Tool(
            "search",
            f"Fallback raw document search (only after {FAILED_LOOKUPS_BEFORE_SEARCH} get_context "
            "look-ups that did not answer).",
            {"query": "keywords"},
            _search,
        )
    return box


def closed_book_toolbox() -> Toolbox:
    """No tools: the no-retrieval reference run."""
    return Toolbox(skill="closed-book")


def build_toolbox(
    skill: Skill,
    cfg: KituneConfig,
    *,
    corpus_store: CorpusStore | None = None,
    get_context: Callable[[str], ContextObservation] | None = None,
) -> Toolbox:
    """Build a fresh toolbox for ``skill`` with limits from ``cfg.retrieval`` and ``cfg.agent``.

    Every skill gets the same cap, ``cfg.agent.observation_max_chars`` (None: no cap). The
    in-context skill renders KIs as ``cfg.agent.ki_render`` and de-duplicates them per episode with
    ``cfg.agent.dedupe_kis``; under ``agent.call_rules: legacy`` it renders as before issue 39
    (full, no de-duplication), so recordings made then replay.

    Raises:
        HarnessError: a skill's required dependency is missing (baseline needs
            ``corpus_store``; in-context needs ``get_context``) or the skill is unknown.
    """
    r, cap = cfg.retrieval, cfg.agent.observation_max_chars
    limits: dict[str, Any] = {
        "search_hits": r.search_hits,
        "snippets_per_hit": r.snippets_per_hit,
        "snippet_chars": r.snippet_chars,
        "max_chars": cap,
    }
    if skill == "baseline":
        if corpus_store is None:
            raise HarnessError(
                "skill 'baseline' needs a corpus store: build one with create_corpus_store(cfg)"
            )
        return baseline_toolbox(corpus_store, **limits)
    if skill == "in-context":
        if get_context is None:
            raise HarnessError("skill 'in-context' needs a get_context function over the KI store")
        legacy = cfg.agent.call_rules == "legacy"
        return in_context_toolbox(
            get_context,
            corpus_store=corpus_store,
            ki_render="full" if legacy else cfg.agent.ki_render,
            dedupe_kis=False if legacy else cfg.agent.dedupe_kis,
            **limits,
        )
    if skill == "closed-book":
        return closed_book_toolbox()
    raise HarnessError(f"unknown skill {skill!r}: use one of {', '.join(SKILLS)}")


def canonical_call(name: str, args: Mapping[str, Any]) -> str:
    """Canonical key of a tool call: tool name + sorted-args JSON (case A2)."""
    return f"{name.strip()}:{json.dumps(dict(args), sort_keys=True, ensure_ascii=False, default=str)}"
