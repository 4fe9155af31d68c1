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
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dspy
from pydantic import ValidationError

from kitune.data.loaders import Question, load_questions
from kitune.data.sampling import LoadedCorpus, SampledDoc, load_bootstrap_corpus, sample_documents
from kitune.errors import KituneError, PromptNotFoundError
from kitune.ki import KI, KIPayload, KIProperties, doc_tag, entity_tag, ki_id, slugify, utcnow
from kitune.programs.domain_describer import DescriptionResult, DomainDescriber, DomainDescription
from kitune.programs.extractor_drafter import DraftedInstruction, draft_extractor
from kitune.usage import TokenLedger

if TYPE_CHECKING:
    from kitune.config import KituneConfig
    from kitune.experiments.prompts import PromptRegistry
    from kitune.experiments.tracking import Tracker
    from kitune.retrieval.base import Store
    from kitune.retrieval.embedders import Embedder

__all__ = [
    "SOURCE_DESCRIPTION_TAG",
    "BootstrapResult",
    "bootstrap_corpus",
    "default_out_dir",
    "ledger_totals",
    "register_draft",
    "render_markdown",
    "source_description_kis",
    "write_report",
]

SOURCE_DESCRIPTION_TAG = "source-description"
"""Plain tag on every source-description KI (filter on it, or on subtype ``source_description``)."""

_QUESTION_FILES = ("ground_truth.jsonl", "queries.tsv", "questions.jsonl")


@dataclass(frozen=True)
class BootstrapResult:
    """Everything one bootstrap produced (also written to ``report.json``)."""

    corpus_name: str
    corpus_path: str
    kind: str
    """``prose`` or ``records``."""
    n_documents: int
    seed: int
    sample: tuple[SampledDoc, ...]
    description: DescriptionResult
    draft: DraftedInstruction
    pin_types: tuple[str, ...]
    questions_path: str = ""
    n_questions: int = 0
    prompt_name: str = ""
    prompt_version: int | None = None
    """Registry version of the draft; None when not registered (see ``errors``)."""
    prompt_aliases: tuple[str, ...] = ()
    prompt_reused: bool = False
    """True when the same text was already registered (no new version was added)."""
    kis: tuple[KI, ...] = ()
    """Source-description KIs that passed the KI rules."""
    kis_written: int = 0
    errors: dict[str, str] = field(default_factory=dict)
    """What failed without stopping the run: ``registry``, ``ki:<predicate>``, ``store:<id>``."""
    tokens: tuple[dict[str, Any], ...] = ()
    """Ledger rows (role, stage, calls, input_tokens, output_tokens, …) of this run."""
    run_id: str | None = None
    out_dir: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (the content of ``report.json``)."""
        return {
            "corpus_name": self.corpus_name,
            "corpus_path": self.corpus_path,
            "kind": self.kind,
            "n_documents": self.n_documents,
            "seed": self.seed,
            "questions": {"path": self.questions_path, "count": self.n_questions},
            "sample": [{"docid": s.docid, "reason": s.reason, "why": s.why()} for s in self.sample],
            "description": self.description.description.model_dump(mode="json"),
            "description_status": self.description.status,
            "description_error": self.description.error,
            "lm_calls": self.description.lm_calls,
            "draft": {
                "version": self.draft.version,
                "neutral_version": self.draft.neutral_version,
                "entity_types": list(self.draft.entity_types),
                "pin_types": list(self.pin_types),
                "pins_restored": list(self.draft.pins_restored),
                "diff": self.draft.diff,
            },
            "prompt": {
                "name": self.prompt_name,
                "version": self.prompt_version,
                "aliases": list(self.prompt_aliases),
                "reused": self.prompt_reused,
            },
            "kis": [
                {"id": k.id, "title": k.title, "predicate": k.payload.properties.predicate, "tags": k.tags}
                for k in self.kis
            ],
            "kis_written": self.kis_written,
            "errors": dict(self.errors),
            "tokens": list(self.tokens),
            "run_id": self.run_id,
        }


def default_out_dir(cfg: KituneConfig) -> Path:
    """``<workdir>/bootstrap/<corpus_name>``."""
    return Path(cfg.workdir) / "bootstrap" / (slugify(cfg.corpus_name) or "corpus")


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip(" ,;") + "…"


def source_description_kis(
    description: DomainDescription,
    *,
    corpus_name: str,
    kind: str,
    n_documents: int,
    confidence: int = 70,
    prompt_version: str = "",
    now: datetime | None = None,
) -> tuple[list[KI], dict[str, str]]:
    """Build the KIs that describe the source itself (no LM call; deterministic ids).

    One KI per aspect the description has: what the collection holds (always), its entity
    types and relations, its record fields (records only), its date range, how it is queried.
    Each has ``payload.subtype="source_description"`` and ``payload.type="domain_description"``
    (its evidence is the description, quoted as ``"description.<key>: <value>"``), subject
    ``corpus_name``, doc id ``source-<corpus slug>``, and tags ``source-description``,
    ``entity:<corpus slug>``, ``doc:source-<corpus slug>`` plus an ``entity:`` and a plain tag per
    main entity type (at most five).

    Returns:
        ``(kis, rejected)``: valid KIs in aspect order, and predicate → reason for any that broke
        the KI rules (recorded, not raised).
    """
    slug = slugify(corpus_name) or "corpus"
    docid = f"source-{slug}"
    d = description
    types = list(d.entity_types[:5])
    type_tags = [entity_tag(t) for t in types if entity_tag(t) != "entity:"]
    plain = [slugify(t) for t in types if slugify(t)]
    base_tags = [SOURCE_DESCRIPTION_TAG, entity_tag(corpus_name), *type_tags, *plain]
    unit = "records" if kind == "records" else "documents"
    kinds = ", ".join(d.document_kinds) or unit
    aspects: list[tuple[str, str, str, str, str]] = [
        (
            "holds_documents_about",
            d.domain,
            f"The {corpus_name} collection holds {kinds} about {d.domain}",
            f"{d.summary} It has {n_documents} {unit}. "
            f"Main entity types: {', '.join(types) or 'not described'}.",
            f"description.domain: {d.domain}",
        )
    ]
    if d.entity_types:
        rel = ", ".join(d.predicates) or "not described"
        aspects.append(
            (
                "covers_entity_types",
                ", ".join(d.entity_types),
                f"The {corpus_name} collection has facts about: {', '.join(d.entity_types)}",
                f"Entity types in the {corpus_name} collection: {', '.join(d.entity_types)}. "
                f"Relations between them: {rel}.",
                f"description.entity_types: {', '.join(d.entity_types)}",
            )
        )
    if kind == "records" and d.fields:
        names = ", ".join(d.fields)
        meanings = "; ".join(f"{k} = {v}" if v else k for k, v in d.fields.items())
        aspects.append(
            (
                "has_fields",
                names,
                f"The {corpus_name} records have the fields {names}",
                f"Each {corpus_name} record has these fields: {meanings}.",
                f"description.fields: {meanings}",
            )
        )
    if d.date_range is not None and d.date_range.label():
        label = d.date_range.label()
        aspects.append(
            (
                "spans_dates",
                label,
                f"The {corpus_name} collection covers dates {label}",
                f"Dates seen in a sample of the {corpus_name} collection range over {label}.",
                f"description.date_range: {label}",
            )
        )
    if d.query_patterns:
        patterns = "; ".join(d.query_patterns)
        aspects.append(
            (
                "is_queried_by",
                patterns,
                f"The {corpus_name} collection is asked questions such as: {d.query_patterns[0]}",
                f"Typical questions about the {corpus_name} collection: {patterns}.",
                f"description.query_patterns: {patterns}",
            )
        )
    kis: list[KI] = []
    rejected: dict[str, str] = {}
    stamp = now or utcnow()
    for predicate, obj, title, text, evidence in aspects:
        obj_cut = _cut(obj, 200)
        try:
            kis.append(
                KI(
                    id=ki_id(docid, corpus_name, predicate, obj_cut),
                    title=_cut(title, 140),
                    description=_cut(text, 350),
                    references=[f"index://{corpus_name}"],
                    tags=[*base_tags, doc_tag(docid)],
                    evidence_doc_ids=[docid],
                    payload=KIPayload(
                        type="domain_description",
                        subtype="source_description",
                        properties=KIProperties(
                            subject=corpus_name, predicate=predicate, object=obj_cut, docid=docid
                        ),
                        evidence=[_cut(evidence, 300)],
                        confidence=confidence,
                        last_seen=stamp,
                    ),
                    prompt_version=prompt_version,
                )
            )
        except ValidationError as e:
            rejected[predicate] = "; ".join(err["msg"] for err in e.errors())[:300]
    return kis, rejected


def register_draft(
    registry: PromptRegistry, name: str, text: str, *, tags: dict[str, str]
) -> tuple[int, tuple[str, ...], bool]:
    """Register ``text`` as a version of ``name``; alias ``candidate``, and ``production`` if unset.

    A version with exactly this text already present is reused (no duplicate version).

    Returns:
        ``(version, kitune aliases now pointing at it, reused)``.

    Raises:
        TrackingError: the registry could not be read or written.
    """
    existing = None
    try:
        existing = next((v for v in registry.versions(name) if v.text.strip() == text.strip()), None)
    except PromptNotFoundError:
        existing = None
    if existing is not None:
        version, reused = existing.version, True
    else:
        version = registry.register(
            name, text, tags=tags, commit_message="kitune bootstrap: domain draft"
        ).version
        reused = False
    aliases = ["candidate"]
    registry.set_alias(name, "candidate", version)
    try:
        if registry.get(name, "production").version == version:
            aliases.append("production")
    except PromptNotFoundError:
        registry.promote(name, version)
        aliases.append("production")
    return version, tuple(aliases), reused


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
        store: where the source-description KIs go; None: ``create_store(cfg)`` (closed afterwards).
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
    from kitune.errors import DataError
    from kitune.experiments.prompts import PromptRegistry, prompt_name
    from kitune.experiments.tracking import create_tracker
    from kitune.retrieval import MemoryCorpusStore, create_embedder, create_store

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
    embedder = embedder or create_embedder(cfg.embedder)
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
    with ExitStack() as stack, tracker.run(f"bootstrap-{slugify(cfg.corpus_name)}", params) as run:
        if register:
            try:
                reg = registry if registry is not None else PromptRegistry(cfg.mlflow_uri)
                tags = {
                    "kitune.source": "bootstrap",
                    "kitune.seed": str(seed),
                    "kitune.instruction_version": draft.version,
                }
                if run.run_id:
                    tags["kitune.run_id"] = run.run_id
                version, aliases, reused = register_draft(reg, name, draft.text, tags=tags)
            except KituneError as e:
                errors["registry"] = f"{type(e).__name__}: {e}"
        if store is None:
            store = create_store(cfg, embedder=embedder)
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
            tokens=tuple(_ledger_rows(ledger, marker)),
            run_id=run.run_id,
            out_dir=str(out),
        )
        files = write_report(res, out, by_id)
        tracker.log_dict(described.description.model_dump(mode="json"), "bootstrap/description.json")
        tracker.log_text(draft.text, "prompts/extractor.txt")
        tracker.log_text(draft.diff or "(no change)\n", "bootstrap/extractor.diff")
        tracker.log_artifact(files["report.md"], "bootstrap")
        tracker.log_artifact(files["report.json"], "bootstrap")
        totals = ledger_totals(res.tokens)
        tracker.log_metrics(
            {
                "sample_docs": float(len(sample)),
                "source_kis_written": float(written),
                "lm_calls": float(totals["calls"]),
                "input_tokens": float(totals["input_tokens"]),
                "output_tokens": float(totals["output_tokens"]),
                "description_ok": 1.0 if described.status == "ok" else 0.0,
            }
        )
    return res


def _ledger_rows(ledger: TokenLedger, marker: int) -> list[dict[str, Any]]:
    sub = TokenLedger()
    for rec in ledger.since(marker):
        sub.record(rec)
    return sub.to_rows()


def ledger_totals(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Sum ``calls``/``input_tokens``/``output_tokens`` over ledger rows."""
    keys = ("calls", "input_tokens", "output_tokens")
    return {k: sum(int(r.get(k, 0)) for r in rows) for k in keys}


def write_report(res: BootstrapResult, out: Path, docs: dict[str, Any]) -> dict[str, Path]:
    """Write ``report.md``, ``report.json``, ``description.json``, ``extractor.txt``, ``extractor.diff``.

    Returns:
        File name → path written.
    """
    out.mkdir(parents=True, exist_ok=True)
    data = res.to_dict()
    files = {
        "report.json": out / "report.json",
        "report.md": out / "report.md",
        "description.json": out / "description.json",
        "extractor.txt": out / "extractor.txt",
        "extractor.diff": out / "extractor.diff",
    }
    files["report.json"].write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    files["description.json"].write_text(
        json.dumps(data["description"], indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    files["extractor.txt"].write_text(res.draft.text + "\n", encoding="utf-8")
    files["extractor.diff"].write_text(res.draft.diff, encoding="utf-8")
    files["report.md"].write_text(render_markdown(res, docs), encoding="utf-8")
    return files


def render_markdown(res: BootstrapResult, docs: dict[str, Any]) -> str:
    """The human-readable report: sample, description, diff, KIs, tokens, errors."""
    d = res.description.description
    lines = [
        f"# Bootstrap of `{res.corpus_name}`",
        "",
        f"- corpus: `{res.corpus_path}` ({res.kind}, {res.n_documents} documents)",
        f"- questions: `{res.questions_path or 'none'}` ({res.n_questions})",
        f"- seed: {res.seed}; sample: {len(res.sample)} documents",
        f"- description: {res.description.status} ({res.description.lm_calls} LM call(s))"
        + (f" — {res.description.error}" if res.description.error else ""),
        f"- draft: `{res.draft.version}` (from `{res.draft.neutral_version}`); pinned types: "
        f"{', '.join(res.pin_types) or 'none'}; restored: {', '.join(res.draft.pins_restored) or 'none'}",
        f"- prompt registry: `{res.prompt_name}` v{res.prompt_version} "
        f"aliases {', '.join(res.prompt_aliases) or '-'}"
        + (" (same text already registered: reused)" if res.prompt_reused else ""),
        f"- source-description KIs written: {res.kis_written}/{len(res.kis)}",
        f"- tracking run: {res.run_id or 'none'}",
        "",
        "## Sample",
        "",
        "| docid | title | why |",
        "|---|---|---|",
    ]
    for s in res.sample:
        title = getattr(docs.get(s.docid), "title", "") or ""
        lines.append(f"| {s.docid} | {_cut(title, 60).replace('|', '/')} | {s.why().replace('|', '/')} |")
    lines += [
        "",
        "## Description",
        "",
        "```json",
        json.dumps(d.model_dump(mode="json"), indent=2, ensure_ascii=False),
    ]
    lines += ["```", "", "## Extractor draft (diff from the neutral instruction)", "", "```diff"]
    lines += [res.draft.diff.rstrip("\n") or "(no change)", "```", "", "## Source-description KIs", ""]
    lines += [f"- `{k.id}` {k.title}" for k in res.kis] or ["(none)"]
    lines += [
        "",
        "## Tokens",
        "",
        "| role | stage | calls | input tokens | output tokens |",
        "|---|---|---|---|---|",
    ]
    for row in res.tokens:
        lines.append(
            f"| {row['role']} | {row['stage']} | {row['calls']} "
            f"| {row['input_tokens']} | {row['output_tokens']} |"
        )
    if res.errors:
        lines += ["", "## Recorded failures", ""]
        lines += [f"- {k}: {v}" for k, v in sorted(res.errors.items())]
    return "\n".join(lines) + "\n"
