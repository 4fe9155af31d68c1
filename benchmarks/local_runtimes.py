"""The two llama.cpp runtimes side by side: a llama-server compiled for this CPU vs the xllamacpp wheel.

Same GGUF, same server parameters (kitune's launcher builds both: ``--slots`` slots of ``--n-ctx``
tokens, continuous batching, ``--threads``), same prompt set, in one run, one runtime after the
other (never both at once). Each prompt is ``--docs-per-prompt`` fixture paragraphs under an
extraction-style instruction (3: ~550-800 tokens); each request generates exactly
``--gen-tokens`` tokens (``ignore_eos``) with the prompt cache off (``cache_prompt: false``), so
every request reads its whole prompt. Requests stream, so time to first token is measured at the client.

Levels: 1 request at a time (``--requests-1`` requests), then ``--slots`` at a time
(``--requests-n`` requests). Per runtime and level it records the engine's own rates (llama.cpp's
``timings``: prompt tokens/s and generation tokens/s per request, the median), the aggregate
generation rate (generated tokens / wall time), the client-side time to first token, the wall
time, and the server's peak resident memory (``VmHWM`` of its process), plus the machine's CPU
flags and what each runtime says it compiled in.

Usage::

    python benchmarks/local_runtimes.py                                  # native (cached) vs wheel
    python benchmarks/local_runtimes.py --native ~/.cache/kitune/bin/KEY/llama-server
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from _common import machine_info, markdown_table, write_results

from kitune.config import LocalModelConfig
from kitune.data.bundled import packaged_fixture
from kitune.data.loaders import load_corpus
from kitune.localmodel import (
    LocalModelServer,
    build_llama_server_command,
    build_xllamacpp_command,
    cpu_flags,
    ensure_gguf,
    find_free_port,
    find_native_build,
    wheel_version,
)

INSTRUCTION = (
    "Extract up to 6 facts from the documents below as a JSON object "
    '{"facts": [{"subject": str, "predicate": str, "object": str}]}.\n\n'
)


def _prompts(n: int, docs_per_prompt: int) -> list[str]:
    docs = [d for d in load_corpus(packaged_fixture()) if len(d.text) >= 500]
    out = []
    for i in range(n):
        chunk = docs[docs_per_prompt * i : docs_per_prompt * (i + 1)]
        out.append(INSTRUCTION + "\n\n".join(f"# {d.title}\n{d.text}" for d in chunk))
    return out


def _server_pid(guard_pid: int) -> int | None:
    """The runtime's own process: the guard's child for the native binary, the guard itself for the wheel."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == guard_pid:
            return int(entry.name)
    return guard_pid


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _one(base: str, alias: str, prompt: str, gen_tokens: int) -> dict[str, Any]:
    body = {
        "model": alias,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": gen_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "cache_prompt": False,
        "stream": True,
    }
    started = time.monotonic()
    first: float | None = None
    timings: dict[str, Any] = {}
    with httpx.stream("POST", f"{base}/chat/completions", json=body, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
            if first is None and delta.get("content"):
                first = time.monotonic() - started
            if chunk.get("timings"):
                timings = chunk["timings"]
    return {
        "latency_s": time.monotonic() - started,
        "ttft_s": first,
        "prompt_n": timings.get("prompt_n"),
        "prompt_tps": timings.get("prompt_per_second"),
        "gen_n": timings.get("predicted_n"),
        "gen_tps": timings.get("predicted_per_second"),
    }


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 2) if vals else None


def run_runtime(
    name: str,
    command: list[str],
    port: int,
    cfg: LocalModelConfig,
    prompts: list[str],
    args: argparse.Namespace,
) -> dict[str, Any]:
    log = Path(args.log_dir) / f"{name}-{port}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    server = LocalModelServer(command, port=port, model_alias=cfg.model, log_path=log, ready_path="/health")
    t0 = time.monotonic()
    server.start()
    startup_s = round(time.monotonic() - t0, 2)
    assert server.pid is not None
    pid = _server_pid(server.pid)
    levels = []
    offset = 0
    try:
        for concurrency, n in ((1, args.requests_1), (cfg.parallel, args.requests_n)):
            batch = prompts[offset : offset + n]
            offset += n
            t = time.monotonic()
            with ThreadPoolExecutor(concurrency) as pool:
                res = list(pool.map(lambda p: _one(server.api_base, cfg.model, p, args.gen_tokens), batch))
            wall = time.monotonic() - t
            levels.append(
                {
                    "concurrency": concurrency,
                    "requests": n,
                    "wall_s": round(wall, 1),
                    "prompt_tokens_median": _median([r["prompt_n"] for r in res]),
                    "prompt_tps_median": _median([r["prompt_tps"] for r in res]),
                    "gen_tps_median": _median([r["gen_tps"] for r in res]),
                    "gen_tps_aggregate": round(sum(r["gen_n"] or 0 for r in res) / wall, 2),
                    "ttft_s_median": _median([r["ttft_s"] for r in res]),
                    "per_request": res,
                }
            )
        peak = _peak_rss_mb(pid)
    finally:
        server.stop()
    text = log.read_text(errors="replace")
    compiled = re.search(r"(CPU : [^\n]*)", text)  # the wheel prints it; the native binary does not
    return {
        "runtime": name,
        "startup_s": startup_s,
        "peak_rss_mb": peak,
        "system_info": compiled.group(1).strip() if compiled else None,
        "levels": levels,
        "log": str(log),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--native", type=Path, default=None, help="llama-server binary (default: the cached build)"
    )
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--docs-per-prompt", type=int, default=3, help="fixture paragraphs per prompt")
    ap.add_argument("--requests-1", type=int, default=2)
    ap.add_argument("--requests-n", type=int, default=2)
    ap.add_argument("--runtimes", nargs="+", default=["llama-server", "xllamacpp"])
    ap.add_argument("--log-dir", default="/tmp/kitune-local-runtimes")
    ap.add_argument("--out", default="local_runtimes")
    args = ap.parse_args()

    machine = machine_info()
    flags = cpu_flags()
    cfg = LocalModelConfig(n_ctx=args.n_ctx, n_threads=args.threads, parallel=args.slots)
    gguf = ensure_gguf(cfg)
    native = args.native or find_native_build(None, flags)
    prompts = _prompts(args.requests_1 + args.requests_n, args.docs_per_prompt)
    results: list[dict[str, Any]] = []
    for name in args.runtimes:
        port = find_free_port()
        if name == "llama-server":
            if native is None:
                sys.exit("no native llama-server: run `kitune lm build` or pass --native")
            command = build_llama_server_command(cfg, gguf, port=port, alias=cfg.model, binary=native)
        else:
            command = build_xllamacpp_command(cfg, gguf, port=port, alias=cfg.model)
        print(f"{name}: starting", flush=True)
        results.append(run_runtime(name, command, port, cfg, prompts, args))
        # written after each runtime, so a run cut short keeps what it measured
        _write(args, machine, flags, native, gguf, results)


HEADERS = [
    "runtime",
    "concurrency",
    "requests",
    "prompt tokens (median)",
    "prompt tok/s (median)",
    "gen tok/s per request (median)",
    "generated tok per wall s (prompts included)",
    "time to first token s (median)",
    "wall s",
    "peak RSS MB",
    "start-up s",
]


def _write(
    args: argparse.Namespace,
    machine: Any,
    flags: frozenset[str] | None,
    native: Path | None,
    gguf: Path,
    results: list[dict[str, Any]],
) -> None:
    rows = [
        [
            r["runtime"],
            lv["concurrency"],
            lv["requests"],
            lv["prompt_tokens_median"],
            lv["prompt_tps_median"],
            lv["gen_tps_median"],
            lv["gen_tps_aggregate"],
            lv["ttft_s_median"],
            lv["wall_s"],
            r["peak_rss_mb"],
            r["startup_s"],
        ]
        for r in results
        for lv in r["levels"]
    ]
    isa = sorted(f for f in flags or () if f.startswith(("avx", "amx", "fma", "f16c", "bmi2")))
    summary = "\n".join(
        [
            markdown_table(HEADERS, rows),
            "",
            f"CPU flags (SIMD): {' '.join(isa)}",
            *(f"- {r['runtime']} compiled in: {r['system_info']}" for r in results),
        ]
    )
    print(summary, flush=True)
    write_results(
        args.out,
        machine=machine,
        params={
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "native": str(native),
            "xllamacpp": wheel_version(),
            "gguf": str(gguf),
        },
        results={"runtimes": results, "cpu_flags": sorted(flags or ())},
        summary_md=summary,
        notes=[
            "Runtimes run one after the other on the same 2 cores; other processes on the machine are "
            "listed by the load average. The long-running llama-server of another job was paused (SIGSTOP).",
            "Engine rates are llama.cpp's own timings (prompt_per_second, predicted_per_second); "
            "time to first token is measured by the client over a streamed request.",
        ],
    )


if __name__ == "__main__":
    main()
