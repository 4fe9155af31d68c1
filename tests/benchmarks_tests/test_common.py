"""The benchmark helpers: percentile maths, summaries, result-file shape. No timing assertions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _common import (
    Machine,
    markdown_table,
    ndcg_at_k,
    percentile,
    recall_at_k,
    summarize,
    time_calls,
    write_results,
)


@pytest.mark.parametrize("q", [0, 5, 25, 50, 90, 95, 99, 100])
def test_percentile_matches_numpy_linear(q: float) -> None:
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0, 5.0]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_known_values() -> None:
    assert percentile([10.0], 95) == 10.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile(list(range(1, 101)), 95) == pytest.approx(95.05)


@pytest.mark.parametrize(("values", "q"), [([], 50), ([1.0], -1), ([1.0], 100.5)])
def test_percentile_rejects_bad_input(values: list[float], q: float) -> None:
    with pytest.raises(ValueError):
        percentile(values, q)


def test_summarize() -> None:
    s = summarize([4.0, 1.0, 3.0, 2.0])
    assert (s.n, s.median, s.min, s.max, s.mean) == (4, 2.5, 1.0, 4.0, 2.5)
    assert s.p95 == pytest.approx(3.85)
    assert s.to_dict(1) == {"n": 4, "median": 2.5, "p95": 3.9, "mean": 2.5, "min": 1.0, "max": 4.0}
    with pytest.raises(ValueError):
        summarize([])


def test_time_calls_returns_results_in_order_and_runs_warmup_untimed() -> None:
    calls: list[int] = []

    def fn(x: int) -> int:
        calls.append(x)
        return x * 2

    latencies, results = time_calls(fn, [1, 2, 3], warmup=2)
    assert results == [2, 4, 6]
    assert calls == [1, 2, 1, 2, 3]
    assert len(latencies) == 3 and all(t >= 0 for t in latencies)


def test_markdown_table() -> None:
    table = markdown_table(["a", "b"], [[1, 0.12345], ["x|y", 2.0]])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| 1 | 0.123 |", "| x\\|y | 2 |"]


def test_write_results_shape(tmp_path: Path) -> None:
    machine = Machine(
        cpu_model="Test CPU",
        cores=2,
        memory_gb=4.0,
        python="3.11.7",
        platform="linux",
        load_before=(1.0, 0.5, 0.2),
    )
    json_path, md_path = write_results(
        "demo",
        machine=machine,
        params={"n": 10},
        results={"latency_ms": {"p95": 1.5}},
        summary_md="| a |\n|---|\n| 1 |",
        notes=["synthetic data"],
        out_dir=tmp_path,
        command="python benchmarks/demo.py --quick",
        packages={"kitune": "0.1.0"},
    )
    data = json.loads(json_path.read_text())
    assert set(data) == {
        "benchmark",
        "date_utc",
        "command",
        "machine",
        "packages",
        "params",
        "results",
        "notes",
    }
    assert data["command"] == "python benchmarks/demo.py --quick"
    assert data["machine"]["cpu_model"] == "Test CPU"
    assert data["machine"]["load_before"] == [1.0, 0.5, 0.2]
    assert len(data["machine"]["load_after"]) == 3
    assert data["results"] == {"latency_ms": {"p95": 1.5}}
    assert data["date_utc"].endswith("Z")
    md = md_path.read_text()
    assert md.startswith("# demo\n")
    assert "command: `python benchmarks/demo.py --quick`" in md
    assert "Test CPU, 2 cores" in md
    assert "- synthetic data" in md


def test_recall_at_k() -> None:
    ranked = ["a", "x", "b", "y", "a"]
    assert recall_at_k(ranked, ["a", "b"], 1) == 0.5
    assert recall_at_k(ranked, ["a", "b"], 3) == 1.0
    assert recall_at_k(ranked, ["c"], 5) == 0.0
    assert recall_at_k(ranked, [], 5) == 0.0
    with pytest.raises(ValueError):
        recall_at_k(ranked, ["a"], 0)


def test_ndcg_at_k() -> None:
    assert ndcg_at_k(["a", "b", "x"], ["a", "b"], 10) == pytest.approx(1.0)
    # one relevant doc at rank 2 of two relevant: (1/log2 3) / (1 + 1/log2 3)
    expected = (1 / np.log2(3)) / (1 + 1 / np.log2(3))
    assert ndcg_at_k(["x", "a", "y"], ["a", "b"], 10) == pytest.approx(expected)
    assert ndcg_at_k(["a", "a"], ["a"], 10) == pytest.approx(1.0)  # duplicates gain once
    assert ndcg_at_k(["x", "y", "a"], ["a"], 2) == 0.0
    assert ndcg_at_k(["a"], [], 10) == 0.0
