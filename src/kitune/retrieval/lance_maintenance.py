"""LanceDB table maintenance off the write path: a background compactor and commit-conflict retries.

LanceDB's ``optimize()`` rewrites every fragment below its 1M-row target, so on a 250k-KI table
it takes tens of seconds; run inside the ``upsert`` that crossed the fragment threshold, it froze
that upsert for ~30 s (issue 14). Here:

* :class:`Compactor` — one daemon thread per store. ``request()`` is all a writer does (no I/O).
  The thread waits until no write has happened for ``quiet_s`` seconds — or, under a write
  stream that never pauses, at most ``max_wait_s`` after the request — then runs the store's
  maintenance (LanceDB's ``optimize()``: compaction, new rows folded into every index, cleanup of
  old versions) WITHOUT the write lock, so writers never wait for it and queries keep reading the
  version they opened until the compacted one is committed.
  Lance's optimistic concurrency makes a concurrent write win: the compaction commit is
  "preempted" (a retryable conflict), counted, and retried after a backoff — a compaction can
  be delayed by a steady write stream, never a write by a compaction.
* :func:`retry_conflicts` — a writer whose commit loses to a compaction commit retries it.

A bulk load should call the store's ``optimize()`` itself when it finishes (synchronous, under
the write lock): queries right after it are then served from compact, fully indexed data.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["CompactionStats", "Compactor", "is_commit_conflict", "retry_conflicts"]

log = logging.getLogger(__name__)
T = TypeVar("T")


def is_commit_conflict(e: BaseException) -> bool:
    """True for Lance's retryable commit conflicts (a concurrent transaction won the commit)."""
    text = str(e).lower()
    return "commit conflict" in text or "preempted by concurrent transaction" in text


def retry_conflicts(
    fn: Callable[[], T], *, attempts: int = 5, sleep: Callable[[float], None] = time.sleep
) -> T:
    """Run ``fn``, retrying it when it loses a commit race (up to ``attempts`` times, 50 ms apart).

    Raises:
        Exception: whatever ``fn`` raises when it is not a commit conflict, or the last conflict.
    """
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as e:  # lance raises plain RuntimeError/OSError
            if not is_commit_conflict(e) or attempt == attempts - 1:
                raise
            sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


@dataclass
class CompactionStats:
    """What the background compactor did (read it for logs and benchmarks)."""

    runs: int = 0
    """Maintenance runs that committed."""
    preempted: int = 0
    """Attempts that lost the commit to a concurrent write and were retried."""
    failed: int = 0
    """Attempts that failed for another reason (logged; the next request tries again)."""
    last_ms: float = 0.0
    """Duration of the last committed run, milliseconds."""
    last_error: str = ""


class Compactor:
    """Runs ``maintain`` in a daemon thread when asked, in quiet moments, retrying lost commits.

    Args:
        maintain: the maintenance to run (compaction + index folding); must be safe to run
            concurrently with writes (it holds no write lock).
        name: thread name.
        quiet_s: wait until no write happened for this long before starting (≥ 0).
        max_backoff_s: longest wait after a preempted attempt.
        max_wait_s: start at the latest this many seconds after the request even while writes
            continue (None: wait for a quiet moment however long; a steady write stream then
            leaves every row it writes outside the indices until it stops).
    """

    def __init__(
        self,
        maintain: Callable[[], None],
        *,
        name: str = "kitune-lance-compactor",
        quiet_s: float = 1.0,
        max_backoff_s: float = 30.0,
        max_wait_s: float | None = None,
    ) -> None:
        self._maintain = maintain
        self._name = name
        self.quiet_s = quiet_s
        self.max_backoff_s = max_backoff_s
        self.max_wait_s = max_wait_s
        self._requested_at = time.monotonic()
        self.stats = CompactionStats()
        self._wanted = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._last_write = time.monotonic()

    def wrote(self) -> None:
        """Record that a write just committed (restarts the quiet period)."""
        self._last_write = time.monotonic()

    def request(self) -> None:
        """Ask for a maintenance run soon; returns at once (starts the thread on first use)."""
        with self._lock:
            if self._stop.is_set():
                return
            if self._idle.is_set():  # the first request since the last run: its clock starts now
                self._requested_at = time.monotonic()
            self._idle.clear()
            self._wanted.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def pending(self) -> bool:
        """True while a requested run has not committed yet."""
        return not self._idle.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no run is pending (True) or ``timeout`` seconds pass (False)."""
        return self._idle.wait(timeout)

    def cancel_pending(self) -> None:
        """Forget a pending request (a synchronous ``optimize()`` just did the work)."""
        self._wanted.clear()
        if self._thread is None or not self._thread.is_alive():
            self._idle.set()

    def close(self, timeout: float = 120.0) -> None:
        """Stop the thread, letting a run in progress finish (at most ``timeout`` seconds). Idempotent."""
        with self._lock:
            self._stop.set()
            self._wanted.set()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        self._idle.set()

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            if not self._wanted.wait(timeout=1.0):
                continue
            if self._stop.is_set():
                break
            now = time.monotonic()
            quiet_left = self.quiet_s - (now - self._last_write)
            waited_left = (
                float("inf") if self.max_wait_s is None else self.max_wait_s - (now - self._requested_at)
            )
            if quiet_left > 0 and waited_left > 0:
                self._stop.wait(min(quiet_left, waited_left))
                continue
            self._wanted.clear()
            t0 = time.perf_counter()
            try:
                self._maintain()
            except Exception as e:  # never let maintenance kill the thread
                if is_commit_conflict(e):
                    self.stats.preempted += 1
                    self._wanted.set()
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, self.max_backoff_s)
                    continue
                self.stats.failed += 1
                self.stats.last_error = f"{type(e).__name__}: {e}"[:500]
                log.warning("LanceDB background compaction failed (will retry on the next request): %s", e)
            else:
                self.stats.runs += 1
                self.stats.last_ms = (time.perf_counter() - t0) * 1000
                backoff = 0.5
            with self._lock:
                if not self._wanted.is_set():
                    self._idle.set()
                else:  # asked again during the run: the next one's clock starts now
                    self._requested_at = time.monotonic()
        self._idle.set()
