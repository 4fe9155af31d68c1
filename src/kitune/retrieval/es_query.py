"""What kitune sends to Elasticsearch, as pure functions (no client, no server).

* :func:`es_mapping` — the index mapping as published (DESIGN part 3): ``title`` and
  ``description`` as ``semantic_text`` on the configured inference endpoint, ``title_text``
  (``text``, written with the same title) so titles keep BM25, ``tags``/ids/``type``/
  ``references`` and the payload's ``subject``/``predicate``/``docid`` as ``keyword``, the
  payload's ``object``/``evidence`` as ``text``; the full KI kept in a disabled object.
* :func:`to_es_filter` — a :class:`~kitune.schema.Filter` as a Query DSL ``bool`` filter.
* :func:`compile_esql` — ONE ES|QL query for Elasticsearch 9.2+: ``FROM … METADATA _id, _index,
  _score``, a status filter, ``FORK`` with up to three branches (tags, ``MATCH`` on
  ``title_text``, ``MATCH`` on the semantic ``description``/``title``), each
  ``SORT _score DESC | LIMIT n``, then ``FUSE RRF`` with the configured constant and weights,
  ``SORT _score DESC`` and an explicit ``LIMIT`` (case S4).
* :func:`compile_branch_queries` — the same branches as separate queries for 8.18–9.1 (no
  FUSE there); the store fuses them client-side with :func:`kitune.retrieval.fusion.rrf_fuse`.
* :func:`compile_facets` — the ``STATS COUNT(*) BY …`` facet query.
* :func:`esql_mode` — which of the two paths a cluster version gets; :func:`parse_version` and
  :func:`not_elasticsearch` read the cluster's identity from ``GET /`` (OpenSearch is named as
  such, never taken for an old Elasticsearch).
* :class:`EsFields` — where each KI field lives in the index: :data:`KITUNE_FIELDS` for the
  mapping above, :data:`kitune.retrieval.ai_index.AI_INDEX_FIELDS` for Elastic's published
  AI-index shape; every query builder here takes one (default: kitune's).

Every user/LLM value travels as a named ES|QL parameter; only validated integers, the configured
index name (quoted when it collides with a ``FROM`` keyword, :func:`esql_source`) and config
numbers are written into the query text.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from kitune.config import RetrievalConfig
from kitune.errors import ConfigError, StoreError
from kitune.ki import KI
from kitune.retrieval.rules import effective_filter, filter_triples
from kitune.schema import Filter, QueryPlan

__all__ = [
    "FROM_KEYWORDS",
    "FUSE_VERSION",
    "KITUNE_FIELDS",
    "MIN_VERSION",
    "EsFields",
    "EsqlQuery",
    "check_index_name",
    "check_mapping_current",
    "compile_branch_queries",
    "compile_esql",
    "compile_facets",
    "es_mapping",
    "esql_mode",
    "esql_source",
    "ki_to_source",
    "not_elasticsearch",
    "parse_version",
    "parse_warnings",
    "source_to_ki",
    "stats_fingerprint",
    "sweep_queries",
    "to_es_filter",
]

BACKEND = "elasticsearch"
MIN_VERSION = (8, 18, 0)
"""Oldest supported cluster: ES|QL ``MATCH`` on ``semantic_text`` and ``METADATA _score``."""
FUSE_VERSION = (9, 2, 0)
"""First version with ``FUSE`` (one FORK/FUSE query); older supported clusters fuse client-side."""
_INDEX_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,254}$")
FROM_KEYWORDS = frozenset({"metadata"})
"""Words the ES|QL lexer reads as keywords right after ``FROM`` (its ``FROM_MODE``, Elastic's
``lexer/From.g4``: ``METADATA``); an index with such a name is written quoted."""
_FACET_FIELDS = {"tags": "tags", "doc": "evidence_doc_ids", "status": "status", "subtype": "subtype"}
_ALL_STATUSES = ("active", "stale", "expired")


@dataclass(frozen=True)
class EsFields:
    """Where each KI field lives in an index layout (field paths as queries name them)."""

    name: str = "kitune"
    """The layout: ``kitune`` or ``ai-index``."""
    status: str = "status"
    tags: str = "tags"
    doc_ids: str = "evidence_doc_ids"
    subtype: str = "subtype"
    subject: str = "subject"
    predicate: str = "predicate"
    confidence: str = "confidence"
    confidence_numeric: bool = True
    """False when confidence is indexed as a keyword (a flattened field): the floor becomes a terms query."""
    last_seen: str = "last_seen"
    expires_at: str = "expires_at"
    id: str = "id"
    lexical: str = "title_text"
    """The ``text`` field of the lexical (BM25) branch."""
    semantic: tuple[str, ...] = ("description", "title")
    """The semantic fields of the semantic branch, matched with ``OR``."""
    esql_facets: frozenset[str] = frozenset({"tags", "doc", "status", "subtype"})
    """Facets ES|QL can count in this layout (ES|QL cannot read ``flattened`` fields)."""

    def facet_field(self, by: str) -> str:
        """The field a facet name counts by."""
        return {"tags": self.tags, "doc": self.doc_ids, "status": self.status, "subtype": self.subtype}[by]


KITUNE_FIELDS = EsFields()
"""kitune's own mapping (:func:`es_mapping`)."""


@dataclass(frozen=True)
class EsqlQuery:
    """An ES|QL request: the query text, its named parameters and an optional DSL pre-filter."""

    query: str
    params: list[dict[str, Any]] = field(default_factory=list)
    """Named parameters, ``[{"name": value}, …]``, in order of first use."""
    filter: dict[str, Any] | None = None
    """Query DSL applied before the ES|QL query runs (non-scoring)."""
    branches: tuple[str, ...] = ()
    """Branch names in FORK order (``fork1`` is the first), or the one branch a per-branch query runs."""

    def to_json(self) -> dict[str, Any]:
        """The request body as a JSON-able dict."""
        body: dict[str, Any] = {"query": self.query, "params": self.params}
        if self.filter is not None:
            body["filter"] = self.filter
        return body


def not_elasticsearch(info: Any) -> str | None:
    """Why a ``GET /`` body is not an Elasticsearch cluster kitune can use, or None when it is one.

    OpenSearch (``version.distribution == "opensearch"`` or an OpenSearch tagline) is named with
    its version and what to do: it has no ES|QL and no ``semantic_text``, which the Elasticsearch
    store needs.
    """
    if not isinstance(info, Mapping):
        return None
    version = info.get("version")
    version = version if isinstance(version, Mapping) else {}
    distribution = str(version.get("distribution", "")).lower()
    if distribution == "opensearch" or "opensearch" in str(info.get("tagline", "")).lower():
        number = str(version.get("number", "")) or "(version not reported)"
        return (
            f"the cluster is OpenSearch {number}, not Elasticsearch: kitune's Elasticsearch store needs "
            f"Elasticsearch {'.'.join(map(str, MIN_VERSION))}+ (ES|QL MATCH on semantic_text, FORK/FUSE), "
            "which OpenSearch does not have. Point the store URL (store.url_env, KITUNE_ES_URL) at an "
            "Elasticsearch cluster, or use the embedded store (store.type: lancedb)"
        )
    return None


def parse_version(info: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """The cluster version from a ``GET /`` body, or None for Elastic Cloud Serverless (always current).

    Raises:
        ConfigError: the body is another product's (OpenSearch: see :func:`not_elasticsearch`).
        StoreError: the body has no parseable ``version.number``.
    """
    problem = not_elasticsearch(info)
    if problem is not None:
        raise ConfigError(problem)
    version = info.get("version") if isinstance(info, Mapping) else None
    if isinstance(version, Mapping) and version.get("build_flavor") == "serverless":
        return None
    number = str(version.get("number", "")) if isinstance(version, Mapping) else ""
    m = re.match(r"^(\d+)\.(\d+)\.(\d+)", number)
    if not m:
        raise StoreError(
            f"cannot read the Elasticsearch version from GET / (version={version!r})", backend=BACKEND
        )
    return int(m[1]), int(m[2]), int(m[3])


def esql_mode(version: tuple[int, int, int] | None) -> Literal["fuse", "per_branch"]:
    """``"fuse"`` for 9.2+ and Serverless, ``"per_branch"`` for 8.18–9.1.

    Raises:
        ConfigError: the cluster is older than :data:`MIN_VERSION`.
    """
    if version is None or version >= FUSE_VERSION:
        return "fuse"
    if version >= MIN_VERSION:
        return "per_branch"
    have = ".".join(map(str, version))
    raise ConfigError(
        f"Elasticsearch {have} is too old for kitune: the minimum is 8.18.0 (ES|QL MATCH on semantic_text); "
        "9.2+ runs hybrid search as one FORK/FUSE query. Upgrade the cluster or point KITUNE_ES_URL "
        "at a newer one"
    )


def esql_source(index: str) -> str:
    """``index`` as an ES|QL ``FROM`` source, double-quoted when the lexer would read it as a keyword.

    ``metadata`` → ``"metadata"`` (``FROM metadata METADATA …`` does not parse); other names as is.

    Raises:
        ConfigError: ``index`` is not a valid index name (see :func:`check_index_name`).
    """
    check_index_name(index)
    return f'"{index}"' if index in FROM_KEYWORDS else index


def check_index_name(index: str) -> str:
    """Return ``index`` if it is a valid lowercase index name.

    Raises:
        ConfigError: the name has characters outside ``a-z0-9._-`` or starts badly.
    """
    if not _INDEX_RE.match(index):
        raise ConfigError(f"store.index {index!r} is not a valid index name: use lowercase a-z0-9 . _ -")
    return index


def es_mapping(inference_id: str) -> dict[str, Any]:
    """The KI index mapping as published (see the module docstring)."""
    semantic = {"type": "semantic_text", "inference_id": inference_id}
    return {
        "dynamic": "strict",
        "properties": {
            "type": {"type": "keyword"},
            "id": {"type": "keyword"},
            "title": dict(semantic),
            "title_text": {"type": "text"},
            "description": dict(semantic),
            "references": {"type": "keyword"},
            "tags": {"type": "keyword"},
            "evidence_doc_ids": {"type": "keyword"},
            "subject": {"type": "keyword"},
            "predicate": {"type": "keyword"},
            "object": {"type": "text"},
            "docid": {"type": "keyword"},
            "evidence": {"type": "text"},
            "status": {"type": "keyword"},
            "subtype": {"type": "keyword"},
            "confidence": {"type": "integer"},
            "last_seen": {"type": "date"},
            "expires_at": {"type": "date"},
            "prompt_version": {"type": "keyword"},
            "ki": {"type": "object", "enabled": False},
        },
    }


def check_mapping_current(mappings: Mapping[str, Any], fields: EsFields = KITUNE_FIELDS) -> None:
    """Refuse indices whose mapping the store's layout cannot query (a ``GET <index>/_mapping`` body).

    Raises:
        ConfigError: a kitune index lacks ``title_text`` (an earlier kitune mapping: names the
            reindex command), or an AI index lacks ``title.semantic`` / ``governance.lifecycle.status``.
    """
    for name, data in mappings.items():
        props = data.get("mappings", {}).get("properties", {})
        if fields.name == "ai-index":
            has_semantic = "semantic" in props.get("title", {}).get("fields", {})
            has_status = "lifecycle" in props.get("governance", {}).get("properties", {})
            if not (has_semantic and has_status):
                raise ConfigError(
                    f"index {name} is not an AI index kitune can serve (needs title.semantic and "
                    "governance.lifecycle.status): create one with `kitune index create --mapping ai-index` "
                    "or set store.mapping: kitune"
                )
            continue
        if "title_text" not in props:
            raise ConfigError(
                f"index {name} has an earlier kitune mapping (no title_text field): set store.index to a "
                f"new name and run `kitune reindex --from {name}`"
            )


def ki_to_source(ki: KI) -> dict[str, Any]:
    """The document body for one KI (flat fields for search plus the full KI under ``ki``)."""
    data = ki.model_dump(mode="json")
    props = ki.payload.properties
    return {
        "type": ki.type,
        "id": ki.id,
        "title": ki.title,
        "title_text": ki.title,
        "description": ki.description,
        "references": list(ki.references),
        "tags": list(ki.tags),
        "evidence_doc_ids": list(ki.evidence_doc_ids),
        "subject": props.subject,
        "predicate": props.predicate,
        "object": props.object,
        "docid": props.docid,
        "evidence": list(ki.payload.evidence),
        "status": ki.payload.status,
        "subtype": ki.payload.subtype,
        "confidence": ki.payload.confidence,
        "last_seen": data["payload"]["last_seen"],
        "expires_at": data["payload"]["expires_at"],
        "prompt_version": ki.prompt_version,
        "ki": data,
    }


def source_to_ki(source: Mapping[str, Any]) -> KI:
    """Rebuild the KI from a stored document (either mapping: only ``ki`` is required).

    ``status`` and ``last_seen`` come from their own fields (update-by-query changes those only).
    """
    ki = KI.model_validate(source["ki"])
    ki.payload.status = source.get("status", ki.payload.status)
    seen = source.get("last_seen")
    if isinstance(seen, str):
        parsed = datetime.fromisoformat(seen.replace("Z", "+00:00"))
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        if parsed != ki.payload.last_seen:
            ki.payload.last_seen = parsed
    return ki


def to_es_filter(
    f: Filter | None, *, include_status: bool = True, fields: EsFields = KITUNE_FIELDS
) -> dict[str, Any] | None:
    """Translate a filter into a Query DSL ``bool`` filter (pure; values go in as terms).

    Args:
        f: the filter, or None for no filtering.
        include_status: also filter on ``statuses`` (the search puts statuses in the ES|QL text).
        fields: the index layout.

    Returns:
        ``{"bool": {"filter": [...]}}`` or None when nothing is filtered.
    """
    if f is None:
        return None
    x = fields
    clauses: list[dict[str, Any]] = []
    if include_status and f.statuses and set(f.statuses) != set(_ALL_STATUSES):
        clauses.append({"terms": {x.status: list(f.statuses)}})
    clauses.extend({"term": {x.tags: t}} for t in f.tags_all)
    if f.tags_any:
        clauses.append({"terms": {x.tags: list(f.tags_any)}})
    if f.doc_ids:
        clauses.append({"terms": {x.doc_ids: list(f.doc_ids)}})
    if f.subtypes:
        clauses.append({"terms": {x.subtype: list(f.subtypes)}})
    subjects, predicates = filter_triples(f)
    if subjects:
        clauses.append({"terms": {x.subject: list(subjects)}})
    if predicates:
        clauses.append({"terms": {x.predicate: list(predicates)}})
    if f.min_confidence > 0:
        if x.confidence_numeric:
            clauses.append({"range": {x.confidence: {"gte": f.min_confidence}}})
        else:  # a flattened field compares keywords: list the allowed values instead
            clauses.append({"terms": {x.confidence: [str(v) for v in range(f.min_confidence, 101)]}})
    return {"bool": {"filter": clauses}} if clauses else None


def _params(prefix: str, values: Sequence[Any], params: list[dict[str, Any]]) -> list[str]:
    names = []
    for i, v in enumerate(values):
        name = f"{prefix}{i}"
        params.append({name: v})
        names.append(f"?{name}")
    return names


def _prelude(
    plan: QueryPlan, index: str, retrieval: RetrievalConfig, fields: EsFields = KITUNE_FIELDS
) -> tuple[Filter, list[str], list[dict[str, Any]]]:
    check_index_name(index)
    if plan.is_empty():
        raise StoreError(
            "the query plan has no entity tags, lexical or semantic text: nothing to search", backend=BACKEND
        )
    flt = effective_filter(plan, retrieval)
    params: list[dict[str, Any]] = []
    statuses = list(flt.statuses) or list(_ALL_STATUSES)
    lines = [
        f"FROM {esql_source(index)} METADATA _id, _index, _score",
        f"| WHERE {fields.status} IN ({', '.join(_params('status', statuses, params))})",
    ]
    return flt, lines, params


def _branches(
    plan: QueryPlan, params: list[dict[str, Any]], fields: EsFields = KITUNE_FIELDS
) -> list[tuple[str, str]]:
    """``(name, condition)`` per branch with input; tags match as ``entity:<slug>`` or the bare slug."""
    branches: list[tuple[str, str]] = []
    if plan.entity_tags:
        forms: list[str] = []
        for tag in plan.entity_tags:
            forms += [tag, tag.split(":", 1)[1]]
        names = _params("tag", list(dict.fromkeys(forms)), params)
        branches.append(("tag", " OR ".join(f"MATCH({fields.tags}, {p})" for p in names)))
    if plan.lexical.strip():
        params.append({"lexical": plan.lexical})
        branches.append(("lexical", f"MATCH({fields.lexical}, ?lexical)"))
    if plan.semantic.strip():
        params.append({"semantic": plan.semantic})
        branches.append(("semantic", " OR ".join(f"MATCH({f}, ?semantic)" for f in fields.semantic)))
    return branches


def compile_esql(
    plan: QueryPlan, index: str, retrieval: RetrievalConfig, fields: EsFields = KITUNE_FIELDS
) -> EsqlQuery:
    """Compile a plan into one ES|QL hybrid query for 9.2+ (see the module docstring).

    A plan with one branch input skips FORK/FUSE (FORK needs two branches). Filters other than
    status go in the DSL ``filter``; the serving statuses and confidence floor apply.

    Raises:
        StoreError: the plan has no branch input.
    """
    flt, lines, params = _prelude(plan, index, retrieval, fields)
    n = int(retrieval.branch_size)
    branches = _branches(plan, params, fields)
    weights = {
        "tag": retrieval.tag_weight,
        "lexical": retrieval.lexical_weight,
        "semantic": retrieval.semantic_weight,
    }
    if len(branches) == 1:
        lines.append(f"| WHERE {branches[0][1]}")
    else:
        forks = [f"(WHERE {cond} | SORT _score DESC | LIMIT {n})" for _, cond in branches]
        lines.append("| FORK " + "\n       ".join(forks))
        options = {
            "rank_constant": int(retrieval.rrf_k),
            "weights": {f"fork{i + 1}": float(weights[name]) for i, (name, _) in enumerate(branches)},
        }
        lines.append(f"| FUSE RRF WITH {json.dumps(options)}")
    lines += ["| SORT _score DESC", "| KEEP _id, _score", f"| LIMIT {int(plan.size)}"]
    return EsqlQuery(
        query="\n".join(lines),
        params=params,
        filter=to_es_filter(flt, include_status=False, fields=fields),
        branches=tuple(name for name, _ in branches),
    )


def compile_branch_queries(
    plan: QueryPlan, index: str, retrieval: RetrievalConfig, fields: EsFields = KITUNE_FIELDS
) -> list[EsqlQuery]:
    """One ES|QL query per branch for 8.18–9.1 (no FUSE): each ``SORT _score DESC | LIMIT n``.

    The caller ranks each branch's rows by ``(-_score, _id)`` and fuses them with
    :func:`kitune.retrieval.fusion.rrf_fuse` (same constant and weights as FUSE).

    Raises:
        StoreError: the plan has no branch input.
    """
    out = []
    for name in ("tag", "lexical", "semantic"):
        single = _only(plan, name)
        if single is None:
            continue
        flt, lines, params = _prelude(single, index, retrieval, fields)
        ((_, cond),) = _branches(single, params, fields)
        lines += [
            f"| WHERE {cond}",
            "| SORT _score DESC",
            "| KEEP _id, _score",
            f"| LIMIT {int(retrieval.branch_size)}",
        ]
        out.append(
            EsqlQuery(
                query="\n".join(lines),
                params=params,
                filter=to_es_filter(flt, include_status=False, fields=fields),
                branches=(name,),
            )
        )
    if not out:
        _prelude(plan, index, retrieval, fields)  # raises the "nothing to search" error
    return out


def _only(plan: QueryPlan, branch: str) -> QueryPlan | None:
    keep = {
        "tag": {"entity_tags": plan.entity_tags, "lexical": "", "semantic": ""},
        "lexical": {"entity_tags": (), "lexical": plan.lexical, "semantic": ""},
        "semantic": {"entity_tags": (), "lexical": "", "semantic": plan.semantic},
    }[branch]
    has_input = (
        bool(keep["entity_tags"]) or bool(str(keep["lexical"]).strip()) or bool(str(keep["semantic"]).strip())
    )
    return plan.model_copy(update=keep) if has_input else None


def compile_facets(
    index: str, filters: Filter | None, by: str = "tags", limit: int = 100, fields: EsFields = KITUNE_FIELDS
) -> EsqlQuery:
    """The facet query: ``STATS n = COUNT(*) BY <field>`` over KIs passing ``filters``.

    Args:
        index: the KI index.
        filters: conditions on the counted KIs (None: all).
        by: ``tags``, ``doc``, ``status`` or ``subtype``.
        limit: most groups returned (explicit LIMIT, case S4), 1–10000.
        fields: the index layout.

    Raises:
        StoreError: unknown ``by``, one the layout cannot count with ES|QL, or ``limit`` out of range.
    """
    check_index_name(index)
    if by not in _FACET_FIELDS:
        raise StoreError(f"unknown facet {by!r}: use one of {', '.join(_FACET_FIELDS)}", backend=BACKEND)
    if not 1 <= limit <= 10_000:
        raise StoreError(f"facet limit {limit} out of range: use 1..10000", backend=BACKEND)
    if by not in fields.esql_facets:
        raise StoreError(
            f"facet {by!r} cannot be counted with ES|QL in the {fields.name} layout (ES|QL does not read "
            f"flattened attributes): use one of {', '.join(sorted(fields.esql_facets))}",
            backend=BACKEND,
        )
    col = fields.facet_field(by)
    source = esql_source(index)
    query = f"FROM {source}\n| STATS n = COUNT(*) BY {col}\n| SORT n DESC, {col} ASC\n| LIMIT {int(limit)}"
    return EsqlQuery(query=query, params=[], filter=to_es_filter(filters, fields=fields))


def sweep_queries(
    now: datetime,
    stale_after: timedelta,
    retention: Mapping[str, timedelta] | None = None,
    fields: EsFields = KITUNE_FIELDS,
) -> list[tuple[dict[str, Any], str]]:
    """The update-by-query bodies of a sweep: ``(query, new status)``, expiries first.

    One pair per distinct window: each subtype in ``retention`` gets its own, every other
    subtype uses ``stale_after``.
    """
    overrides = dict(sorted((retention or {}).items()))
    x = fields
    groups: list[tuple[dict[str, Any] | None, bool, timedelta]] = [
        ({"term": {x.subtype: k}}, False, v) for k, v in overrides.items()
    ]
    groups.append(({"terms": {x.subtype: list(overrides)}} if overrides else None, True, stale_after))
    out: list[tuple[dict[str, Any], str]] = []
    iso = now.isoformat()
    for clause, negate, window in groups:
        scope: dict[str, list[dict[str, Any]]] = {"filter": [], "must_not": []}
        if clause is not None:
            scope["must_not" if negate else "filter"].append(clause)
        expired_q = {
            "bool": {
                "filter": list(scope["filter"]),
                "must_not": [*scope["must_not"], {"term": {x.status: "expired"}}],
                "should": [
                    {"range": {x.last_seen: {"lt": (now - 2 * window).isoformat()}}},
                    {"range": {x.expires_at: {"lte": iso}}},
                ],
                "minimum_should_match": 1,
            }
        }
        stale_q = {
            "bool": {
                "filter": [
                    *scope["filter"],
                    {"term": {x.status: "active"}},
                    {"range": {x.last_seen: {"lt": (now - window).isoformat()}}},
                ],
                "must_not": list(scope["must_not"]),
            }
        }
        out += [(expired_q, "expired"), (stale_q, "stale")]
    return sorted(out, key=lambda qs: qs[1] != "expired")


def parse_warnings(headers: Mapping[str, str] | None) -> tuple[bool, tuple[str, ...]]:
    """Read ES|QL ``Warning`` headers.

    Returns:
        ``(truncated, warnings)``: truncated is True when a warning mentions a (default) LIMIT or
        a result cap.
    """
    if not headers:
        return False, ()
    raw = [v for k, v in headers.items() if k.lower() == "warning"]
    warnings: list[str] = []
    for value in raw:
        warnings.extend(p.strip() for p in re.split(r",\s*(?=\d{3}\s)", value) if p.strip())
    truncated = any(re.search(r"limit|truncat|result window", w, re.IGNORECASE) for w in warnings)
    return truncated, tuple(warnings)


def facet_column(by: str, fields: EsFields = KITUNE_FIELDS) -> str:
    """The indexed field a facet name counts by (``doc`` → ``evidence_doc_ids``)."""
    return fields.facet_field(by) if by in _FACET_FIELDS else _FACET_FIELDS[by]


def stats_fingerprint(stats: Mapping[str, Any], index: str) -> str:
    """Fingerprint of an ``indices.stats(level="shards")`` body: each primary's ``max_seq_no``.

    Every index, update and delete operation raises its shard's ``max_seq_no``, which never goes
    back (restarts included); the index uuid changes when the index is re-created.
    """
    parts = []
    for name, data in sorted(stats.get("indices", {}).items()):
        shards = []
        for shard, copies in sorted(data.get("shards", {}).items()):
            for copy in copies:
                if copy.get("routing", {}).get("primary", True):
                    shards.append((shard, copy.get("seq_no", {}).get("max_seq_no")))
        parts.append((name, data.get("uuid", ""), shards))
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]
    return f"elasticsearch:{index}:{digest}"
