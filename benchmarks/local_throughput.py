"""Throughput of the embedded model: llama-server (parallel slots) vs llama-cpp-python, side by side.

Real model, real prompts. Two workloads, each sent at concurrency 1, 2, 4 and 8 to each server:

* ``extract`` — kitune's own extractor (:class:`kitune.programs.fact_extractor.FactExtractor`,
  sentence-indexed evidence mode, ``max_tokens`` 700, the demo's settings) on fixture documents,
  through the whole LM layer (DSPy → LiteLLM → the server);
* ``agent`` — the baseline agent's first turn: its real system prompt (skill rules + tool list)
  and a fixture question, ``max_tokens`` 200.

Per level it records wall time, aggregate output tokens/s and prompt tokens/s (sums of the
server-reported usage over the wall time), per-request latency, KIs kept (extract) and the
server's resident memory (VmRSS of the server process, read from /proc). Requests per level:
``max(2, concurrency)`` (``--requests-scale`` multiplies it); each level takes the next documents
and questions, so no prompt is sent twice to one server. Both servers use the same GGUF,
threads and per-slot context; llama-server runs with ``--parallel 8``.

Usage::

    python benchmarks/local_throughput.py                 # both servers, levels 1 2 4 8
    python benchmarks/local_throughput.py --servers llama-server --levels 1 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import dspy
import httpx
from _common import machine_info, markdown_table, write_results

FIXTURE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "fixture"


def _rss_mb(pid: int | None) -> float:
    """Resident memory in MB of ``pid`` and its children (the guard's llama-server child)."""
    if pid is None:
        return 0.0
    pids = {pid}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) in pids:
                    pids.add(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    total_kb = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
        except OSError:
            continue
    return round(total_kb / 1024, 1)


def _agent_messages(questions: list[Any], docs: list[Any]) -> list[list[dict[str, str]]]:
    from kitune.config import KituneConfig
    from kitune.evaluation.protocol import system_prompt
    from kitune.evaluation.tools import Toolbox, build_toolbox

    cfg = KituneConfig()

    class _NoCorpus:  # only the tool list is read; no search runs
        def __getattr__(self, name: str) -> Any:
            raise RuntimeError("not used")

    box: Toolbox = build_toolbox("baseline", cfg, corpus_store=_NoCorpus())  # type: ignore[arg-type]
    system = system_prompt("baseline", box.describe(), 6)
    return [[{"role": "system", "content": system}, {"role": "user", "content": q.query}] for q in questions]


def run_server(
    kind: str, levels: list[int], scale: int, docs: list[Any], agent_msgs: list[Any]
) -> dict[str, Any]:
    from kitune.config import KituneConfig
    from kitune.lm import build_lm
    from kitune.localmodel import get_local_server, stop_local_server
    from kitune.programs.fact_extractor import FactExtractor
    from kitune.usage import TokenLedger

    stop_local_server()
    overrides = {
        "lm": {
            "local": {"server": kind, "parallel": max(levels), "n_ctx": 4096},
            "extract": {"max_tokens": 700, "timeout_s": 1800.0},
        },
        "extraction": {"evidence_mode": "sentences", "max_facts_per_doc": 6},
        "corpus_name": "fixture",
    }
    cfg = KituneConfig.model_validate(overrides)
    t0 = time.monotonic()
    server = get_local_server(cfg.lm.local)
    startup_s = time.monotonic() - t0
    rows: list[dict[str, Any]] = []
    extractor = FactExtractor.from_config(cfg)
    for workload in ("extract", "agent"):
        offset = 0  # each level takes the next documents/questions: no level re-reads a prompt
        # another level sent, so neither the slots' prompt cache nor anything else is reused
        for level in levels:
            n = max(2, level) * scale
            first = offset
            offset += n
            ledger = TokenLedger()
            lm = build_lm(cfg, "extract", ledger=ledger)
            latencies: list[float] = []
            kis = [0]
            usage: list[tuple[int, int]] = []
            failed: list[str] = []

            def one(
                i: int,
                first: int = first,
                lm: Any = lm,
                latencies: list[float] = latencies,
                kis: list[int] = kis,
                usage: list[tuple[int, int]] = usage,
                failed: list[str] = failed,
                workload: str = workload,
            ) -> None:
                start = time.monotonic()
                try:
                    _one_request(workload, i, first, lm, kis, usage)
                except Exception as e:  # a failed request is counted, never fatal to the sweep
                    failed.append(f"{type(e).__name__}: {e}"[:200])
                latencies.append(time.monotonic() - start)

            def _one_request(
                workload: str, i: int, first: int, lm: Any, kis: list[int], usage: list[tuple[int, int]]
            ) -> None:
                if workload == "extract":
                    with dspy.context(lm=lm):
                        res = extractor.extract_document(docs[(first + i) % len(docs)])
                    kis[0] += len(res.kis)
                else:
                    r = httpx.post(
                        f"{server.api_base}/chat/completions",
                        json={
                            "model": server.model_alias,
                            "messages": agent_msgs[(first + i) % len(agent_msgs)],
                            "max_tokens": 200,
                            "temperature": 0,
                        },
                        headers={"Authorization": "Bearer sk-local"},
                        timeout=900,
                    )
                    u = r.json()["usage"]
                    usage.append((int(u["prompt_tokens"]), int(u["completion_tokens"])))

            started = time.monotonic()
            with ThreadPoolExecutor(max_workers=level) as pool:
                list(pool.map(one, range(n)))
            wall = time.monotonic() - started
            if workload == "extract":
                tot = ledger.totals()
                prompt_toks, out_toks = tot.get("input_tokens", 0), tot.get("output_tokens", 0)
            else:
                prompt_toks, out_toks = sum(u[0] for u in usage), sum(u[1] for u in usage)
            row = {
                "server": kind,
                "workload": workload,
                "concurrency": level,
                "requests": n,
                "failed": len(failed),
                "wall_s": round(wall, 1),
                "output_tok_s": round(out_toks / wall, 2),
                "prompt_tok_s": round(prompt_toks / wall, 2),
                "output_tokens": out_toks,
                "prompt_tokens": prompt_toks,
                "latency_p50_s": round(statistics.median(latencies), 1),
                "requests_per_hour": round(3600 * (n - len(failed)) / wall, 1),
                "kis": kis[0] if workload == "extract" else None,
                "server_rss_mb": _rss_mb(server.pid),
                "load_1m": round(os.getloadavg()[0], 2),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    stop_local_server()
    return {"server": kind, "startup_s": round(startup_s, 1), "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", nargs="+", default=["llama-server", "llama-cpp-python"])
    ap.add_argument("--levels", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--requests-scale", type=int, default=1)
    ap.add_argument("--out", default="local_throughput")
    args = ap.parse_args()
    from kitune.data.loaders import load_dataset

    ds = load_dataset(FIXTURE)
    docs = [d for d in ds.documents if len(d.text) >= 300][:32]
    agent_msgs = _agent_messages(list(ds.questions)[:24], docs)
    results = [run_server(kind, args.levels, args.requests_scale, docs, agent_msgs) for kind in args.servers]
    rows = [r for res in results for r in res["rows"]]
    best: dict[str, float] = {}
    for r in rows:
        if r["workload"] == "extract":
            best[r["server"]] = max(best.get(r["server"], 0.0), r["requests_per_hour"])
    command = "python benchmarks/local_throughput.py --servers {} --levels {} --requests-scale {}".format(
        " ".join(args.servers), " ".join(map(str, args.levels)), args.requests_scale
    )
    cols = [
        "server",
        "workload",
        "concurrency",
        "requests",
        "failed",
        "wall_s",
        "output_tok_s",
        "prompt_tok_s",
        "latency_p50_s",
        "requests_per_hour",
        "kis",
        "server_rss_mb",
        "load_1m",
    ]
    md = "\n".join(
        [
            "# Embedded model throughput: llama-server vs llama-cpp-python",
            "",
            markdown_table(cols, [[r[c] for c in cols] for r in rows]),
            "",
            f"Best extraction documents/hour: {json.dumps(best)}",
            f"Server start-up (s): {json.dumps({res['server']: res['startup_s'] for res in results})}",
        ]
    )
    write_results(
        args.out,
        machine=machine_info(),
        params={"command": command, **vars(args)},
        results={
            "rows": rows,
            "best_extract_docs_per_hour": best,
            "startup_s": {res["server"]: res["startup_s"] for res in results},
        },
        summary_md=md,
    )


if __name__ == "__main__":
    main()
