from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from kitune.ki import KI, ki_id, lifecycle_status, slugify


def _ki(**kw):
    base = dict(
        docid="100060",
        title="Abshir Ata Waterfall was established in 1975.",
        description="Abshir Ata Waterfall, a geological reserve in Osh Province, Kyrgyzstan, was established in 1975.",  # noqa: E501
        subject="Abshir Ata Waterfall",
        predicate="established_in",
        obj="1975",
        evidence=["It was established in 1975."],
        confidence=90,
        tags=["waterfall"],
        corpus="fixture",
    )
    base.update(kw)
    return KI.from_fact(**base)


def test_stable_id_upserts_across_typographic_variants():
    a = ki_id("1", "O’Neill", "born_in", "Dublin")
    b = ki_id("1", "O'Neill", "born_in", "dublin")
    assert a == b and a.startswith("ki-") and len(a) == 27
    assert ki_id("2", "O'Neill", "born_in", "Dublin") != a


def test_from_fact_shape_matches_published_json():
    ki = _ki()
    data = ki.model_dump(mode="json")
    assert data["type"] == "knowledge_indicator"
    assert data["tags"] == ["waterfall", "entity:abshir-ata-waterfall", "entity:1975", "doc:100060"]
    assert data["references"] == ["index://fixture"]
    assert data["payload"]["properties"] == {
        "subject": "Abshir Ata Waterfall",
        "predicate": "established_in",
        "object": "1975",
        "docid": "100060",
    }
    assert data["payload"]["subtype"] == "dataset_fact" and data["payload"]["status"] == "active"
    assert KI.model_validate(data) == ki


@pytest.mark.parametrize(
    "field,value",
    [
        ("title", "x" * 141),
        ("description", "y" * 351),
        ("predicate", "NotSnake"),
        ("predicate", "a" * 33),
        ("confidence", 101),
        ("tags", ["Bad Tag"]),
    ],
)
def test_rules_are_enforced(field, value):
    with pytest.raises(ValidationError):
        _ki(**{field: value})


def test_lifecycle_status_windows():
    now = datetime(2026, 11, 30, tzinfo=UTC)
    week = timedelta(days=7)
    assert lifecycle_status(now - timedelta(days=6), now, stale_after=week) == "active"
    assert lifecycle_status(now - timedelta(days=8), now, stale_after=week) == "stale"
    assert lifecycle_status(now - timedelta(days=15), now, stale_after=week) == "expired"
    assert lifecycle_status(now, now, stale_after=week, expires_at=now) == "expired"


def test_slugify_folds_accents():
    assert slugify("Zürich  Main—Station") == "zurich-main-station"
