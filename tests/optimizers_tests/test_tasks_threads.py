"""The disambiguator's metric under GEPA threads: each call sees only its own KI (issue 22 item 2)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from types import SimpleNamespace

from kitune.ki import KI
from kitune.optimizers.tasks import disambiguator_metric
from kitune.retrieval.memory import MemoryStore


def _ki(i: int) -> KI:
    title = f"Question {i}: the answer is A{i}, not B{i}."
    return KI.from_fact(
        docid=f"d{i}",
        title=title,
        description=title + " The evidence says so.",
        subject=f"S{i}",
        predicate="answer_is",
        obj=f"A{i}",
        evidence=[title],
        confidence=80,
        now=datetime(2026, 1, 1, tzinfo=UTC),
    )


def test_concurrent_metric_calls_never_see_each_others_kis() -> None:
    store = MemoryStore()

    def context_fn(question: str) -> list[str]:
        time.sleep(0.02)  # widen the window in which another call could have written its KI
        return [k.id for k in store.iter_kis()]

    metric = disambiguator_metric(store, context_fn, top_k=1)
    gold = SimpleNamespace(question="q", correct_answer="A", wrong_answer="B")
    preds = [SimpleNamespace(result=SimpleNamespace(ki=_ki(i), rejected_reason=None)) for i in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        scores = list(pool.map(lambda p: metric(gold, p).score, preds))
    assert scores == [1.0] * 8  # top-1 is always the call's own KI: no other KI is in the store meanwhile
    assert list(store.iter_kis()) == []  # every KI removed again
