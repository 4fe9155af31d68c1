"""Extraction variants with the embedded model: which one gives fuller, still verbatim-grounded KIs?

For each variant, the fixture documents that hold the answers of the 24 fixture questions
(``qrel_golds.txt``; a question without one falls back to its ``qrel_evidence.txt`` documents;
``--docs evidence`` takes every evidence document) are extracted through the real pipeline —
:func:`kitune.service.pipelines.extraction.extract_corpus` at the configured concurrency (the embedded
server's slots), guardrails included, so every KI kept has a verbatim evidence span. Per variant:

* **KIs/document** (mean, and the share of documents with at least 3);
* **answer coverage**: how many of the 24 questions have their gold answer (or an alias) in the
  title or description of a KI of one of their gold documents — the text the agent reads —
  compared folded and as whole words (:func:`kitune.text.contains_answer`); the ceiling is the
  number of questions whose answer is in the gold documents' own text;
* **drops by reason** (guardrails) and records rejected while parsing (with their causes);
* **output tokens/document**, LM calls/document and **wall time** (seconds, and per document).

Variants (all on top of ``--config``, by default ``configs/experiments/demo.yaml``: the
embedded model, sentence-indexed evidence, at most 6 facts and 700 output tokens per call):

``default``       today's embedded setting: one call per document, the output schema sent as
                  ``{"type": "json_object", "schema": ...}``, which llama.cpp compiles into a
                  grammar (what :class:`kitune.lm.LocalJSONAdapter` sends; ``lm/formats.py`` keeps
                  the local model at the ``json_object`` rung);
``no-grammar``    the same prompt with no ``response_format`` (prompt-only JSON): what the grammar buys;
``min3``          the grammar with ``minItems: 3`` on the facts list (decoding cannot stop before 3);
``schema-limits`` the grammar with the guardrails' limits (title <= 140, description <= 350
                  characters, 1-3 cited sentences), so no fact is dropped for its length;
``per-sentence``  one call per numbered sentence (``extraction.call_unit: sentence``);
``few-shot``      two hand-written demonstrations (DSPy demos, ``benchmarks/extraction_demos.json``)
                  from fixture paragraphs that are evidence for no question (checked: no leakage);
``few-shot-limits``  few-shot's demonstrations with schema-limits' grammar;
``cap15``         the fact cap raised: ``max_facts_per_doc`` 15 and 1,500 output tokens;
``per-sentence-cap15``  both; the fact cap changes no request, so it replays per-sentence's
                  recorded calls (``kitune.recording``) instead of calling the model again, and
                  reports per-sentence's cost.

Every variant that calls the model records its calls to ``<work>/<variant>.<key>.calls/``.
Resumable: each variant's documents are appended to ``<work>/<variant>.<key>.jsonl`` as they
finish (the key hashes the variant, the instruction, the model and the settings), so a rerun
extracts only what is missing and reports from the files. ``--determinism N`` also extracts the
first N documents of ``default`` one at a time and reports how many give the concurrent run's KIs.

Usage (the real model; serialised with other users of the model by the lock)::

    flock /work/logs/model.lock python benchmarks/extraction_variants.py
    python benchmarks/extraction_variants.py --variants default,per-sentence --determinism 8

Writes ``benchmarks/results/extraction_variants.{json,md}`` (``--name`` changes the stem).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import dspy
from _common import machine_info, markdown_table, write_results

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / ".." / "shared" / "data" / "fixture"
DEMOS = Path(__file__).resolve().parent / "extraction_demos.json"
DEFAULT_CONFIG = ROOT / "configs" / "experiments" / "demo.yaml"
GOAL_KIS_PER_DOC = 3.0
GOAL_COVERAGE = 20


@dataclass(frozen=True)
class Variant:
    """One extraction setting to measure."""

    name: str
    about: str
    overrides: dict[str, Any] = field(default_factory=dict)
    """Dotted config overrides on top of the base config."""
    response_format: str = "schema"
    """``schema`` (what kitune sends today), ``none`` (prompt-only JSON), ``min-items`` or ``limits``."""
    min_items: int = 0
    """``minItems`` on the facts list (``response_format="min-items"``)."""
    demos: bool = False
    """Put the demonstrations of ``extraction_demos.json`` on the predictor."""
    limit: int | None = None
    """Extract only the first ``limit`` measured documents (the determinism check)."""
    replays: str | None = None
    """A variant whose requests are the same (only the guardrails differ, e.g. the fact cap): this
    one replays that variant's recorded LM calls instead of calling the model."""


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant(
            "default",
            "one call per document, output schema as grammar, no length limits (before grammar_limits)",
        ),
        Variant(
            "no-grammar", "the same prompt, no response_format (prompt-only JSON)", response_format="none"
        ),
        Variant(
            "min3", "grammar with minItems 3 on the facts list", response_format="min-items", min_items=3
        ),
        Variant(
            "schema-limits",
            "grammar with the guardrails' limits: title <= 140, description <= 350 chars, 1-3 citations",
            response_format="limits",
        ),
        Variant("per-sentence", "one call per numbered sentence", {"extraction.call_unit": "sentence"}),
        Variant(
            "few-shot-limits",
            "the two demonstrations and the grammar with the guardrails' limits",
            response_format="limits",
            demos=True,
        ),
        Variant("few-shot", "two hand-written demonstrations from other fixture paragraphs", demos=True),
        Variant(
            "cap15",
            "fact cap 15 and 1,500 output tokens",
            {"extraction.max_facts_per_doc": 15, "lm.extract.max_tokens": 1500},
        ),
        Variant(
            "per-sentence-cap15",
            "one call per numbered sentence, fact cap 15 (per-sentence's calls replayed)",
            {"extraction.call_unit": "sentence", "extraction.max_facts_per_doc": 15},
            replays="per-sentence",
        ),
    )
}


def measured_documents(data: Path, which: str = "golds") -> tuple[list[Any], list[Any], dict[str, list[str]]]:
    """The documents to extract, the questions, and each question's gold documents.

    Args:
        data: a BrowseComp-Plus-layout folder (the fixture).
        which: ``golds`` (the documents holding the answers; evidence documents for a question
            without golds) or ``evidence`` (every evidence and gold document).

    Returns:
        ``(documents in first-mention order, questions, query id → gold doc ids)``.

    Raises:
        ValueError: ``which`` is neither; a named document is missing from the corpus.
    """
    from kitune.data.loaders import load_corpus, load_questions

    if which not in ("golds", "evidence"):
        raise ValueError(f"--docs {which!r}: use golds or evidence")
    questions = load_questions(data)
    corpus = {d.docid: d for d in load_corpus(data)}
    golds = {q.query_id: list(q.gold_docids or q.evidence_docids) for q in questions}
    wanted: list[str] = []
    for q in questions:
        ids = golds[q.query_id] if which == "golds" else [*q.evidence_docids, *q.gold_docids]
        wanted += [d for d in ids if d not in wanted]
    missing = [d for d in wanted if d not in corpus]
    if missing:
        raise ValueError(f"{data}: documents {missing[:5]} named by the qrels are not in the corpus")
    return [corpus[d] for d in wanted], questions, golds


def answer_coverage(
    questions: Sequence[Any], golds: dict[str, list[str]], kis_by_doc: dict[str, list[dict[str, Any]]]
) -> dict[str, bool]:
    """Query id → True when a KI (title or description) of a gold document states the answer.

    The answer or an alias must appear folded and as whole words (:func:`kitune.text.contains_answer`).
    """
    from kitune.text import contains_answer

    out: dict[str, bool] = {}
    for q in questions:
        answers = [q.answer, *q.aliases]
        out[q.query_id] = any(
            contains_answer(f"{k['title']} {k['description']}", answers)
            for d in golds[q.query_id]
            for k in kis_by_doc.get(d, [])
        )
    return out


def answer_ceiling(questions: Sequence[Any], golds: dict[str, list[str]], docs: dict[str, Any]) -> list[str]:
    """Query ids whose answer appears (folded, whole words) in the text of one of their gold documents."""
    from kitune.text import contains_answer

    return [
        q.query_id
        for q in questions
        if any(d in docs and contains_answer(docs[d].text, [q.answer, *q.aliases]) for d in golds[q.query_id])
    ]


def load_demos(path: Path, corpus: dict[str, Any], measured: set[str]) -> list[Any]:
    """The demonstrations as ``dspy.Example`` s in the sentence-indexed format (text as numbered sentences).

    Raises:
        ValueError: a demonstration's document is measured (leakage) or not in the corpus.
    """
    from kitune.programs.records import SentenceFactRecord
    from kitune.programs.sentences import numbered_text, sentence_spans

    data = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for demo in data["demos"]:
        docid = demo["docid"]
        if docid in measured:
            raise ValueError(f"demonstration document {docid} is measured: pick one no question uses")
        if docid not in corpus:
            raise ValueError(f"demonstration document {docid} is not in the corpus")
        doc = corpus[docid]
        text = numbered_text(doc.text, sentence_spans(doc.text))
        facts = [SentenceFactRecord.model_validate(f) for f in demo["facts"]]
        out.append(dspy.Example(docid=docid, url=doc.url, title=doc.title, text=text, facts=facts))
    return out


def _adapter(variant: Variant) -> Any:
    """The DSPy adapter for ``variant``; None: the extractor's own (:func:`kitune.lm.default_adapter`)."""
    from kitune.ki import DESCRIPTION_MAX_CHARS, TITLE_MAX_CHARS
    from kitune.lm import LocalJSONAdapter

    if variant.response_format == "schema":
        return None
    if variant.response_format == "none":

        class PromptOnlyJSONAdapter(dspy.JSONAdapter):  # type: ignore[misc]
            """JSONAdapter's prompt with no ``response_format``: no grammar."""

            def _prepare_response_format(self, lm: Any, lm_kwargs: dict[str, Any], signature: Any) -> None:
                return None

        return PromptOnlyJSONAdapter()
    if variant.response_format == "limits":

        class LimitsAdapter(LocalJSONAdapter):
            """The local schema with the guardrails' length limits, so decoding cannot break them."""

            def _prepare_response_format(self, lm: Any, lm_kwargs: dict[str, Any], signature: Any) -> None:
                super()._prepare_response_format(lm, lm_kwargs, signature)
                schema = (lm_kwargs.get("response_format") or {}).get("schema") or {}
                for record in (schema.get("$defs") or {}).values():
                    props = record.get("properties", {})
                    if "title" in props:
                        props["title"]["maxLength"] = TITLE_MAX_CHARS
                    if "description" in props:
                        props["description"]["maxLength"] = DESCRIPTION_MAX_CHARS
                    if "evidence_sentences" in props:
                        props["evidence_sentences"].update(minItems=1, maxItems=3)

        return LimitsAdapter()
    n = variant.min_items

    class MinItemsAdapter(LocalJSONAdapter):
        """The local schema with ``minItems`` on the facts list."""

        def _prepare_response_format(self, lm: Any, lm_kwargs: dict[str, Any], signature: Any) -> None:
            super()._prepare_response_format(lm, lm_kwargs, signature)
            schema = (lm_kwargs.get("response_format") or {}).get("schema")
            if isinstance(schema, dict) and "facts" in schema.get("properties", {}):
                schema["properties"]["facts"]["minItems"] = n

    return MinItemsAdapter()


def _key(variant: Variant, cfg: Any, instructions: str) -> str:
    """What the cached documents depend on: the variant, the instruction, the model and the settings."""
    described = {k: v for k, v in asdict(variant).items() if not (k == "replays" and v is None)}
    blob = json.dumps(
        {
            "variant": described,
            "instructions": instructions,
            "model": cfg.lm.model_label("extract"),
            "extract": cfg.lm.extract.model_dump(mode="json"),
            "extraction": cfg.extraction.model_dump(mode="json"),
            "demos": DEMOS.read_text(encoding="utf-8") if variant.demos else "",
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def _read_cache(path: Path) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    docs: dict[str, dict[str, Any]] = {}
    segments: list[dict[str, Any]] = []
    if not path.is_file():
        return docs, segments
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a crash mid-write: that document is extracted again
            continue
        if rec.get("kind") == "doc":
            docs[rec["docid"]] = rec
        elif rec.get("kind") == "segment":
            segments.append(rec)
    return docs, segments


def _append(path: Path, rec: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        fh.flush()


def run_variant(
    variant: Variant,
    docs: Sequence[Any],
    *,
    base_cfg: Any,
    make_lm: Callable[[Any, Any], Any],
    work: Path,
    corpus: dict[str, Any],
    measured: set[str],
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Extract the documents of ``docs`` that ``variant``'s cache lacks; return its documents and segments.

    Args:
        variant: the setting.
        docs: the measured documents (``variant.limit`` takes the first ones).
        base_cfg: the base :class:`kitune.config.KituneConfig`.
        make_lm: ``(cfg, ledger) -> dspy.LM`` for the extract role.
        work: folder of the per-variant caches.
        corpus: docid → document (the demonstrations' texts).
        measured: every measured docid (demonstrations must not be among them).
        progress: let :func:`extract_corpus` print progress lines.
        log: where the variant's own lines go.

    Returns:
        ``(docid → cached record, segments, info)``: a record holds the status, the KIs (JSON),
        drops and counters; a segment the wall time and ledger totals of one run; ``info`` the
        LM's format level and downgrades in this run.
    """
    from kitune.config import with_overrides
    from kitune.programs.fact_extractor import FactExtractor
    from kitune.retrieval.memory import MemoryStore
    from kitune.service.pipelines.extraction import extract_corpus
    from kitune.usage import TokenLedger

    cfg = with_overrides(base_cfg, variant.overrides)
    extractor = FactExtractor.from_config(cfg)
    instructions = extractor.extract.signature.instructions
    if variant.demos:
        extractor.extract.demos = load_demos(DEMOS, corpus, measured)
    stem = f"{variant.name}.{_key(variant, cfg, instructions)}"
    path = work / f"{stem}.jsonl"
    if variant.replays is None:  # every call recorded, so variants with the same requests can replay it
        cfg = with_overrides(cfg, {"lm.record_dir": str(work / f"{stem}.calls")})
    else:
        base = VARIANTS[variant.replays]
        base_cfg_v = with_overrides(base_cfg, base.overrides)
        calls = work / f"{base.name}.{_key(base, base_cfg_v, instructions)}.calls"
        if not (calls / "calls.jsonl").is_file():
            raise ValueError(f"variant {variant.name} replays {base.name}'s calls: run {base.name} first")
        cfg = with_overrides(cfg, {"lm.replay_dir": str(calls)})
    cached, segments = _read_cache(path)
    todo = [d for d in (docs[: variant.limit] if variant.limit else docs) if d.docid not in cached]
    info: dict[str, Any] = {"cache": str(path)}
    if not todo:
        log(f"[{variant.name}] all {len(cached)} documents cached in {path.name}")
        return cached, segments, info
    log(f"[{variant.name}] extracting {len(todo)} document(s) ({len(cached)} cached) — {variant.about}")
    work.mkdir(parents=True, exist_ok=True)
    ledger = TokenLedger()
    lm = make_lm(cfg, ledger)

    def on_result(res: Any) -> None:
        rec = {
            "kind": "doc",
            "docid": res.docid,
            "status": res.status,
            "kis": [k.model_dump(mode="json") for k in res.kis],
            "drops": dict(res.drops),
            "counters": dict(res.counters),
            "error": res.error[:300],
        }
        cached[res.docid] = rec
        _append(path, rec)

    context: dict[str, Any] = {"lm": lm}
    adapter = _adapter(variant)
    if adapter is not None:
        context["adapter"] = adapter
    with dspy.context(**context):
        report = extract_corpus(
            todo, MemoryStore(), extractor, cfg=cfg, ledger=ledger, progress=progress, on_result=on_result
        )
    segment = {
        "kind": "segment",
        "docs": report.docs_done + report.docs_failed,
        "wall_s": report.wall_s,
        "tokens": report.tokens,
        "concurrency": cfg.concurrency_for("extraction"),
    }
    segments.append(segment)
    _append(path, segment)
    info.update(
        format_level=getattr(lm, "format_level", None),
        downgrades=dict(getattr(lm, "fallback_counts", {}) or {}),
    )
    log(
        f"[{variant.name}] {report.docs_done} done, {report.docs_failed} failed, {report.kis_written} KIs "
        f"in {report.wall_s:.0f} s"
    )
    return cached, segments, info


def summarize_variant(
    variant: Variant,
    records: dict[str, dict[str, Any]],
    segments: list[dict[str, Any]],
    questions: Sequence[Any],
    golds: dict[str, list[str]],
    docs: Sequence[Any],
) -> dict[str, Any]:
    """The per-variant figures (see the module docstring) from its cached documents and segments."""
    from kitune.programs.sentences import sentence_spans

    ids = [d.docid for d in (docs[: variant.limit] if variant.limit else docs)]
    recs = [records[i] for i in ids if i in records]
    n = max(len(recs), 1)
    kis = [len(r["kis"]) for r in recs]
    sentences = sum(len(sentence_spans(d.text)) for d in docs if d.docid in set(ids) & set(records))
    status = Counter(r["status"] for r in recs)
    drops: Counter[str] = Counter()
    counters: Counter[str] = Counter()
    for r in recs:
        drops.update(r["drops"])
        counters.update(r["counters"])
    covered = answer_coverage(questions, golds, {r["docid"]: r["kis"] for r in recs})
    tokens: Counter[str] = Counter()
    for s in segments:
        tokens.update(s["tokens"])
    wall = sum(s["wall_s"] for s in segments)
    # tokens and time per document over the documents a finished run timed (a run killed before
    # its end leaves documents in the cache but no segment)
    timed = max(sum(s["docs"] for s in segments), 1)
    return {
        "variant": variant.name,
        "about": variant.about,
        "docs": len(recs),
        "kis_total": sum(kis),
        "kis_per_doc": sum(kis) / n,
        "kis_per_sentence": sum(kis) / max(sentences, 1),
        "docs_with_3_kis": sum(k >= 3 for k in kis),
        "coverage": sum(covered.values()),
        "covered": sorted((q for q, ok in covered.items() if ok), key=lambda q: int(q) if q.isdigit() else 0),
        "status": dict(status),
        "drops": dict(sorted(drops.items())),
        "rejected_while_parsing": counters.get("records_rejected", 0),
        "counters": dict(sorted(counters.items())),
        "lm_calls": tokens.get("calls", 0),
        "docs_timed": sum(s["docs"] for s in segments),
        "lm_calls_per_doc": tokens.get("calls", 0) / timed,
        "output_tokens": tokens.get("output_tokens", 0),
        "output_tokens_per_doc": tokens.get("output_tokens", 0) / timed,
        "input_tokens_per_doc": tokens.get("input_tokens", 0) / timed,
        "failed_calls": tokens.get("failed_calls", 0),
        "wall_s": wall,
        "wall_s_per_doc": wall / timed,
        "kis_by_doc": {r["docid"]: len(r["kis"]) for r in recs},
        "errors": {r["docid"]: r["error"] for r in recs if r["error"]},
    }


def same_kis(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """True when two cached document records hold the same KIs (id, title, description, evidence)."""

    def key(rec: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [(k["id"], k["title"], k["description"], tuple(k["payload"]["evidence"])) for k in rec["kis"]]

    return key(a) == key(b)


def summary_md(results: dict[str, dict[str, Any]], n_questions: int, ceiling: int, determinism: Any) -> str:
    """The Markdown tables: one row per variant, then drops by reason and per-question coverage."""
    rows = []
    for r in results.values():
        rows.append(
            [
                r["variant"],
                r["about"],
                str(r["docs"]),
                f"{r['kis_per_doc']:.2f}",
                f"{r['docs_with_3_kis']}/{r['docs']}",
                f"{r['coverage']}/{n_questions}",
                f"{r['output_tokens_per_doc']:.0f}",
                f"{r['lm_calls_per_doc']:.1f}",
                f"{r['wall_s']:.0f}" + (f" ({r['docs_timed']} docs)" if r["docs_timed"] != r["docs"] else ""),
                f"{r['wall_s_per_doc']:.1f}",
                ", ".join(f"{k} {v}" for k, v in sorted(r["status"].items())),
            ]
        )
    table = markdown_table(
        [
            "variant",
            "what",
            "docs",
            "KIs/doc",
            "docs ≥ 3 KIs",
            "answer coverage",
            "output tokens/doc",
            "LM calls/doc",
            "wall s",
            "s/doc",
            "status",
        ],
        rows,
    )
    reasons = sorted({k for r in results.values() for k in r["drops"]})
    drop_rows = [[k, *(str(r["drops"].get(k, 0)) for r in results.values())] for k in reasons]
    drop_rows.append(
        ["rejected while parsing", *(str(r["rejected_while_parsing"]) for r in results.values())]
    )
    drop_rows.append(
        [
            "  of which: no valid sentence cited",
            *(str(r["counters"].get("bad_sentence_number", 0)) for r in results.values()),
        ]
    )
    drops = markdown_table(["drop reason", *results], drop_rows)
    qids = sorted(
        {q for r in results.values() for q in r["covered"]}, key=lambda q: int(q) if q.isdigit() else 0
    )
    cov = markdown_table(
        ["variant", "questions covered"],
        [[r["variant"], " ".join(r["covered"]) or "—"] for r in results.values()],
    )
    parts = [
        table,
        "",
        f"Goal (issue 22): at least {GOAL_KIS_PER_DOC:g} KIs per fixture paragraph and answer coverage of at "
        f"least {GOAL_COVERAGE}/24"
        + (
            ""
            if n_questions == 24
            else f" (a screen of {n_questions}: {math.ceil(GOAL_COVERAGE * n_questions / 24)})"
        )
        + f". Ceiling: the answer is in a gold document's own text for {ceiling}/{n_questions} questions.",
        "",
        "Drops by reason (guardrails), and records rejected while parsing:",
        "",
        drops,
        "",
        f"Questions covered (a KI of a gold document states the answer; {len(qids)} by some variant):",
        "",
        cov,
    ]
    if determinism is not None:
        parts += [
            "",
            f"Determinism: the first {determinism['docs']} documents of `default`, one at a time, gave "
            f"the same KIs as the concurrent run (concurrency {determinism['concurrency']}) for "
            f"{determinism['identical']}/{determinism['docs']} documents"
            + (f" (different: {', '.join(determinism['different'])})." if determinism["different"] else "."),
        ]
    return "\n".join(parts) + "\n"


def main(
    argv: Sequence[str] | None = None, *, make_lm: Callable[[Any, Any], Any] | None = None
) -> dict[str, dict[str, Any]]:
    """Parse arguments, run the variants (resuming), write the result files; returns the per-variant figures.

    ``make_lm(cfg, ledger)`` replaces the real LM (tests pass a scripted one).
    """
    from kitune.config import load_config
    from kitune.data.loaders import load_corpus

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated variants, in run order")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="base kitune config")
    p.add_argument("--data", type=Path, default=FIXTURE, help="fixture folder (BrowseComp-Plus layout)")
    p.add_argument(
        "--docs", choices=("golds", "evidence"), default="golds", help="which documents to extract"
    )
    p.add_argument(
        "--work", type=Path, default=ROOT / "kitune-work" / "extraction_variants", help="cache folder"
    )
    p.add_argument(
        "--questions",
        type=int,
        default=None,
        help="only the first N questions and their documents (a screen)",
    )
    p.add_argument(
        "--determinism", type=int, default=0, help="also extract the first N documents one at a time"
    )
    p.add_argument("--name", default="extraction_variants", help="result file stem")
    p.add_argument("--out-dir", type=Path, default=None, help="result folder (default benchmarks/results)")
    p.add_argument("--no-progress", action="store_true", help="no extraction progress lines")
    p.add_argument(
        "--timeout-s",
        type=float,
        default=900.0,
        help="lm.extract.timeout_s for the run (the default 120 s cancels requests that wait behind the "
        "other slots on a loaded 2-core machine; a retry then re-reads the prompt)",
    )
    args = p.parse_args(argv)
    unknown = [v for v in args.variants.split(",") if v and v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}: use {', '.join(VARIANTS)}")
    machine = machine_info()
    # extraction.grammar_limits off in every variant: the variants choose the grammar themselves
    # (response_format), and "default" is the no-limits baseline the others are compared with
    base = load_config(
        args.config,
        overrides={
            "lm.cache": False,
            "lm.extract.timeout_s": args.timeout_s,
            "extraction.grammar_limits": False,
        },
    )
    docs, questions, golds = measured_documents(args.data, args.docs)
    corpus = {d.docid: d for d in load_corpus(args.data)}
    measured = {d for q in questions for d in (*q.evidence_docids, *q.gold_docids)}  # all questions'
    if args.questions is not None:  # a screen: the first N questions and their documents (a prefix)
        questions = questions[: args.questions]
        keep = (
            {d for q in questions for d in golds[q.query_id]}
            if args.docs == "golds"
            else {d for q in questions for d in (*q.evidence_docids, *q.gold_docids)}
        )
        docs = [d for d in docs if d.docid in keep]
    ceiling = answer_ceiling(questions, golds, corpus)
    if make_lm is None:
        from kitune.lm import build_lm

        def make_lm(cfg: Any, ledger: Any) -> Any:
            return build_lm(cfg, "extract", ledger=ledger)

    def log(msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)

    log(f"{len(docs)} documents, {len(questions)} questions, answer in a gold text for {len(ceiling)}")
    results: dict[str, dict[str, Any]] = {}
    infos: dict[str, Any] = {}
    records: dict[str, dict[str, dict[str, Any]]] = {}
    for name in [v for v in args.variants.split(",") if v]:
        variant = VARIANTS[name]
        recs, segments, info = run_variant(
            variant,
            docs,
            base_cfg=base,
            make_lm=make_lm,
            work=args.work,
            corpus=corpus,
            measured=measured,
            progress=not args.no_progress,
            log=log,
        )
        records[name] = recs
        infos[name] = info
        results[name] = summarize_variant(variant, recs, segments, questions, golds, docs)
        r = results[name]
        if variant.replays is not None:  # the same calls as the variant it replays: its cost figures
            replayed = results.get(variant.replays)
            cost = ("lm_calls", "lm_calls_per_doc", "output_tokens", "output_tokens_per_doc")
            cost += ("input_tokens_per_doc", "failed_calls", "wall_s", "wall_s_per_doc", "docs_timed")
            if replayed is not None:
                r.update({k: replayed[k] for k in cost})
            r["replayed_from"] = variant.replays
        log(
            f"[{name}] {r['kis_per_doc']:.2f} KIs/doc, coverage {r['coverage']}/{len(questions)}, "
            f"{r['output_tokens_per_doc']:.0f} output tokens/doc, {r['wall_s']:.0f} s"
        )
    determinism = None
    if args.determinism > 0:
        seq = Variant(
            "default-sequential",
            "default, one document at a time",
            {"extraction.concurrency": 1},
            limit=args.determinism,
        )
        recs, _segments, _info = run_variant(
            seq,
            docs,
            base_cfg=base,
            make_lm=make_lm,
            work=args.work,
            corpus=corpus,
            measured=measured,
            progress=not args.no_progress,
            log=log,
        )
        concurrent = (
            records.get("default")
            or run_variant(
                VARIANTS["default"],
                docs,
                base_cfg=base,
                make_lm=make_lm,
                work=args.work,
                corpus=corpus,
                measured=measured,
                progress=not args.no_progress,
                log=log,
            )[0]
        )
        ids = [d.docid for d in docs[: args.determinism]]
        different = [i for i in ids if not same_kis(recs[i], concurrent[i])]
        determinism = {
            "docs": len(ids),
            "identical": len(ids) - len(different),
            "different": different,
            "concurrency": base.concurrency_for("extraction"),
        }
    model = base.lm.model_label("extract")
    demo_ids = [d["docid"] for d in json.loads(DEMOS.read_text(encoding="utf-8"))["demos"]]
    write_results(
        args.name,
        machine=machine,
        params={
            "data": str(args.data),
            "docs": args.docs,
            "documents": [d.docid for d in docs],
            "questions": len(questions),
            "questions_screened": args.questions,
            "config": str(args.config),
            "extract_timeout_s": args.timeout_s,
            "model": model,
            "server": base.lm.local.server,
            "parallel": base.lm.local.parallel,
            "extraction_concurrency": base.concurrency_for("extraction"),
            "variants": {n: asdict(VARIANTS[n]) for n in results},
            "answer_ceiling": ceiling,
        },
        results={"variants": results, "lm": infos, "determinism": determinism},
        summary_md=summary_md(results, len(questions), len(ceiling), determinism),
        notes=[
            "Every KI kept passed the guardrails: its evidence is a verbatim span of its document (sentence "
            "mode copies the cited sentences).",
            "Coverage reads KI titles and descriptions (what get_context shows the agent), not the evidence.",
            "Output tokens, LM calls and seconds per document are over the documents a finished run timed "
            "(a run stopped early leaves extracted documents but no timing). "
            "Output tokens and LM calls come from the token ledger (server-reported usage; estimated when "
            "missing); wall time is the extraction run's at the concurrency above, on a shared 2-core box.",
            f"Few-shot demonstrations: documents {', '.join(demo_ids)} (evidence for no fixture question).",
        ],
        out_dir=args.out_dir,
    )
    return results


if __name__ == "__main__":
    main()
