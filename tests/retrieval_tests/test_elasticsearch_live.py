"""The store conformance suite on a live Elasticsearch 9.x cluster.

Runs only when ``KITUNE_ES_URL`` is set (read at import: the shared conftest clears KITUNE_*
variables per test). ``KITUNE_ES_INFERENCE_ID`` names the semantic_text endpoint (default
``.elser-2-elasticsearch``). Each test uses a fresh index, deleted afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from kitune.testing.store_contract import StoreContract

ES_URL = os.environ.get("KITUNE_ES_URL", "").strip()
ES_API_KEY = os.environ.get("KITUNE_ES_API_KEY", "").strip()
INFERENCE_ID = os.environ.get("KITUNE_ES_INFERENCE_ID", ".elser-2-elasticsearch")

pytestmark = pytest.mark.skipif(
    not ES_URL, reason="KITUNE_ES_URL is not set: live Elasticsearch conformance tests skipped"
)


class TestElasticsearchStore(StoreContract):
    reports_branch_ranks = False

    @pytest.fixture
    def store(self) -> Iterator[object]:
        from elasticsearch import Elasticsearch

        from kitune.retrieval.elasticsearch import ElasticsearchStore

        client = Elasticsearch(ES_URL, api_key=ES_API_KEY or None, request_timeout=120)
        index = f"kitune-test-{uuid.uuid4().hex[:10]}"
        s = ElasticsearchStore(client, index=index, inference_id=INFERENCE_ID)
        try:
            yield s
        finally:
            client.indices.delete(index=index, ignore_unavailable=True)
            s.close()


class TestElasticsearchAiIndexStore(StoreContract):
    """The same contract on an index with Elastic's published ai-index@mappings shape (issue 23)."""

    reports_branch_ranks = False

    @pytest.fixture
    def store(self) -> Iterator[object]:
        from elasticsearch import Elasticsearch

        from kitune.retrieval.elasticsearch import ElasticsearchStore

        client = Elasticsearch(ES_URL, api_key=ES_API_KEY or None, request_timeout=120)
        index = f"ai-index-idx-kitune-test-{uuid.uuid4().hex[:10]}"
        s = ElasticsearchStore(client, index=index, inference_id=INFERENCE_ID, mapping="ai-index")
        try:
            yield s
        finally:
            client.indices.delete(index=index, ignore_unavailable=True)
            s.close()
