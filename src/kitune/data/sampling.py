"""A small, diverse, seeded sample of a corpus, for the domain bootstrap.

Two corpus shapes are read by :func:`load_bootstrap_corpus`:

* **prose** — documents with a text field (the BrowseComp-Plus ``corpus.jsonl`` layout, read
  by :func:`kitune.data.loaders.load_corpus_with_report`);
* **records** — JSON objects with arbitrary fields and no text field (tickets, payments, log
  lines). Each record becomes a :class:`~kitune.schema.Document` whose text is one
  ``field: value`` line per field and whose ``metadata`` holds the field values; the field
  names, how often each occurs and a few example values are kept (:class:`FieldSummary`).

:func:`sample_documents` picks the sample:

1. **question-retrieved** — for up to ``sample_size // 2`` example questions (in a seeded
   order), the best corpus-store hit not yet chosen;
2. **cluster** — the rest of the slots: documents of a seeded pool (at most ``pool_size``) are
   embedded, clustered with seeded k-means (k = free slots), and from each cluster, largest
   first, the member nearest its centroid is taken.

Determinism: the same documents, questions, embedder, seed and sizes give the same sample in
the same order (NumPy's ``default_rng(seed)`` and ``random.Random(seed)`` only; no global RNG).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from kitune.data.dialogue import parse_session
from kitune.data.loaders import Question, SkippedLine, iter_lines, load_corpus_with_report
from kitune.errors import DataError
from kitune.retrieval.base import CorpusStore
from kitune.retrieval.embedders import Embedder
from kitune.schema import Document

__all__ = [
    "CorpusKind",
    "FieldSummary",
    "LoadedCorpus",
    "SampledDoc",
    "kmeans",
    "load_bootstrap_corpus",
    "record_to_document",
    "sample_documents",
]

CorpusKind = Literal["prose", "dialogue", "records"]

_ID_KEYS = ("docid", "doc_id", "id")
_TEXT_KEYS = ("text", "contents", "content")
_DETECT_LINES = 50
_MAX_VALUE_CHARS = 300
_EXAMPLES_PER_FIELD = 3


@dataclass(frozen=True)
class FieldSummary:
    """One field of a structured-record corpus."""

    name: str
    """The field name as written in the records."""
    count: int
    """Records that carry the field (non-null)."""
    examples: tuple[str, ...] = ()
    """Up to three distinct example values, first seen first, each at most 80 characters."""


@dataclass(frozen=True)
class LoadedCorpus:
    """A corpus read for the bootstrap."""

    documents: list[Document]
    """In file order; doc ids unique."""
    kind: CorpusKind
    """``prose`` (documents with a text field), ``dialogue`` (prose whose documents are mostly chat
    sessions, ``[D1:3] Speaker: …`` turn lines; :func:`kitune.data.dialogue.parse_session`) or
    ``records`` (structured JSON objects)."""
    fields: tuple[FieldSummary, ...] = ()
    """Records only: every field seen, most frequent first (ties by first appearance)."""
    path: str = ""
    """The file read."""
    skipped: tuple[SkippedLine, ...] = ()
    """Lines that were not JSON objects (or lacked an id/text for prose)."""


@dataclass(frozen=True)
class SampledDoc:
    """One document of the sample and why it was chosen."""

    docid: str
    reason: Literal["question", "cluster", "fill"]
    """``question``: an example question retrieved it; ``cluster``: nearest its k-means
    centroid; ``fill``: a seeded random pick when there were fewer clusters than slots."""
    cluster: int | None = None
    """Cluster index (0 = largest) for ``cluster`` picks."""
    cluster_size: int = 0
    """Members of that cluster in the embedded pool."""
    query_id: str = ""
    """The question that retrieved it, for ``question`` picks."""
    query: str = ""
    """That question's text (first 200 characters)."""

    def why(self) -> str:
        """One short human-readable reason, e.g. ``"cluster 2 (31 docs)"``."""
        if self.reason == "question":
            return f"retrieved by question {self.query_id}: {self.query}"
        if self.reason == "cluster":
            return f"cluster {self.cluster} ({self.cluster_size} docs)"
        return "seeded fill (fewer clusters than slots)"


def _render_value(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool | int | float):
        text = json.dumps(value)
    else:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 1] + "…"


def record_to_document(record: dict[str, Any], fallback_id: str) -> Document:
    """Render one structured record as a document.

    Args:
        record: a JSON object (any fields; nested values are rendered as compact JSON).
        fallback_id: the doc id when the record has no ``docid``/``doc_id``/``id`` field.

    Returns:
        A :class:`Document` whose ``text`` holds one ``field: value`` line per non-null field,
        in record order (values cut to 300 characters), ``title`` the first short string field
        named like a title/name/subject (else empty), ``source="records"`` and ``metadata`` the
        same field → value strings.
    """
    docid = next((str(record[k]).strip() for k in _ID_KEYS if record.get(k) not in (None, "")), fallback_id)
    lines: list[str] = []
    metadata: dict[str, str] = {}
    for key, value in record.items():
        if value is None:
            continue
        rendered = _render_value(value)
        lines.append(f"{key}: {rendered}")
        metadata[str(key)] = rendered
    title = ""
    for key in ("title", "name", "subject", "summary"):
        if isinstance(record.get(key), str) and record[key].strip():
            title = record[key].strip()[:140]
            break
    return Document(docid=docid, text="\n".join(lines), title=title, source="records", metadata=metadata)


def _resolve(path: Path) -> Path:
    if path.is_dir():
        for name in ("corpus.jsonl", "documents.jsonl", "records.jsonl"):
            if (path / name).is_file():
                return path / name
        raise DataError(
            f"directory {path} has no corpus.jsonl, documents.jsonl or records.jsonl: point --corpus at "
            "a JSONL file or a BrowseComp-Plus directory",
            path=str(path),
        )
    if not path.is_file():
        raise DataError(f"corpus {path} does not exist: check the --corpus path", path=str(path))
    return path


def _detect_kind(path: Path) -> CorpusKind:
    """``prose`` when most of the first 50 object lines carry a string text field."""
    with_text = objects = 0
    with path.open(encoding="utf-8", errors="replace") as fh:
        for raw in fh:
            line = raw.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(record, dict):
                continue
            objects += 1
            with_text += any(isinstance(record.get(k), str) for k in _TEXT_KEYS)
            if objects >= _DETECT_LINES:
                break
    if objects == 0:
        raise DataError(
            f"{path} holds no JSON object lines: expected one document or record per line", path=str(path)
        )
    return "prose" if with_text * 2 > objects else "records"


def _load_records(path: Path) -> LoadedCorpus:
    docs: list[Document] = []
    skipped: list[SkippedLine] = []
    seen: dict[str, int] = {}
    counts: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    for lineno, line in iter_lines(path, skipped):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            skipped.append(SkippedLine(str(path), lineno, f"invalid JSON: {e.msg}"))
            continue
        if not isinstance(record, dict):
            skipped.append(SkippedLine(str(path), lineno, f"expected an object, got {type(record).__name__}"))
            continue
        doc = record_to_document(record, f"{path.stem}-{lineno}")
        if doc.docid in seen:
            raise DataError(
                f"{path}:{lineno}: duplicate id {doc.docid!r} (first on line {seen[doc.docid]}): "
                "record ids must be unique; remove or renumber one of them",
                path=str(path),
                line=lineno,
            )
        seen[doc.docid] = lineno
        docs.append(doc)
        for key, value in doc.metadata.items():
            counts[key] += 1
            ex = examples.setdefault(key, [])
            short = value[:80]
            if len(ex) < _EXAMPLES_PER_FIELD and short not in ex:
                ex.append(short)
    order = {name: i for i, name in enumerate(examples)}
    fields = tuple(
        FieldSummary(name=name, count=counts[name], examples=tuple(examples[name]))
        for name in sorted(counts, key=lambda n: (-counts[n], order[n]))
    )
    return LoadedCorpus(documents=docs, kind="records", fields=fields, path=str(path), skipped=tuple(skipped))


def load_bootstrap_corpus(path: Path | str) -> LoadedCorpus:
    """Read a prose corpus or a structured-record JSONL file (detected from its first 50 lines).

    A prose corpus most of whose documents are chat sessions is reported as ``dialogue``.

    Args:
        path: a JSONL file, or a directory holding ``corpus.jsonl``, ``documents.jsonl`` or
            ``records.jsonl``.

    Returns:
        A :class:`LoadedCorpus`; ``fields`` is empty for prose.

    Raises:
        DataError: the path is missing, holds no JSON objects, or two lines share an id.
    """
    file = _resolve(Path(path))
    if _detect_kind(file) == "prose":
        docs, report = load_corpus_with_report(file)
        sessions = sum(1 for d in docs if parse_session(d.text).turns)
        kind: CorpusKind = "dialogue" if docs and sessions * 2 > len(docs) else "prose"
        return LoadedCorpus(documents=docs, kind=kind, path=str(file), skipped=report.skipped)
    return _load_records(file)


def kmeans(vectors: np.ndarray, k: int, *, seed: int, iterations: int = 25) -> tuple[np.ndarray, np.ndarray]:
    """Seeded k-means++ / Lloyd clustering on unit vectors (squared Euclidean distance).

    Args:
        vectors: float array of shape ``(n, dim)``, n ≥ 1.
        k: clusters wanted, 1 ≤ k; capped at the number of distinct rows.
        seed: seeds ``numpy.random.default_rng`` (same seed ⇒ same clusters).
        iterations: Lloyd iterations at most (stops early when assignments settle).

    Returns:
        ``(labels, centroids)``: ``labels`` int array of shape ``(n,)`` in ``0..k'-1``,
        ``centroids`` of shape ``(k', dim)``, with ``k' = min(k, distinct rows)``.

    Raises:
        ValueError: empty ``vectors`` or ``k`` < 1.
    """
    x = np.asarray(vectors, dtype=np.float64)
    if x.ndim != 2 or len(x) == 0:
        raise ValueError(f"kmeans needs a non-empty (n, dim) array, got shape {x.shape}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    k = min(k, len(np.unique(x, axis=0)))
    rng = np.random.default_rng(seed)
    centroids = [x[int(rng.integers(len(x)))]]
    for _ in range(1, k):
        d2 = np.min(((x[:, None, :] - np.asarray(centroids)[None, :, :]) ** 2).sum(-1), axis=1)
        total = float(d2.sum())
        idx = int(rng.choice(len(x), p=d2 / total)) if total > 0 else int(rng.integers(len(x)))
        centroids.append(x[idx])
    c = np.asarray(centroids)
    labels = np.full(len(x), -1)
    for _ in range(iterations):
        dist = ((x[:, None, :] - c[None, :, :]) ** 2).sum(-1)
        new = dist.argmin(axis=1)
        if np.array_equal(new, labels):
            break
        labels = new
        for j in range(k):
            members = x[labels == j]
            if len(members):
                c[j] = members.mean(axis=0)
    return labels.astype(int), c


def _embed_text(doc: Document) -> str:
    return f"{doc.title}\n{doc.text[:1000]}" if doc.title else doc.text[:1000]


def _question_picks(
    questions: Sequence[Question], store: CorpusStore, slots: int, rng: random.Random, known: set[str]
) -> list[SampledDoc]:
    order = list(questions)
    rng.shuffle(order)
    picks: list[SampledDoc] = []
    chosen: set[str] = set()
    for q in order:
        if len(picks) >= slots:
            break
        for hit in store.search(q.query, k=5, snippets_per_hit=1, snippet_chars=100):
            if hit.docid in known and hit.docid not in chosen:
                chosen.add(hit.docid)
                picks.append(
                    SampledDoc(docid=hit.docid, reason="question", query_id=q.query_id, query=q.query[:200])
                )
                break
    return picks


def sample_documents(
    documents: Sequence[Document],
    embedder: Embedder,
    *,
    sample_size: int = 8,
    seed: int = 0,
    questions: Sequence[Question] = (),
    corpus_store: CorpusStore | None = None,
    pool_size: int = 2000,
) -> list[SampledDoc]:
    """Choose a small, diverse sample (see the module docstring for the two kinds of pick).

    Args:
        documents: the corpus (doc ids unique).
        embedder: embeds the pool for clustering (title + first 1,000 characters per document).
        sample_size: documents wanted (≥ 1); fewer come back only when the corpus is smaller.
        seed: seeds the question order, the pool and k-means.
        questions: example questions; their retrieved documents take up to half of the slots.
        corpus_store: where the questions are searched (holds ``documents``); None: no
            question picks.
        pool_size: at most this many documents (a seeded random subset) are embedded and
            clustered, which bounds the cost on large corpora (≥ 1).

    Returns:
        At most ``sample_size`` :class:`SampledDoc`, doc ids unique: question picks first (in
        the seeded question order), then cluster picks (largest cluster first), then fills.
        Same inputs and seed ⇒ same list.

    Raises:
        ValueError: ``sample_size`` or ``pool_size`` < 1.
    """
    if sample_size < 1 or pool_size < 1:
        raise ValueError(f"sample_size and pool_size must be >= 1, got {sample_size} and {pool_size}")
    if not documents:
        return []
    rng = random.Random(seed)
    known = {d.docid for d in documents}
    picks: list[SampledDoc] = []
    if questions and corpus_store is not None:
        picks = _question_picks(questions, corpus_store, min(len(questions), sample_size // 2), rng, known)
    chosen = {p.docid for p in picks}
    remaining = [d for d in documents if d.docid not in chosen]
    slots = min(sample_size - len(picks), len(remaining))
    if slots <= 0:
        return picks
    pool_docs = remaining if len(remaining) <= pool_size else rng.sample(remaining, pool_size)
    vectors = embedder.embed([_embed_text(d) for d in pool_docs])
    labels, centroids = kmeans(vectors, slots, seed=seed)
    sizes = Counter(int(label) for label in labels)
    ranked = sorted(sizes, key=lambda j: (-sizes[j], j))
    for rank, j in enumerate(ranked):
        members = [i for i in range(len(pool_docs)) if labels[i] == j]
        dist = ((vectors[members] - centroids[j]) ** 2).sum(-1)
        best = min(range(len(members)), key=lambda m: (float(dist[m]), pool_docs[members[m]].docid))
        doc = pool_docs[members[best]]
        picks.append(SampledDoc(docid=doc.docid, reason="cluster", cluster=rank, cluster_size=sizes[j]))
        chosen.add(doc.docid)
    left = [d for d in pool_docs if d.docid not in chosen]
    while len(picks) < sample_size and left:
        doc = left.pop(rng.randrange(len(left)))
        picks.append(SampledDoc(docid=doc.docid, reason="fill"))
    return picks
