"""Elasticsearch client messages name the client pyproject requires, never one it excludes (issue 25)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from elastic_transport import ApiResponseMeta, HttpHeaders
from elasticsearch import UnsupportedProductError
from elasticsearch import __versionstr__ as client_version

from kitune.errors import ConfigError
from kitune.retrieval.es_client import CLIENT_REQUIREMENT, cluster_info

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_named_requirement_is_pyprojects_elasticsearch_extra() -> None:
    extra = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert CLIENT_REQUIREMENT in extra["elasticsearch"]
    assert CLIENT_REQUIREMENT == "elasticsearch>=9.5.1" and client_version.split(".")[0] == "9"


class _NotElastic:
    """A server whose answers lack X-Elastic-Product and whose GET / is no known product."""

    def info(self) -> None:
        body = {"name": "n", "version": {"number": "1.2.3"}, "tagline": "a search server"}
        meta = ApiResponseMeta(status=200, http_version="1.1", headers=HttpHeaders(), duration=0.0, node=None)  # type: ignore[arg-type]
        raise UnsupportedProductError("not Elasticsearch", meta=meta, body=body)


def test_a_server_that_is_not_elasticsearch_is_told_the_clusters_the_client_serves() -> None:
    with pytest.raises(ConfigError) as info:
        cluster_info(_NotElastic())
    assert str(info.value) == (
        "the server at the store URL is not Elasticsearch (it reports version 1.2.3): its answers lack the "
        "X-Elastic-Product header the elasticsearch client requires. Point store.url_env (KITUNE_ES_URL) at "
        "an Elasticsearch 9.x cluster, or use the embedded store (store.type: lancedb)"
    )
