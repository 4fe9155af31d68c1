"""KIs out of kitune: ``kitune export --format elastic-ai-index``, ``kitune index create --mapping ai-index``.

:func:`export_ai_index` writes every KI of a store (the chosen statuses) as one document of
Elastic's published ``ai-index@mappings`` shape per line
(:func:`kitune.retrieval.ai_index.ki_to_ai_document`), or as an Elasticsearch ``_bulk`` body
(an ``index`` action with ``_id`` = the KI id before each document). A KI that breaks an
AI-index limit is not written: it is counted and listed with the reason (never fatal). The file
is written to a temporary name and renamed, so a half-written export never appears.

:func:`create_index` creates the configured Elasticsearch index with a mapping (``kitune`` or
``ai-index``) through the store's own start-up path (version and inference-endpoint checks).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kitune.config import ElasticsearchStoreConfig, KituneConfig
from kitune.errors import ConfigError, DataError
from kitune.retrieval.ai_index import ki_to_ai_document
from kitune.retrieval.elasticsearch import ElasticsearchStore
from kitune.schema import Filter

if TYPE_CHECKING:
    from kitune.retrieval.base import Store

__all__ = ["ExportReport", "create_index", "export_ai_index"]


@dataclass
class ExportReport:
    """What one export wrote."""

    path: Path
    written: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    """``(ki id, reason)`` of KIs that break an AI-index limit (not written)."""

    @property
    def ok(self) -> bool:
        """True when every KI was written."""
        return not self.failed


def export_ai_index(
    store: Store,
    out: Path | str,
    *,
    statuses: Sequence[str] = ("active", "stale", "expired"),
    bulk_index: str | None = None,
) -> ExportReport:
    """Write the store's KIs as AI-index documents (see the module docstring).

    Args:
        store: any KI store.
        out: the output file (JSONL, or NDJSON ``_bulk`` body with ``bulk_index``).
        statuses: which lifecycle statuses to export (default: all; the status is in each document).
        bulk_index: write a ``_bulk`` body for this index instead of plain documents.

    Returns:
        The counts; ``written + len(failed)`` is the number of KIs read.

    Raises:
        ValueError: an unknown status.
    """
    path = Path(out)
    flt = Filter(statuses=tuple(statuses))
    report = ExportReport(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for ki in store.iter_kis(flt):
            try:
                doc = ki_to_ai_document(ki)
            except DataError as e:
                report.failed.append((ki.id, str(e)))
                continue
            if bulk_index is not None:
                fh.write(json.dumps({"index": {"_index": bulk_index, "_id": ki.id}}) + "\n")
            fh.write(json.dumps(doc, ensure_ascii=False) + "\n")
            report.written += 1
    os.replace(tmp, path)
    return report


def create_index(
    cfg: KituneConfig, *, mapping: Literal["kitune", "ai-index"], index: str | None = None
) -> dict[str, Any]:
    """Create the configured Elasticsearch index with ``mapping`` (an existing one is checked, not changed).

    Args:
        cfg: needs ``store.type: elasticsearch`` (URL from ``store.url_env``).
        mapping: ``kitune`` or ``ai-index``.
        index: the index name (default ``store.index``).

    Returns:
        ``{"index", "mapping", "version"}`` (the cluster version; empty on Serverless).

    Raises:
        ConfigError: the store is not Elasticsearch, the cluster or endpoint is unusable, or the
            existing index has another layout. StoreUnavailableError: the cluster is unreachable.
    """
    if not isinstance(cfg.store, ElasticsearchStoreConfig):
        raise ConfigError(
            "kitune index create needs store.type: elasticsearch (and KITUNE_ES_URL); "
            "use `kitune export --format elastic-ai-index` to write AI-index documents without a cluster"
        )

    store_cfg = cfg.store.model_copy(update={"mapping": mapping, **({"index": index} if index else {})})
    store = ElasticsearchStore.from_config(store_cfg, retrieval=cfg.retrieval)  # creates it when missing
    try:
        return {"index": store.index, "mapping": mapping, "version": ".".join(map(str, store.version or ()))}
    finally:
        store.close()
