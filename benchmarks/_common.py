"""Shared helpers for the benchmarks: timing statistics, machine info, result files.

Every benchmark writes ``benchmarks/results/<name>.json`` (machine-readable, the full record) and
``benchmarks/results/<name>.md`` (a short Markdown summary) through :func:`write_results`. Both
carry the machine (CPU model, cores, load average before and after), package versions, the exact
command and the UTC date, so a number can always be traced back to the run that produced it.

Nothing here asserts on time: benchmarks report, they do not pass or fail on speed.
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "RESULTS_DIR",
    "Machine",
    "Stats",
    "Timer",
    "cpu_seconds",
    "enable_tiktoken",
    "machine_info",
    "markdown_table",
    "ndcg_at_k",
    "package_versions",
    "percentile",
    "recall_at_k",
    "summarize",
    "time_calls",
    "write_results",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
"""Where result files go (``benchmarks/results``)."""

DEFAULT_PACKAGES = ("kitune", "dspy", "litellm", "lancedb", "pyarrow", "tantivy", "numpy", "wordllama")


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (NumPy's default ``linear`` method).

    Args:
        values: the samples (any order, at least one).
        q: the percentile, 0–100 inclusive.

    Returns:
        The ``q``-th percentile; ``percentile(v, 50)`` is the median, ``0`` the minimum, ``100``
        the maximum.

    Raises:
        ValueError: ``values`` is empty or ``q`` is outside 0–100.
    """
    if not values:
        raise ValueError("percentile of no values: time at least one call")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q={q} is outside 0-100")
    ordered = sorted(float(v) for v in values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    if lo == hi:
        return ordered[lo]
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Stats:
    """Summary of repeated measurements (same unit as the samples, e.g. milliseconds)."""

    n: int
    """Number of samples."""
    median: float
    """50th percentile."""
    p95: float
    """95th percentile (linear interpolation)."""
    mean: float
    """Arithmetic mean."""
    min: float
    """Smallest sample."""
    max: float
    """Largest sample."""

    def to_dict(self, ndigits: int = 3) -> dict[str, float | int]:
        """JSON-able dict with values rounded to ``ndigits``."""
        return {k: (round(v, ndigits) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def summarize(values: Sequence[float]) -> Stats:
    """Median, p95, mean, min and max of ``values``.

    Raises:
        ValueError: ``values`` is empty.
    """
    if not values:
        raise ValueError("summarize of no values: time at least one call")
    vals = [float(v) for v in values]
    return Stats(
        n=len(vals),
        median=percentile(vals, 50),
        p95=percentile(vals, 95),
        mean=sum(vals) / len(vals),
        min=min(vals),
        max=max(vals),
    )


def time_calls(
    fn: Callable[[Any], object], args: Iterable[Any], *, warmup: int = 0
) -> tuple[list[float], list[object]]:
    """Call ``fn(arg)`` for each argument and time each call with ``time.perf_counter``.

    Args:
        fn: the call to time (one argument).
        args: the arguments, one call each, in order.
        warmup: run ``fn`` on the first ``warmup`` arguments once more beforehand, untimed (cache
            and JIT warm-up).

    Returns:
        ``(latencies_ms, results)``, both in argument order.
    """
    items = list(args)
    for arg in items[:warmup]:
        fn(arg)
    latencies: list[float] = []
    results: list[object] = []
    for arg in items:
        t0 = time.perf_counter()
        results.append(fn(arg))
        latencies.append((time.perf_counter() - t0) * 1000.0)
    return latencies, results


class Timer:
    """Context manager measuring wall seconds and this process's CPU seconds (user + system).

    Example::

        with Timer() as t:
            work()
        print(t.wall_s, t.cpu_s)
    """

    def __init__(self) -> None:
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self._t0 = 0.0
        self._c0 = 0.0

    def __enter__(self) -> Timer:
        self._t0 = time.perf_counter()
        self._c0 = cpu_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self._t0
        self.cpu_s = cpu_seconds() - self._c0


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far (all threads), from ``getrusage``."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


@dataclass(frozen=True)
class Machine:
    """Where a benchmark ran."""

    cpu_model: str
    cores: int
    """Logical CPUs visible to this process."""
    memory_gb: float
    python: str
    platform: str
    load_before: tuple[float, float, float]
    """1/5/15-minute load average when the benchmark started."""
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """1/5/15-minute load average when it ended."""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def _loadavg() -> tuple[float, float, float]:
    try:
        a, b, c = os.getloadavg()
        return (round(a, 2), round(b, 2), round(c, 2))
    except OSError:
        return (0.0, 0.0, 0.0)


def machine_info() -> Machine:
    """Describe this machine now (``load_after`` is filled in by :func:`write_results`)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return Machine(
        cpu_model=_cpu_model(),
        cores=cores,
        memory_gb=_memory_gb(),
        python=platform.python_version(),
        platform=platform.platform(),
        load_before=_loadavg(),
    )


def package_versions(names: Iterable[str] = DEFAULT_PACKAGES) -> dict[str, str]:
    """Installed version of each distribution (``"not installed"`` when missing)."""
    out: dict[str, str] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def enable_tiktoken() -> str:
    """Make :func:`kitune.usage.estimate_tokens` count with tiktoken offline; return the method used.

    tiktoken downloads ``cl100k_base`` on first use; litellm ships that file and points
    ``TIKTOKEN_CACHE_DIR`` at it when imported. Returns ``"tiktoken cl100k_base"`` when that
    works, else ``"chars/4"`` (the fallback :func:`estimate_tokens` then uses).
    """
    try:
        import litellm.litellm_core_utils.default_encoding  # noqa: F401  (sets TIKTOKEN_CACHE_DIR)
        import tiktoken

        tiktoken.get_encoding("cl100k_base").encode("probe")
        return "tiktoken cl100k_base"
    except Exception:
        return "chars/4"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub Markdown table; floats are shown with up to 3 decimals."""

    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.3f}".rstrip("0").rstrip(".") if abs(v) < 1e6 else f"{v:.3g}"
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


@dataclass
class _Record:
    benchmark: str
    date_utc: str
    command: str
    machine: dict[str, Any]
    packages: dict[str, str]
    params: dict[str, Any]
    results: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def write_results(
    name: str,
    *,
    machine: Machine,
    params: Mapping[str, Any],
    results: Mapping[str, Any],
    summary_md: str,
    notes: Sequence[str] = (),
    out_dir: Path | None = None,
    command: str | None = None,
    packages: Mapping[str, str] | None = None,
) -> tuple[Path, Path]:
    """Write ``<out_dir>/<name>.json`` and ``<out_dir>/<name>.md``.

    Args:
        name: file stem, e.g. ``"retrieval_latency"`` or ``"retrieval_latency.quick"``.
        machine: from :func:`machine_info` at the start; the load average after is read now.
        params: the benchmark's parameters (sizes, seeds, concurrency levels …).
        results: the measurements (JSON-able).
        summary_md: Markdown body (tables, headline) placed under the header.
        notes: caveats worth reading with the numbers (what was synthetic, what was missed).
        out_dir: default :data:`RESULTS_DIR`.
        command: default the current ``sys.argv``, shell-quoted, prefixed with ``python``.
        packages: default :func:`package_versions`.

    Returns:
        ``(json_path, md_path)``.
    """
    out = out_dir or RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    done = Machine(**{**asdict(machine), "load_after": _loadavg()})
    cmd = command or "python " + " ".join(shlex.quote(a) for a in sys.argv)
    record = _Record(
        benchmark=name,
        date_utc=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        command=cmd,
        machine=asdict(done),
        packages=dict(packages if packages is not None else package_versions()),
        params=dict(params),
        results=dict(results),
        notes=list(notes),
    )
    json_path = out / f"{name}.json"
    md_path = out / f"{name}.md"
    json_path.write_text(json.dumps(asdict(record), indent=2, sort_keys=False, default=str) + "\n", "utf-8")
    m = done
    header = [
        f"# {name}",
        "",
        f"- date (UTC): {record.date_utc}",
        f"- command: `{cmd}`",
        f"- machine: {m.cpu_model}, {m.cores} cores, {m.memory_gb} GB RAM, Python {m.python}",
        f"- load average before: {' / '.join(str(x) for x in m.load_before)}; "
        f"after: {' / '.join(str(x) for x in m.load_after)}",
        "- packages: " + ", ".join(f"{k} {v}" for k, v in record.packages.items()),
        "",
    ]
    body = summary_md.rstrip() + "\n"
    tail = ["", "## Notes", "", *[f"- {n}" for n in notes]] if notes else []
    md_path.write_text("\n".join(header) + "\n" + body + ("\n".join(tail) + "\n" if tail else ""), "utf-8")
    return json_path, md_path


def recall_at_k(ranked: Sequence[str], relevant: Iterable[str], k: int) -> float:
    """Share of ``relevant`` ids found in the first ``k`` of ``ranked`` (0.0–1.0).

    Duplicates in ``ranked`` count once. Returns 0.0 when ``relevant`` is empty.

    Raises:
        ValueError: ``k`` < 1.
    """
    if k < 1:
        raise ValueError(f"k={k}: use k >= 1")
    rel = set(relevant)
    if not rel:
        return 0.0
    return len(rel & set(ranked[:k])) / len(rel)


def ndcg_at_k(ranked: Sequence[str], relevant: Iterable[str], k: int = 10) -> float:
    """Binary-relevance nDCG@k (0.0–1.0): DCG of ``ranked[:k]`` over the ideal DCG.

    Gain 1 for a relevant id at its first occurrence, discount ``1/log2(rank + 1)``; the ideal
    ranking puts ``min(len(relevant), k)`` relevant ids first. 0.0 when ``relevant`` is empty.

    Raises:
        ValueError: ``k`` < 1.
    """
    if k < 1:
        raise ValueError(f"k={k}: use k >= 1")
    rel = set(relevant)
    if not rel:
        return 0.0
    seen: set[str] = set()
    dcg = 0.0
    for i, doc in enumerate(ranked[:k], start=1):
        if doc in rel and doc not in seen:
            dcg += 1.0 / math.log2(i + 1)
        seen.add(doc)
    ideal = sum(1.0 / math.log2(i + 1) for i in range(1, min(len(rel), k) + 1))
    return dcg / ideal
