"""Domain bootstrap: look at a new corpus, describe it, draft its extractor, describe the source.

:func:`bootstrap_corpus` runs the steps the CLI (``kitune bootstrap``) and the HTTP API share:

1. load the corpus (prose or structured records, :func:`kitune.data.sampling.load_bootstrap_corpus`)
   and the example questions (``--questions``, else the corpus folder's own questions if any);
2. pick a seeded, diverse sample (:func:`kitune.data.sampling.sample_documents`);
3. one LM call describes the domain (:class:`kitune.programs.domain_describer.DomainDescriber`,
   ledger stage ``bootstrap:describe``);
4. the extractor draft is built deterministically from the description, pins kept
   (:func:`kitune.programs.extractor_drafter.draft_extractor`), and registered as a version of
   ``kitune-<corpus>-extractor`` with alias ``candidate`` (and ``production`` when none is set);
   a draft whose text is already registered reuses that version instead of adding a duplicate;
5. a few ``source_description`` KIs (built from the description, no LM call) are upserted into
   the store, tagged ``source-description`` plus ``entity:<corpus>`` and the main entity types;
6. a report (``report.md`` + ``report.json`` + ``description.json`` + ``extractor.txt`` +
   ``extractor.diff``) is written to ``<workdir>/bootstrap/<corpus>/`` (or ``out_dir``) and the
   description, draft, diff and report are logged to one tracking run.

Partial failures (an unusable description → fallback, a KI that breaks the KI rules, a store
write or registry failure) are recorded in :class:`BootstrapResult` and the report; only data and
configuration errors and LM errors raise.

This module is the orchestration; the steps' policies live next to it:
:mod:`~kitune.service.workflows.bootstrap_kis` (source-description KIs),
:mod:`~kitune.service.workflows.bootstrap_registry` (how the draft enters the prompt registry) and
:mod:`~kitune.service.workflows.bootstrap_report`
(:class:`~kitune.service.workflows.bootstrap_report.BootstrapResult`, the report files and what is
logged to the tracking run); import their names from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import dspy

import kitune.retrieval
from kitune.data.loaders import Question, load_questions
from kitune.data.sampling import LoadedCorpus, load_bootstrap_corpus, sample_documents
from kitune.errors import DataError, KituneError
from kitune.ki import slugify
from kitune.optimizers.program_task import store_program
from kitune.programs.domain_describer import DomainDescriber
from kitune.programs.extractor_drafter import draft_extractor
from kitune.retrieval import MemoryCorpusStore
from kitune.service.serving.prompts import production_setting
from kitune.service.workflows.bootstrap_kis import source_description_kis
from kitune.service.workflows.bootstrap_registry import draft_tags, register_draft
from kitune.service.workflows.bootstrap_report import (
    BootstrapResult,
    ledger_rows,
    log_report,
    write_report,
)
from kitune.tracking.prompts import PromptRegistry, prompt_name
from kitune.tracking.trackers import create_tracker
from kitune.usage import TokenLedger

if TYPE_CHECKING:
    from kitune.config import KituneConfig
    from kitune.optimizers.protocols import Tracker
    from kitune.retrieval.base import Store
    from kitune.retrieval.embedders import Embedder

__all__ = ["bootstrap_corpus", "default_out_dir"]

_QUESTION_FILES = ("ground_truth.jsonl", "queries.tsv", "questions.jsonl")


def default_out_dir(cfg: KituneConfig) -> Path:
    """``<workdir>/bootstrap/<corpus_name>``."""
    return Path(cfg.workdir) / "bootstrap" / (slugify(cfg.corpus_name) or "corpus")


def _find_questions(
    corpus: Path, questions_path: Path | None, doc_ids: set[str]
) -> tuple[list[Question], str]:
    if questions_path is not None:
        return load_questions(questions_path, doc_ids=doc_ids), str(questions_path)
    if corpus.is_dir() and any((corpus / f).is_file() for f in _QUESTION_FILES):
        return load_questions(corpus, doc_ids=doc_ids), str(corpus)
    return [], ""


def _field_hints(loaded: LoadedCorpus) -> dict[str, str]:
    n = len(loaded.documents)
    return {f.name: f"in {f.count} of {n} records, e.g. {'; '.join(f.examples)}" for f in loaded.fields[:40]}


def bootstrap_corpus(
    cfg: KituneConfig,
    corpus: Path | str,
    *,
    lm: dspy.LM,
    ledger: TokenLedger | None = None,
    questions_path: Path | str | None = None,
    pin_types: Sequence[str] = (),
    seed: int = 0,
    sample_size: int = 8,
    pool_size: int = 2000,
    embedder: Embedder | None = None,
    store: Store | None = None,
    tracker: Tracker | None = None,
    registry: PromptRegistry | None = None,
    register: bool = True,
    describer: DomainDescriber | None = None,
    out_dir: Path | str | None = None,
    now: datetime | None = None,
) -> BootstrapResult:
    """Run the domain bootstrap (see the module docstring for the steps).

    Args:
        cfg: config (``corpus_name``, ``workdir``, embedder, store, retrieval, tracking).
        corpus: a JSONL file or a folder (``corpus.jsonl``/``documents.jsonl``/``records.jsonl``).
        lm: the LM that writes the description (one call, two with the retry).
        ledger: token ledger (the report's token table reads it); None: a fresh one.
        questions_path: example questions; None: the corpus folder's questions if it has any.
        pin_types: entity types the draft must cover.
        seed: seeds the sample (same seed ⇒ same sample, and with a replayed LM the same draft).
        sample_size: documents shown to the LM (≥ 1; keep it small for a slow local model).
        pool_size: documents embedded for clustering at most.
        embedder: embeds the sample pool and the question corpus store; None: from ``cfg.embedder``.
        store: where the source-description KIs go; None: the KI table served for the corpus once
            the draft is registered (:func:`~kitune.service.serving.prompts.production_setting`,
            ``<table>-<sha8>`` of the production extractor; closed afterwards).
        tracker: where the run is logged; None: ``create_tracker(cfg)``.
        registry: the prompt registry; None: ``PromptRegistry(cfg.mlflow_uri)``.
        register: False skips the prompt registry.
        describer: None: ``DomainDescriber()`` with the packaged prompt.
        out_dir: report folder; None: :func:`default_out_dir`.
        now: ``last_seen`` of the KIs (UTC); None: now.

    Returns:
        :class:`BootstrapResult`.

    Raises:
        DataError: the corpus or questions are missing or malformed, or the corpus is empty.
        ValueError: ``sample_size`` < 1.
        kitune.errors.LMError: the description call failed.
        ConfigError / StoreUnavailableError: the store or embedder cannot be built.
    """
    if sample_size < 1:
        raise ValueError(f"sample_size must be >= 1, got {sample_size}")
    ledger = ledger if ledger is not None else TokenLedger()
    marker = ledger.snapshot()
    corpus_path = Path(corpus)
    loaded = load_bootstrap_corpus(corpus_path)
    if not loaded.documents:
        raise DataError(
            f"no documents found in {corpus_path}: expected one JSON object per line", path=str(corpus)
        )
    by_id = {d.docid: d for d in loaded.documents}
    questions, q_source = _find_questions(
        corpus_path, Path(questions_path) if questions_path else None, set(by_id)
    )
    embedder = embedder or kitune.retrieval.create_embedder(cfg.embedder)
    corpus_store = None
    if questions:
        corpus_store = MemoryCorpusStore(
            embedder, chunk_chars=cfg.retrieval.snippet_chars, rrf_k=cfg.retrieval.rrf_k
        )
        corpus_store.add_documents(loaded.documents)
    sample = sample_documents(
        loaded.documents,
        embedder,
        sample_size=sample_size,
        seed=seed,
        questions=questions,
        corpus_store=corpus_store,
        pool_size=pool_size,
    )
    describer = describer or DomainDescriber()
    with ledger.stage("bootstrap:describe"), dspy.context(lm=lm):
        described = describer.describe(
            [by_id[s.docid] for s in sample],
            corpus_name=cfg.corpus_name,
            kind=loaded.kind,
            fields=_field_hints(loaded),
            questions=[q.query for q in questions],
            pin_types=pin_types,
        )
    draft = draft_extractor(
        described.description,
        corpus_name=cfg.corpus_name,
        pin_types=pin_types,
        dialogue=loaded.kind == "dialogue",
    )
    confidence = 70 if described.status == "ok" else 30
    kis, rejected = source_description_kis(
        described.description,
        corpus_name=cfg.corpus_name,
        kind=loaded.kind,
        n_documents=len(loaded.documents),
        confidence=confidence,
        prompt_version=describer.prompt_version,
        now=now,
    )
    errors = {f"ki:{p}": reason for p, reason in rejected.items()}
    if described.status != "ok":
        errors["description"] = described.error
    out = Path(out_dir) if out_dir is not None else default_out_dir(cfg)
    name = prompt_name(cfg.corpus_name, "extractor")
    tracker = tracker if tracker is not None else create_tracker(cfg)
    params = {
        "corpus": str(corpus_path),
        "corpus_name": cfg.corpus_name,
        "seed": seed,
        "sample_size": sample_size,
        "pin_types": ",".join(pin_types),
        "kind": loaded.kind,
    }
    version: int | None = None
    aliases: tuple[str, ...] = ()
    reused = False
    written = 0
    reg_used: PromptRegistry | None = registry
    with ExitStack() as stack, tracker.run(f"bootstrap-{slugify(cfg.corpus_name)}", params) as run:
        if register:
            try:
                reg = registry if registry is not None else PromptRegistry(cfg.mlflow_uri)
                reg_used = reg
                tags = draft_tags(seed=seed, instruction_version=draft.version, run_id=run.run_id)
                version, aliases, reused = register_draft(reg, name, draft.text, tags=tags)
            except KituneError as e:
                errors["registry"] = f"{type(e).__name__}: {e}"
        if store is None:
            # the table served for this corpus now (after the draft's registration): where
            # `kitune context`, `serve` and the MCP resource look, not the base table
            served_cfg = production_setting(cfg, registry=reg_used, programs=(store_program(),)).store_cfg
            store = kitune.retrieval.create_store(served_cfg, embedder=embedder)
            stack.callback(store.close)
        result = store.upsert(kis)
        written = result.indexed
        for failure in result.failed:
            errors[f"store:{failure.id}"] = failure.reason
        res = BootstrapResult(
            corpus_name=cfg.corpus_name,
            corpus_path=str(corpus_path),
            kind=loaded.kind,
            n_documents=len(loaded.documents),
            seed=seed,
            sample=tuple(sample),
            description=described,
            draft=draft,
            pin_types=tuple(pin_types),
            questions_path=q_source,
            n_questions=len(questions),
            prompt_name=name,
            prompt_version=version,
            prompt_aliases=aliases,
            prompt_reused=reused,
            kis=tuple(kis),
            kis_written=written,
            errors=errors,
            tokens=tuple(ledger_rows(ledger, marker)),
            run_id=run.run_id,
            out_dir=str(out),
        )
        files = write_report(res, out, by_id)
        log_report(tracker, res, files)
    return res
