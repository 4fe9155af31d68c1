"""``kitune lm``: check LLM access and the embedded local model.

``smoke`` makes one real call through the LM layer and prints the token ledger; ``models``
lists the packaged local models and the runtime that would serve them; ``build`` compiles
llama-server for this CPU into the cache (only when asked); ``bench`` measures a local model's speed and JSON
fact-extraction quality on real documents (numbers for docs/local-model.md).
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from kitune.cli.common import ConfigOption, fail, fail_with, get_config, preload_litellm
from kitune.errors import KituneError

__all__ = ["lm_app", "register"]

lm_app = typer.Typer(help="Check LLM access and the embedded local model.", no_args_is_help=True)
out = Console()

_SMOKE_PROMPT = "In one sentence: what is a knowledge indicator in a search system?"


@lm_app.command("smoke")
def smoke(
    config: ConfigOption = None,
    role: Annotated[
        str, typer.Option(help="LLM role to call: extract, rewrite, agent, judge, reflection.")
    ] = "extract",
    prompt: Annotated[str, typer.Option(help="User message to send.")] = _SMOKE_PROMPT,
) -> None:
    """Make one real call for ROLE and print the reply, wall time, tokens/s and the token ledger.

    With no provider configured, the embedded local model starts first; its start-up time is shown apart.

    Exit code 1 when the call fails, with the classified error.
    """
    from kitune.config import ROLES
    from kitune.usage import TokenLedger

    if role not in ROLES:
        fail(f"--role {role!r} is not a role: use one of {', '.join(ROLES)}")
    cfg = get_config(config)
    try:
        from kitune.lm import build_lm
    except ImportError as e:
        fail(f"the LM layer (kitune.lm) is not available: {e}")
    ledger = TokenLedger()
    try:
        if cfg.uses_local_model(role):
            from kitune.localmodel import get_local_server

            t0 = time.perf_counter()
            server = get_local_server(cfg.lm.local)
            out.print(
                f"local model [bold]{server.model_alias}[/] at {server.api_base} "
                f"(ready in {time.perf_counter() - t0:.1f} s, log {server.log_path})"
            )
        lm = build_lm(cfg, role, ledger=ledger)
        preload_litellm()  # not part of the call's wall time / tokens per second
        t0 = time.perf_counter()
        with ledger.stage("smoke"):
            outputs = lm(messages=[{"role": "user", "content": prompt}])
        wall_s = time.perf_counter() - t0
    except KituneError as e:
        fail_with(e, code=1)
    first = outputs[0] if outputs else ""
    reply = first.get("text", "") if isinstance(first, dict) else str(first)
    totals = ledger.totals()
    out.print(f"[bold]reply:[/] {reply.strip()}")
    tps = totals["output_tokens"] / wall_s if wall_s > 0 else 0.0
    out.print(
        f"wall time {wall_s:.2f} s, {totals['output_tokens']} output tokens, {tps:.1f} tokens/s (end to end)"
    )
    rows = ledger.to_rows()
    table = Table(title="token ledger")
    for col in rows[0] if rows else ["calls"]:
        table.add_column(str(col))
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    out.print(table)


@lm_app.command("models")
def models() -> None:
    """List the packaged local models, whether each is installed and assembled, and the default."""
    from kitune.config import LocalModelConfig
    from kitune.localmodel import PACKAGED_MODELS, cache_dir, choose_runtime, is_model_installed

    default = LocalModelConfig().model
    table = Table(title="packaged local models")
    # Names and sizes never wrap or get cut at 80 columns; only the description wraps.
    for col in ("name", "default", "installed", "assembled", "size"):
        table.add_column(col, no_wrap=True, min_width=len(col))
    table.add_column("description", ratio=1, overflow="fold")
    for m in PACKAGED_MODELS.values():
        assembled = (cache_dir() / "models" / m.filename).is_file()
        table.add_row(
            m.name,
            "yes" if m.name == default else "",
            "yes" if is_model_installed(m.name) else "no",
            "yes" if assembled else "no",
            f"{m.size_bytes / 1e9:.2f} GB",
            m.description,
        )
    out.print(table)
    out.print("install one: bash scripts/install_local_model.sh --model NAME", highlight=False)
    try:
        runtime = choose_runtime(LocalModelConfig())
        out.print(f"runtime: {runtime.name} ({runtime.reason})", highlight=False)
    except KituneError as e:
        out.print(f"runtime: [red]none[/] ({e})", highlight=False)


@lm_app.command("build")
def build(
    rebuild: Annotated[
        bool, typer.Option("--rebuild", help="Compile again even if a build is cached.")
    ] = False,
) -> None:
    """Compile llama.cpp's llama-server for this CPU once, into the cache (about 8 min on 2 cores).

    Nothing else compiles: a first run serves the model from the prebuilt xllamacpp wheel. Build
    where it pays: on an AVX-512 CPU the native build reads prompts faster (docs/local-model.md has
    the measured rates); the launcher (lm.local.server: auto) then uses it and logs why. Needs
    cmake and a C++17 compiler.

    Examples::

        kitune lm build
        kitune lm build --rebuild
    """
    from kitune.localmodel import build_native_server

    try:
        binary = build_native_server(rebuild=rebuild)
    except KituneError as e:
        fail_with(e)
    out.print(
        f"llama-server for this CPU: {binary} (lm.local.server: auto now serves with it)", highlight=False
    )


# --- bench -------------------------------------------------------------------------------------

_BENCH_SYSTEM = (
    "You extract facts from one document. Reply with a JSON object "
    '{"facts": [{"subject": str, "predicate": str, "object": str, "evidence_span": str}]}. '
    "Give up to 10 facts about the people, places, organisations, dates and quantities in the document. "
    "predicate is a short snake_case relation such as located_in, founded_by, born_in or height. "
    "evidence_span is a short passage copied exactly, character for character, from the document "
    "that states the fact."
)
_FACTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "facts": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    k: {"type": "string"} for k in ("subject", "predicate", "object", "evidence_span")
                },
                "required": ["subject", "predicate", "object", "evidence_span"],
            },
        }
    },
    "required": ["facts"],
}
_EVAL_RE = re.compile(r"^llama_perf_context_print:\s+eval time =\s+([\d.]+) ms /\s+(\d+) runs", re.M)
_PREFIX_RE = re.compile(
    r"^Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens to eval", re.M
)


def _timings(log: str) -> dict[str, float | None]:
    """Parse the server log of one call.

    Returns the prompt tokens evaluated after the prefix cache and llama.cpp's decode rate in
    tokens/s (its prompt-eval timer reports ~0 ms in this build, so it is not used).
    """
    ev, pre = _EVAL_RE.findall(log), _PREFIX_RE.findall(log)
    ev_ms, runs = (float(ev[-1][0]), int(ev[-1][1])) if ev else (0.0, 0)
    return {
        "prompt_eval_tokens": int(pre[-1][1]) if pre else None,
        "decode_tps": round(runs / (ev_ms / 1000), 2) if ev_ms > 0 and runs > 1 else None,
    }


def _post_json(url: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
    with opener.open(req, timeout=timeout_s) as resp:
        result: dict[str, Any] = json.loads(resp.read())
    return result


def _read_from(path: Path, offset: int) -> str:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", errors="replace")


def _score_facts(text: str, content: str) -> dict[str, Any]:
    from kitune.text import find_span, fold_text

    start, end = content.find("{"), content.rfind("}")  # tolerate ```json fences without a grammar
    try:
        facts = json.loads(content[start : end + 1] if 0 <= start < end else content)["facts"]
        valid = isinstance(facts, list) and all(isinstance(f, dict) for f in facts)
    except (ValueError, KeyError, TypeError):
        facts, valid = [], False
    facts = facts if valid else []
    spans = [f for f in facts if find_span(text, str(f.get("evidence_span", ""))) is not None]
    supported = [
        f
        for f in spans
        if fold_text(str(f.get("object", ""))).lower() in fold_text(str(f["evidence_span"])).lower()
    ]
    return {
        "valid_json": valid,
        "facts": facts,
        "n_facts": len(facts),
        "n_span_verbatim": len(spans),
        "n_object_in_span": len(supported),
    }


@lm_app.command("bench")
def bench(
    corpus: Annotated[Path, typer.Option(help="corpus.jsonl (docid, title, text per line).")],
    model: Annotated[str, typer.Option(help="Packaged local model to measure.")] = "qwen2.5-coder-1.5b",
    docs: Annotated[int, typer.Option(min=1, help="Documents to extract from.")] = 3,
    min_chars: Annotated[int, typer.Option(min=1, help="Skip shorter documents (characters).")] = 600,
    n_threads: Annotated[int | None, typer.Option(min=1, help="CPU threads (default: all cores).")] = None,
    max_tokens: Annotated[int, typer.Option(min=1, help="Max output tokens per document.")] = 1024,
    grammar: Annotated[
        bool,
        typer.Option(help="Constrain output with response_format json_object + schema (a JSON grammar)."),
    ] = True,
    output: Annotated[
        Path | None, typer.Option(help="Write per-document results (with facts) as JSON.")
    ] = None,
) -> None:
    """Measure a local model's speed and JSON fact-extraction quality on real documents.

    Reports per document: prompt and generation tokens/s, wall time, valid JSON, and facts whose
    evidence span is verbatim in the document (and whose object appears in that span).

    Each document is sent twice: first with max_tokens=1 (prompt_tps = prompt tokens evaluated
    after the shared-prefix cache / wall time), then in full, finding the prompt cached
    (gen_tps = completion tokens / wall time, including JSON-grammar sampling; decode_tps =
    llama.cpp's own decode rate, without sampling). wall_s is the sum of both.
    """
    import os

    from kitune.config import LocalModelConfig
    from kitune.localmodel import LocalModelServer

    try:
        lines = [json.loads(line) for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        fail(f"--corpus {corpus} is not a readable JSONL file: {e}")
    chosen = [d for d in lines if len(d.get("text", "")) >= min_chars][:docs]
    try:
        cfg = LocalModelConfig(model=model, n_threads=n_threads)
        server = LocalModelServer.from_config(cfg)
    except (KituneError, ValueError) as e:
        fail(str(e))
    results: list[dict[str, Any]] = []
    with server:
        warm = [{"role": "system", "content": _BENCH_SYSTEM}, {"role": "user", "content": "Title: x"}]
        # Warm-up with the shared system prompt: loads the weights and makes every measured call
        # reuse the same prefix (llama.cpp reports a bogus prompt time when little prefix matches).
        _post_json(
            f"{server.api_base}/chat/completions",
            {"model": server.model_alias, "max_tokens": 1, "messages": warm},
            timeout_s=300,
        )
        for doc in chosen:
            body: dict[str, Any] = {
                "model": server.model_alias,
                "temperature": 0.0,
                "max_tokens": 1,
                "messages": [
                    {"role": "system", "content": _BENCH_SYSTEM},
                    {"role": "user", "content": f"Title: {doc.get('title', '')}\n\n{doc['text']}"},
                ],
            }
            # Phase 1: prompt only (1 output token) -> prompt tokens/s. Phase 2 then finds the
            # whole prompt in the KV cache and measures generation (with the grammar, if any).
            offset = server.log_path.stat().st_size
            t0 = time.perf_counter()
            _post_json(f"{server.api_base}/chat/completions", body, timeout_s=900)
            prompt_s = time.perf_counter() - t0
            n_prompt = _timings(_read_from(server.log_path, offset))["prompt_eval_tokens"] or 0
            body["max_tokens"] = max_tokens
            if grammar:
                body["response_format"] = {"type": "json_object", "schema": _FACTS_SCHEMA}
            offset = server.log_path.stat().st_size
            t0 = time.perf_counter()
            resp = _post_json(f"{server.api_base}/chat/completions", body, timeout_s=900)
            gen_s = time.perf_counter() - t0
            usage = resp.get("usage", {})
            c_tok = usage.get("completion_tokens", 0)
            row = {
                "docid": doc.get("docid"),
                "chars": len(doc["text"]),
                "wall_s": round(prompt_s + gen_s, 2),
                "prompt_tokens": usage.get("prompt_tokens", 0),
                "prompt_eval_tokens": n_prompt,
                "prompt_tps": round(n_prompt / prompt_s, 1),
                "completion_tokens": c_tok,
                "gen_tps": round(c_tok / gen_s, 2),
                "decode_tps": _timings(_read_from(server.log_path, offset))["decode_tps"],
                "finish_reason": resp["choices"][0].get("finish_reason"),
            }
            content = resp["choices"][0]["message"].get("content") or ""
            row.update(_score_facts(doc["text"], content))
            if not row["valid_json"]:
                row["raw_head"], row["raw_tail"] = content[:300], content[-300:]
            results.append(row)
            out.print(f"{model} doc {row['docid']}: {row['wall_s']} s, {row['n_facts']} facts")
    table = Table(
        title=f"{model}, n_threads={cfg.n_threads or os.cpu_count()}, load avg {os.getloadavg()[0]:.2f}"
    )
    cols = (
        "docid",
        "chars",
        "wall_s",
        "prompt_tokens",
        "completion_tokens",
        "prompt_eval_tokens",
        "prompt_tps",
        "gen_tps",
        "decode_tps",
        "valid_json",
        "n_facts",
        "n_span_verbatim",
        "n_object_in_span",
    )
    for col in cols:
        table.add_column(col)
    for row in results:
        table.add_row(*(str(row[c]) for c in cols))
    out.print(table)
    if output is not None:
        output.write_text(
            json.dumps(
                {
                    "model": model,
                    "n_threads": cfg.n_threads or os.cpu_count(),
                    "loadavg": os.getloadavg(),
                    "results": results,
                },
                indent=2,
            ),
            encoding="utf-8",
        )


def register(app: typer.Typer) -> None:
    """Add ``kitune lm`` to ``app``."""
    app.add_typer(lm_app, name="lm")
