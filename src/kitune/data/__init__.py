"""Dataset loaders (BrowseComp-Plus layout, plain JSONL) and seeded splits."""

from __future__ import annotations

from kitune.data.loaders import (
    Dataset,
    LoadReport,
    Question,
    SkippedLine,
    load_corpus,
    load_corpus_with_report,
    load_dataset,
    load_questions,
)

__all__ = [
    "Dataset",
    "LoadReport",
    "Question",
    "SkippedLine",
    "load_corpus",
    "load_corpus_with_report",
    "load_dataset",
    "load_questions",
]
