"""In-memory fakes for the evaluation tests."""

from __future__ import annotations

from collections.abc import Sequence

from kitune.errors import DocumentNotFoundError
from kitune.evaluation.tools import ContextObservation
from kitune.retrieval.base import CorpusHit, WriteResult
from kitune.schema import Document


class FakeCorpusStore:
    """Keyword-overlap search over a dict of documents."""

    def __init__(self, docs: Sequence[Document]) -> None:
        self.docs = {d.docid: d for d in docs}
        self.searches: list[str] = []

    def add_documents(self, docs: Sequence[Document]) -> WriteResult:
        for d in docs:
            self.docs[d.docid] = d
        return WriteResult(len(docs), len(docs))

    def search(
        self, query: str, *, k: int = 10, snippets_per_hit: int = 3, snippet_chars: int = 700
    ) -> list[CorpusHit]:
        self.searches.append(query)
        words = set(query.lower().split())
        scored = []
        for d in self.docs.values():
            score = len(words & set(d.text.lower().split()))
            if score:
                scored.append((-score, d.docid, d))
        scored.sort()
        return [
            CorpusHit(
                docid=d.docid, title=d.title, snippets=[d.text[:snippet_chars]][:snippets_per_hit], score=-s
            )
            for s, _, d in scored[:k]
        ]

    def get(self, docid: str) -> Document:
        if docid not in self.docs:
            raise DocumentNotFoundError(docid)
        return self.docs[docid]

    def count(self) -> int:
        return len(self.docs)


DOCS = [
    Document(docid="d1", title="Paris", text="Paris is the capital of France."),
    Document(docid="d2", title="France", text="France is a country in Europe with capital Paris."),
    Document(docid="d3", title="Lyon", text="Lyon is a city in France."),
]


def fake_context(table: dict[str, ContextObservation]):
    calls: list[str] = []

    def get_context(query: str) -> ContextObservation:
        calls.append(query)
        return table.get(query, ContextObservation(text="", doc_ids=(), n_results=0))

    get_context.calls = calls  # type: ignore[attr-defined]
    return get_context
