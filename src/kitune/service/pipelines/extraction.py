"""Run the extractor over a corpus: concurrent, resumable, batched writes, one report.

:func:`extract_corpus` is what ``kitune extract`` and any other front end call. Its guarantees:

* **Concurrency** — up to ``cfg.concurrency_for("extraction")`` documents at once in worker threads
  (``extraction.concurrency`` when set, else the embedded server's slots; see :mod:`kitune.config`).
  Each task runs in a copy of the caller's ``contextvars`` context, so the ledger stage
  (:meth:`kitune.usage.TokenLedger.stage`) and a ``dspy.context(lm=...)`` set by the caller hold
  inside the workers. Results do not depend on the number of workers.
* **Resume** — a JSONL state file gets one line per finished document
  (``{"docid", "status", "kis", "error", "prompt_version", "at", "hash"}``; a ``failed`` line whose
  model reply could not be used also carries that reply, whole, as ``raw``, and the structured
  record as ``parse_failure``: status, reason, adapter, exception class, detail, raw reply,
  finish reason, records dropped — :class:`kitune.programs.fact_extractor.ParseFailure`). A
  rerun skips documents whose last status is ``ok`` and retries ``failed`` ones. A truncated
  last line (a crash while writing) is ignored.
* **Lifecycle** — ``hash`` is the document's content hash
  (:func:`~kitune.data.checksum.document_hash`, the extraction cache's too). A rerun
  re-extracts an ``ok`` document whose hash changed; one whose hash is unchanged (or was never
  recorded) is skipped with no LLM call and its KIs get ``last_seen = now``
  (:func:`kitune.service.serving.stores.refresh_documents`), so a stable corpus never goes stale. With
  ``lifecycle.derived_retention = "while_evidence"``, disambiguation and source-description KIs
  whose evidence documents are all in ``docs`` are refreshed too. KIs of documents absent from
  ``docs`` are left alone: their clock runs from the last run that saw them.
* **Commit before done** — KIs are buffered and written with ``store.upsert`` in batches of
  ``cfg.extraction.write_batch_size`` (or sooner, once ``cfg.extraction.flush_interval_s`` has
  passed since the last write, so a slow LLM never leaves hours of finished documents
  unrecorded); a document is marked ``ok`` only after the batch holding
  its KIs is committed and none of its KIs failed to write. A crash loses no committed work and
  never marks uncommitted work done.
* **Isolation** — a document whose output stays malformed, or whose LM call raises, is
  recorded ``failed`` (retried next run); one whose text exceeds ``cfg.extraction.max_doc_chars``
  is recorded ``skipped`` with the reason once (no call is made, not retried until the limit is
  raised); the run goes on. Only errors no other document could survive abort the run:
  :class:`kitune.errors.LMAuthError`, :class:`kitune.errors.ConfigError` and
  :class:`kitune.errors.StoreUnavailableError` (finished work is committed first).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kitune.data.checksum import document_hash
from kitune.data.loaders import load_corpus
from kitune.errors import ConfigError, LMAuthError, LMTimeoutError, StoreUnavailableError
from kitune.ki import KI, utcnow
from kitune.lm.timeouts import timeout_scale
from kitune.programs.fact_extractor import DocExtraction, FactExtractor, ParseFailure
from kitune.schema import Document
from kitune.service.serving.stores import expire_documents, refresh_derived, refresh_documents

if TYPE_CHECKING:
    from kitune.config import KituneConfig
    from kitune.retrieval.base import Store
    from kitune.usage import TokenLedger

__all__ = [
    "ExtractionReport",
    "default_state_path",
    "extract_corpus",
    "load_documents",
    "read_state",
]

_FATAL = (LMAuthError, ConfigError, StoreUnavailableError)

TIMEOUT_RETRY_SCALE = 2.0
"""A document whose extraction timed out is tried once more with its timeouts multiplied by this."""


@dataclass(frozen=True)
class ExtractionReport:
    """Outcome of one :func:`extract_corpus` run."""

    docs_total: int
    """Distinct documents given."""
    docs_done: int
    """Documents extracted and committed in this run."""
    docs_failed: int
    """Documents recorded ``failed`` in this run (retried on the next run)."""
    docs_skipped: int
    """Documents already ``ok`` in the state file with unchanged content (not re-extracted)."""
    kis_written: int
    """KIs the store accepted in this run."""
    write_failures: int = 0
    """KIs the store rejected."""
    drops: dict[str, int] = field(default_factory=dict)
    """Guardrail drop reason → count."""
    parse_failures: int = 0
    """Malformed model replies (each retried once)."""
    envelope_unwrapped: int = 0
    """Records found one wrapper level too deep (case P3)."""
    counters: dict[str, int] = field(default_factory=dict)
    """Every parse/guardrail counter summed (``retries``, ``lm_calls``, ``bare_list`` …)."""
    tokens: dict[str, int] = field(default_factory=dict)
    """Ledger totals for this run's calls: ``calls``, ``input_tokens``, ``output_tokens``,
    ``billed_input_tokens``, ``billed_output_tokens``, ``cache_hits``, ``estimated_calls``,
    ``failed_calls`` (zeros when no ledger is given)."""
    failed: dict[str, str] = field(default_factory=dict)
    """Failed docid → reason."""
    parse_failed: dict[str, ParseFailure] = field(default_factory=dict)
    """Failed docid → the structured record of the reply that could not be used (unparseable,
    every record rejected, or cut off with its records not kept); a subset of :attr:`failed`."""
    truncated: tuple[str, ...] = ()
    """Docids (sorted) done from a reply cut off at its token limit (``finish_reason=length``),
    only with ``extraction.keep_truncated_records``: only the complete, verified records before
    the cut were kept, so the document may be missing facts. Raise ``lm.extract.max_tokens`` or
    lower ``extraction.chunk_chars`` and re-extract them. Without that setting such documents are
    failed and their records counted in ``counters["truncated_records_dropped"]``."""
    prompt_version: str = ""
    """The extractor's prompt version."""
    wall_s: float = 0.0
    """Wall time in seconds."""
    docs_changed: int = 0
    """Documents ``ok`` before whose content hash changed, re-extracted in this run."""
    kis_refreshed: int = 0
    """KIs of skipped (unchanged) documents whose ``last_seen`` was refreshed, without an LLM call."""
    derived_refreshed: int = 0
    """Disambiguation/source-description KIs refreshed because all their evidence documents are present."""
    kis_source_changed: int = 0
    """Old KIs of changed documents expired (reason ``source_changed``) once the new ones were stored."""
    too_large: dict[str, str] = field(default_factory=dict)
    """Docid → reason for documents over ``extraction.max_doc_chars``: skipped (no LLM call, not
    failed, not retried until the limit is raised); counted in ``docs_skipped``."""
    retried: tuple[str, ...] = ()
    """Docids (sorted) whose extraction timed out and was tried once more with twice the timeout
    (:data:`TIMEOUT_RETRY_SCALE`); each is also in ``failed`` when the second try failed too."""

    @property
    def kis_per_doc(self) -> float:
        """KIs written per document done (0.0 when none)."""
        return self.kis_written / self.docs_done if self.docs_done else 0.0

    def summary_rows(self) -> list[tuple[str, str]]:
        """``(label, value)`` rows for a summary table, in display order."""
        rows = [
            ("documents", str(self.docs_total)),
            ("done", str(self.docs_done)),
            ("skipped (already done or too large)", str(self.docs_skipped)),
            ("too large (skipped)", str(len(self.too_large))),
            ("re-extracted (content changed)", str(self.docs_changed)),
            ("old KIs expired (source changed)", str(self.kis_source_changed)),
            ("KIs refreshed (unchanged docs)", str(self.kis_refreshed)),
            ("derived KIs refreshed", str(self.derived_refreshed)),
            ("failed", str(self.docs_failed)),
            ("retried after a timeout", str(len(self.retried))),
            ("KIs written", str(self.kis_written)),
            ("KIs per doc", f"{self.kis_per_doc:.1f}"),
            ("write failures", str(self.write_failures)),
            ("parse failures", str(self.parse_failures)),
            ("retries", str(self.counters.get("retries", 0))),
            ("envelope_unwrapped", str(self.envelope_unwrapped)),
            ("truncated replies (partial)", str(len(self.truncated))),
            ("records of cut replies kept", str(self.counters.get("kept_from_truncated", 0))),
            ("records of cut replies dropped", str(self.counters.get("truncated_records_dropped", 0))),
        ]
        rows += [(f"dropped: {reason}", str(n)) for reason, n in sorted(self.drops.items())]
        rows += [
            ("input tokens", str(self.tokens.get("input_tokens", 0))),
            ("output tokens", str(self.tokens.get("output_tokens", 0))),
            ("prompt version", self.prompt_version),
            ("wall time (s)", f"{self.wall_s:.1f}"),
        ]
        return rows


def default_state_path(cfg: KituneConfig, prompt_version: str) -> Path:
    """``<workdir>/extraction/<corpus>.<prompt version>.state.jsonl`` (one resume file per prompt)."""
    safe = prompt_version.replace("@", "-").replace("/", "-")
    return cfg.workdir / "extraction" / f"{cfg.corpus_name}.{safe}.state.jsonl"


def _state_records(path: Path | None) -> Iterator[dict[str, Any]]:
    """The JSON object lines of a state file (missing file: none; unparseable lines skipped)."""
    if path is None or not path.is_file():
        return
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a crash mid-write leaves at most one bad line
                continue
            if isinstance(rec, dict):
                yield rec


def read_state_hashes(path: Path | None) -> dict[str, str]:
    """Read a state file into ``docid → content hash`` of its last done line with a hash.

    Done: ``ok``, or ``partial`` recorded as final (it then carries a hash; see
    :attr:`kitune.programs.fact_extractor.FactExtractor.partial_is_final`).
    """
    return {
        str(rec.get("docid")): rec["hash"]
        for rec in _state_records(path)
        if rec.get("status") in ("ok", "partial") and isinstance(rec.get("hash"), str) and rec["hash"]
    }


def read_state(path: Path | None) -> dict[str, str]:
    """Read a state file into ``docid → last status`` (later lines win).

    Missing file: ``{}``. Unparseable lines (a crash mid-write) are skipped.
    """
    return {
        rec["docid"]: str(rec.get("status", ""))
        for rec in _state_records(path)
        if isinstance(rec.get("docid"), str)
    }


def load_documents(path: Path | str, *, limit: int | None = None) -> list[Document]:
    """Load a corpus (a BrowseComp-Plus-layout folder or a JSONL file) via :mod:`kitune.data.loaders`.

    Args:
        path: a folder holding ``corpus.jsonl``, or a ``.jsonl`` file.
        limit: keep the first ``limit`` documents (None: all).

    Raises:
        DataError: the corpus is missing or malformed (from the loader).
    """
    docs = load_corpus(path)
    return docs[:limit] if limit is not None else docs


class _StateWriter:
    def __init__(self, path: Path | None, prompt_version: str) -> None:
        self.path = path
        self.prompt_version = prompt_version
        self._fh = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("a", encoding="utf-8")

    def write(
        self,
        docid: str,
        status: str,
        kis: int,
        error: str = "",
        content: str = "",
        raw: str = "",
        parse_failure: ParseFailure | None = None,
    ) -> None:
        if self._fh is None:
            return
        rec = {
            "docid": docid,
            "status": status,
            "kis": kis,
            "error": error[:500],
            "prompt_version": self.prompt_version,
            "at": utcnow().isoformat(),
        }
        if content:
            rec["hash"] = content
        if raw:
            rec["raw"] = raw
        if parse_failure is not None:
            rec["parse_failure"] = parse_failure.to_dict()
        self._fh.write(json.dumps(rec, ensure_ascii=False) + "\n")

    def sync(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self.sync()
            self._fh.close()
            self._fh = None


class _Progress:
    """Progress with docs/s, KIs/doc and tokens (a no-op when disabled).

    On a terminal: a Rich bar. Redirected to a file or a pipe (cron, CI, ``> log``): one plain
    line per ``interval_s`` seconds and a last one at the end, instead of silence then noise.
    """

    def __init__(
        self, enabled: bool, total: int, ledger: TokenLedger | None, marker: int, *, interval_s: float = 10.0
    ) -> None:
        self.enabled = enabled and total > 0
        self.ledger, self.marker = ledger, marker
        self.total, self.interval_s = total, interval_s
        self.start = time.monotonic()
        self._last_line = float("-inf")
        self._bar: Any = None
        self.plain = self.enabled and not sys.stderr.isatty()
        if self.enabled and not self.plain:
            self._bar = Progress(
                TextColumn("[bold]extract"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn(
                    "{task.fields[rate]:.2f} docs/s · {task.fields[kpd]:.1f} KIs/doc · "
                    "{task.fields[tokens]} tok · {task.fields[failed]} failed"
                ),
                console=Console(stderr=True),
                transient=False,
            )
            self._task = self._bar.add_task("extract", total=total, rate=0.0, kpd=0.0, tokens=0, failed=0)
            self._bar.start()

    def advance(self, finished: int, kis: int, failed: int) -> None:
        if not self.enabled:
            return
        elapsed = max(time.monotonic() - self.start, 1e-6)
        tokens = 0
        if self.ledger is not None:
            tokens = sum(r.input_tokens + r.output_tokens for r in self.ledger.since(self.marker))
        ok = max(finished - failed, 0)
        if self.plain:
            now = time.monotonic()
            if finished >= self.total or now - self._last_line >= self.interval_s:
                self._last_line = now
                print(
                    f"extract {finished}/{self.total} · {finished / elapsed:.2f} docs/s · "
                    f"{kis / ok if ok else 0.0:.1f} KIs/doc · {tokens:,} tok · {failed} failed · "
                    f"{elapsed:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
            return
        self._bar.update(
            self._task,
            completed=finished,
            rate=finished / elapsed,
            kpd=kis / ok if ok else 0.0,
            tokens=tokens,
            failed=failed,
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _ledger_totals(ledger: TokenLedger | None, marker: int) -> dict[str, int]:
    keys = (
        "calls",
        "input_tokens",
        "output_tokens",
        "billed_input_tokens",
        "billed_output_tokens",
        "cache_hits",
        "estimated_calls",
        "failed_calls",
    )
    totals = dict.fromkeys(keys, 0)
    if ledger is None:
        return totals
    for r in ledger.since(marker):
        totals["calls"] += 1
        totals["input_tokens"] += r.input_tokens
        totals["output_tokens"] += r.output_tokens
        totals["billed_input_tokens"] += r.billed_input_tokens
        totals["billed_output_tokens"] += r.billed_output_tokens
        totals["cache_hits"] += int(r.cache_hit)
        totals["estimated_calls"] += int(r.estimated)
        totals["failed_calls"] += int(r.failed)
    return totals


def _run_one(
    extractor: FactExtractor,
    doc: Document,
    now: datetime,
    max_chars: int | None = None,
    retried: set[str] | None = None,
) -> DocExtraction:
    if max_chars is not None and len(doc.text) > max_chars:
        return DocExtraction(
            docid=doc.docid,
            status="failed",
            error=f"document too large: {len(doc.text)} characters > extraction.max_doc_chars={max_chars}; "
            "split the document or raise extraction.max_doc_chars",
        )
    try:
        return extractor.extract_document(doc, now=now)
    except _FATAL:
        raise
    except LMTimeoutError as e:
        first = f"{type(e).__name__}: {e}"
    except Exception as e:  # one document's LM/transport failure never aborts the run
        return DocExtraction(docid=doc.docid, status="failed", error=f"{type(e).__name__}: {e}")
    # Timed out: tried once more with twice the timeout. On the server kitune starts, the abandoned
    # generation stopped when its connection closed, so the retry does not queue behind it.
    if retried is not None:
        retried.add(doc.docid)
    try:
        with timeout_scale(TIMEOUT_RETRY_SCALE):
            return extractor.extract_document(doc, now=now)
    except _FATAL:
        raise
    except Exception as e:
        return DocExtraction(
            docid=doc.docid,
            status="failed",
            error=f"{type(e).__name__}: {e} (the second try, with {TIMEOUT_RETRY_SCALE:g}x the timeout, "
            f"after: {first})",
        )


def extract_corpus(
    docs: Sequence[Document],
    store: Store,
    extractor: FactExtractor,
    *,
    cfg: KituneConfig,
    ledger: TokenLedger | None = None,
    state_path: Path | None = None,
    progress: bool = True,
    now: datetime | None = None,
    on_result: Callable[[DocExtraction], None] | None = None,
) -> ExtractionReport:
    """Extract every document not yet done and write its KIs to ``store``.

    The caller scopes the LM (``with dspy.context(lm=...)``); it reaches the worker threads.

    Args:
        docs: the corpus; repeated docids are extracted once (first wins). Documents not in it
            are treated as gone (their KIs are not refreshed).
        store: any :class:`kitune.retrieval.base.Store`: ``upsert`` for new KIs, ``iter_kis`` +
            ``mark_seen`` for the KIs of unchanged documents (see the module docstring).
        extractor: the program (its limits and prompt version apply).
        cfg: ``cfg.concurrency_for("extraction")`` and ``extraction.write_batch_size`` are used.
        ledger: token ledger the LM records into; calls made here are tagged stage ``extract``
            and summed into the report (None: tokens reported as 0).
        state_path: JSONL resume file (None: no resume, nothing written).
        progress: show a Rich progress bar on stderr.
        now: ``last_seen`` for every KI of this run (UTC); None: the run's start time.
        on_result: called in the calling thread with each document's result, in completion order.

    Returns:
        The :class:`ExtractionReport`; ``docs_done + docs_failed + docs_skipped == docs_total``
        unless the run aborted.

    Raises:
        LMAuthError, ConfigError: the LM cannot be used at all (after committing finished work).
        StoreUnavailableError: the store cannot be written (finished docs stay not-done).
    """
    started = time.monotonic()
    run_now = now or utcnow()
    first: dict[str, Document] = {}
    for d in docs:
        first.setdefault(d.docid, d)
    unique = list(first.values())
    state = read_state(state_path)
    hashes = {d.docid: document_hash(d) for d in unique}
    unchanged, changed = _unchanged_docs(unique, state, read_state_hashes(state_path), hashes)
    todo = [d for d in unique if d.docid not in unchanged]
    limit = cfg.extraction.max_doc_chars
    too_large = {
        d.docid: f"document too large: {len(d.text)} characters > extraction.max_doc_chars={limit}; "
        "split the document or raise extraction.max_doc_chars"
        for d in todo
        if limit is not None and len(d.text) > limit
    }
    todo = [d for d in todo if d.docid not in too_large]  # skipped with a reason, not failed
    skipped = len(unique) - len(todo)
    marker = ledger.snapshot() if ledger is not None else 0
    writer = _StateWriter(state_path, extractor.prompt_version)
    partial_final = extractor.partial_is_final  # the caller's LM context gives max_tokens
    for docid, reason in too_large.items():
        if state.get(docid) != "skipped":  # recorded once, not on every run
            writer.write(docid, "skipped", 0, reason)
    if too_large:
        writer.sync()
    bar = _Progress(progress, len(todo), ledger, marker)
    batch_size = cfg.extraction.write_batch_size
    flush_interval_s = cfg.extraction.flush_interval_s
    last_flush = time.monotonic()

    counters: Counter[str] = Counter()
    drops: Counter[str] = Counter()
    failed: dict[str, str] = {}
    parse_failed: dict[str, ParseFailure] = {}
    truncated: set[str] = set()
    retried: set[str] = set()  # filled by the worker threads (set.add is atomic)
    buffer: list[KI] = []
    pending: list[DocExtraction] = []  # ok docs whose KIs are in ``buffer``
    written = write_failures = done = finished = source_changed = 0

    def flush() -> None:
        nonlocal written, write_failures, done, last_flush, source_changed
        last_flush = time.monotonic()
        if not pending:
            return
        result = store.upsert(buffer) if buffer else None
        bad_ids = {f.id for f in result.failed} if result is not None else set()
        if result is not None:
            written += result.indexed
            write_failures += len(result.failed)
        for res in pending:
            bad = [k.id for k in res.kis if k.id in bad_ids]
            if bad:
                reason = f"store rejected {len(bad)} KI(s): {', '.join(bad[:3])}"
                failed[res.docid] = reason
                writer.write(res.docid, "failed", len(res.kis), reason)
            else:
                done += 1
                # "ok" or "partial"; a partial document gets no content hash, so the next run
                # re-extracts it — unless that run could not do better (extractor.partial_is_final)
                final = res.status == "ok" or (res.status == "partial" and partial_final)
                writer.write(
                    res.docid, res.status, len(res.kis), content=hashes.get(res.docid, "") if final else ""
                )
                if res.docid in changed:  # the new text's KIs are stored: the old text's facts expire
                    source_changed += expire_documents(
                        store, [res.docid], now=run_now, keep=[k.id for k in res.kis]
                    )
        writer.sync()
        buffer.clear()
        pending.clear()

    def handle(res: DocExtraction) -> None:
        nonlocal finished
        finished += 1
        counters.update(res.counters)
        drops.update(res.drops)
        if res.status in ("ok", "partial"):
            if res.status == "partial":
                truncated.add(res.docid)
            buffer.extend(res.kis)
            pending.append(res)
            if len(buffer) >= batch_size or time.monotonic() - last_flush >= flush_interval_s:
                flush()
        else:
            failed[res.docid] = res.error
            if res.parse_failure is not None:
                parse_failed[res.docid] = res.parse_failure
            writer.write(res.docid, "failed", 0, res.error, raw=res.raw, parse_failure=res.parse_failure)
            writer.sync()
        if on_result is not None:
            on_result(res)
        bar.advance(finished, written + len(buffer), len(failed))

    kis_refreshed = derived_refreshed = 0
    if unchanged:
        kis_refreshed = refresh_documents(store, sorted(unchanged), run_now)

    stage: contextlib.AbstractContextManager[None] = (
        ledger.stage("extract") if ledger is not None else contextlib.nullcontext()
    )
    workers = cfg.concurrency_for("extraction")
    try:
        with (
            stage,
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kitune-extract") as pool,
        ):
            futures: set[Future[DocExtraction]] = set()
            docs_iter: Iterator[Document] = iter(todo)
            window = workers * 2
            try:
                while True:
                    while len(futures) < window:
                        doc = next(docs_iter, None)
                        if doc is None:
                            break
                        ctx = contextvars.copy_context()  # one copy per task: stage + dspy.context
                        futures.add(
                            pool.submit(
                                ctx.run,
                                _run_one,
                                extractor,
                                doc,
                                run_now,
                                cfg.extraction.max_doc_chars,
                                retried,
                            )
                        )
                    if not futures:
                        break
                    finished_now, futures = wait(futures, return_when=FIRST_COMPLETED)
                    for fut in finished_now:
                        handle(fut.result())
            except (*_FATAL, KeyboardInterrupt):  # Ctrl-C too: finished documents are written first
                for fut in futures:
                    fut.cancel()
                with contextlib.suppress(StoreUnavailableError):
                    flush()
                raise
            flush()
        if written:
            store.optimize()  # a run is a bulk load: compact and index before the first query
        if cfg.lifecycle.derived_retention == "while_evidence":
            derived_refreshed = refresh_derived(store, first, run_now)
    finally:
        bar.close()
        writer.close()
    return ExtractionReport(
        docs_total=len(unique),
        docs_done=done,
        docs_failed=len(failed),
        docs_skipped=skipped,
        too_large=too_large,
        kis_written=written,
        write_failures=write_failures,
        drops=dict(drops),
        parse_failures=counters.get("parse_failures", 0),
        envelope_unwrapped=counters.get("envelope_unwrapped", 0),
        counters=dict(counters),
        tokens=_ledger_totals(ledger, marker),
        failed=failed,
        parse_failed=parse_failed,
        truncated=tuple(sorted(truncated)),
        retried=tuple(sorted(retried)),
        prompt_version=extractor.prompt_version,
        wall_s=time.monotonic() - started,
        docs_changed=len(changed),
        kis_source_changed=source_changed,
        kis_refreshed=kis_refreshed,
        derived_refreshed=derived_refreshed,
    )


def _unchanged_docs(
    docs: Sequence[Document], state: dict[str, str], old_hashes: dict[str, str], hashes: dict[str, str]
) -> tuple[set[str], set[str]]:
    """Split the done documents into unchanged (skip + refresh) and changed (re-extract).

    Done: ``ok``, or ``partial`` with a content hash (recorded only when no run could complete
    it, :attr:`FactExtractor.partial_is_final`). A document ``ok`` in a state file written before
    hashes were recorded counts as unchanged.
    """
    unchanged: set[str] = set()
    changed: set[str] = set()
    for d in docs:
        status = state.get(d.docid)
        if status != "ok" and not (status == "partial" and old_hashes.get(d.docid)):
            continue
        old = old_hashes.get(d.docid)
        if old is None or old == hashes[d.docid]:
            unchanged.add(d.docid)
        else:
            changed.add(d.docid)
    return unchanged, changed
