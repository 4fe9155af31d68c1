"""Shared corpora for the bootstrap tests: a small prose corpus with questions and a record file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TOPICS = {
    "film": [
        "The film {n} was directed by Ana Ruiz and released in 19{y}; the drama film starred Tom Hale "
        "and the film was distributed by Lumen Pictures to cinemas.",
    ],
    "river": [
        "The {n} River flows through Northvale and empties into the Grey Sea near Port {y}; the river "
        "basin, river delta and river valley cross three provinces.",
    ],
    "chemist": [
        "{n} was a chemist born in 18{y} in Lyon who studied copper salts; the chemist won the Davy "
        "Medal for chemistry research on catalysis in the laboratory.",
    ],
}


def _prose_docs() -> list[dict[str, str]]:
    docs = []
    i = 0
    for topic, templates in TOPICS.items():
        for k in range(10):
            template = templates[0]
            name = f"{topic.title()}{k}"
            docs.append({"docid": f"{100 + i}", "title": name, "text": template.format(n=name, y=10 + k)})
            i += 1
    return docs


@pytest.fixture
def prose_corpus(tmp_path: Path) -> Path:
    """A folder with corpus.jsonl (30 docs, three topics) and questions.jsonl (3 questions)."""
    root = tmp_path / "prose"
    root.mkdir()
    (root / "corpus.jsonl").write_text(
        "\n".join(json.dumps(d) for d in _prose_docs()) + "\n", encoding="utf-8"
    )
    questions = [
        {"query_id": "q1", "query": "Who directed the film Film3?", "answer": "Ana Ruiz"},
        {"query_id": "q2", "query": "How long is the River7 River?", "answer": "217 kilometres"},
        {"query_id": "q3", "query": "Which medal did the chemist Chemist5 win?", "answer": "Davy Medal"},
    ]
    (root / "questions.jsonl").write_text(
        "\n".join(json.dumps(q) for q in questions) + "\n", encoding="utf-8"
    )
    return root


@pytest.fixture
def records_file(tmp_path: Path) -> Path:
    """A JSONL file of 12 payment records (no text field; one with a nested field, one without an id)."""
    rows = []
    for i in range(12):
        row: dict[str, object] = {
            "payment_id": f"p{i}",
            "payer": f"Customer {i % 4}",
            "amount_eur": 10.5 * (i + 1),
            "status": "settled" if i % 3 else "refunded",
            "created": f"2024-0{1 + i % 9}-1{i % 10}",
        }
        if i == 0:
            row["meta"] = {"channel": "web"}
        rows.append(row)
    path = tmp_path / "payments.jsonl"
    path.write_bytes(("\n".join(json.dumps(r) for r in rows) + "\nnot json\n").encode() + b"\xff\xfe bad\n")
    return path
