"""Concurrency (issue 8 item 5): LanceStore under concurrent readers and writers, threads and processes.

Optuna storage under parallel workers (case M3) is covered by
tests/optimizers_tests/test_knobs.py::test_parallel_processes_on_the_journal and
::test_parallel_refuses_sqlite.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

from kitune.config import LanceStoreConfig
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.lance import LanceStore
from kitune.schema import QueryPlan
from kitune.testing.store_contract import make_ki

BATCH = 10

_CHILD_WRITER = """
import sys
from kitune.config import LanceStoreConfig
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.lance import LanceStore
from kitune.testing.store_contract import make_ki

store = LanceStore(sys.argv[1], HashEmbedder(dim=32), config=LanceStoreConfig(write_batch_size=10))
prefix, batches = sys.argv[2], int(sys.argv[3])
for b in range(batches):
    r = store.upsert([make_ki(f"{prefix} {b}-{j}", f"Place {j}", docid=f"{prefix}{b}") for j in range(10)])
    assert r.ok, r
    print("committed", b, flush=True)
"""


def _kis(prefix: str, batch: int) -> list:  # type: ignore[type-arg]
    return [make_ki(f"{prefix} {batch}-{j}", f"Place {j}", docid=f"{prefix}{batch}") for j in range(BATCH)]


def _store(path: Path, **kw: object) -> LanceStore:
    return LanceStore(path, HashEmbedder(dim=32), config=LanceStoreConfig(write_batch_size=BATCH), **kw)  # type: ignore[arg-type]


def test_threads_readers_see_whole_batches_while_a_writer_commits(tmp_path: Path) -> None:
    store = _store(tmp_path / "db")
    n_batches = 15
    errors: list[BaseException] = []
    seen_counts: list[list[int]] = [[] for _ in range(3)]
    done = threading.Event()

    def writer() -> None:
        try:
            for b in range(n_batches):
                r = store.upsert(_kis("Writer", b))
                assert r.ok and r.indexed == BATCH, r
        except BaseException as e:
            errors.append(e)
        finally:
            done.set()

    def reader(i: int) -> None:
        try:
            while not done.is_set():
                seen_counts[i].append(store.count())
                hits = store.search(QueryPlan(lexical="Writer Place", semantic="Writer lives", size=5)).hits
                assert len(hits) <= 5
                for h in hits:
                    assert store.get(h.ki.id).id == h.ki.id
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer)] + [
        threading.Thread(target=reader, args=(i,)) for i in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert store.count() == n_batches * BATCH
    ids = {k.id for k in store.iter_kis()}
    assert ids == {k.id for b in range(n_batches) for k in _kis("Writer", b)}  # no lost write
    for counts in seen_counts:
        assert counts == sorted(counts)  # never goes backwards
        assert all(c % BATCH == 0 for c in counts)  # never half a batch
    store.close()


def test_second_process_writes_while_this_process_reads_and_writes(tmp_path: Path) -> None:
    db = tmp_path / "db"
    here = _store(db, read_consistency=timedelta(0))
    here.upsert(_kis("Seed", 0))  # the table exists before the child opens it
    n_child, n_here = 20, 10
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD_WRITER, str(db), "Child", str(n_child)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    counts: list[int] = []
    failures: list[str] = []
    assert child.stdout is not None
    first = child.stdout.readline()  # the child is committing: write alongside it
    assert first.startswith("committed"), child.stderr.read() if child.stderr else ""
    for b in range(n_here):
        r = here.upsert(_kis("Parent", b))
        failures += [f.reason for f in r.failed]
        counts.append(here.count())
    out, err = child.communicate(timeout=180)
    assert child.returncode == 0, err[-2000:]
    assert out.count("committed") == n_child - 1
    # concurrent commits from two processes: Lance's optimistic concurrency retries; nothing lost
    assert failures == []
    assert counts == sorted(counts)
    fresh = _store(db)
    want = {k.id for k in _kis("Seed", 0)}
    want |= {k.id for b in range(n_here) for k in _kis("Parent", b)}
    want |= {k.id for b in range(n_child) for k in _kis("Child", b)}
    assert {k.id for k in fresh.iter_kis()} == want
    assert fresh.count() == len(want) == (1 + n_here + n_child) * BATCH
    here.close()
    fresh.close()
