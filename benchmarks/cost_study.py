"""Optuna on the knobs that cost (issue 39.3): a seeded two-objective study on the context-cost benchmark.

Each trial sets the :data:`kitune.optimizers.cost_study.COST_KNOBS` (top-k, observation cap, RRF
constant, per-signal weights, branch size) and measures, with no LLM, what
``benchmarks/context_cost.py`` measures for the in-context skill: one ``get_context`` per question
(the question as the query, the agent's compact rendering, the cap) → answer-bearing rate
(maximised) and mean tokens per call (minimised). The study is a TPE sampler with a fixed seed in
a SQLite file, so a rerun resumes (``--trials`` more). The current setting is trial 0; the
chosen setting is the Pareto trial with the fewest tokens among those whose answer-bearing rate
is at least the current one's (:meth:`~kitune.optimizers.cost_study.CostStudy.choose`). The
Pareto front is plotted to ``benchmarks/results/<name>.png``.

What it does not do: check the chosen setting end to end (that needs the model, see
``experiments/locomo-cost/README.md``), or tune ``agent.max_steps`` (no deterministic measurement
sees it).

Usage::

    python benchmarks/cost_study.py --kis experiments/loop-dev-48/kis/kis-d6e68232.jsonl \\
        --questions experiments/loop-dev-48/questions.json --trials 40
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import RESULTS_DIR, enable_tiktoken, machine_info, markdown_table, write_results
from context_cost import DEV_DATA, contains_answer, open_kis

from kitune.data.loaders import load_dataset


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEV_DATA)
    ap.add_argument("--kis", type=Path, required=True, help="KIs: JSONL file")
    ap.add_argument("--questions", type=Path, default=None, help="a run's questions.json (tune + validation)")
    ap.add_argument("--trials", type=int, default=40, help="trials to add to the study (it resumes)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--storage", type=Path, default=RESULTS_DIR / "cost_study.dev.db")
    ap.add_argument("--embedder", default="wordllama", choices=("wordllama", "hash"))
    ap.add_argument("--name", default="cost_study.dev")
    args = ap.parse_args(argv)
    machine = machine_info()
    tokenizer = enable_tiktoken()

    from kitune.config import load_config
    from kitune.evaluation.tools import in_context_toolbox
    from kitune.optimizers.cost_study import COST_KNOBS, CostStudy
    from kitune.retrieval.embedders import HashEmbedder, WordLlamaEmbedder
    from kitune.service.pipelines.evaluation import make_context_fn
    from kitune.usage import estimate_tokens

    base = load_config()
    ds = load_dataset(args.data.resolve())
    questions = list(ds.questions)
    if args.questions is not None:
        spec = json.loads(args.questions.read_text(encoding="utf-8"))
        wanted = [str(i) for i in (*spec.get("tune", ()), *spec.get("validation", ()))]
        by_id = {q.query_id: q for q in questions}
        questions = [by_id[i] for i in wanted if i in by_id]
    embedder = WordLlamaEmbedder(256) if args.embedder == "wordllama" else HashEmbedder(256)
    store = open_kis(args.kis.resolve(), embedder)

    def objective(params: dict[str, int | float]) -> tuple[float, float]:
        cfg = load_config(overrides=params)
        store.retrieval = cfg.retrieval  # the fusion knobs are read from the store's section
        ctx_fn = make_context_fn(cfg, store, disambiguation=False)
        bearing, tokens = 0, 0
        for q in questions:
            box = in_context_toolbox(ctx_fn, ki_render="compact", max_chars=cfg.agent.observation_max_chars)
            obs = box.call("get_context", {"query": q.query})
            bearing += int(contains_answer(obs.text, q.golds))
            tokens += estimate_tokens(obs.text)
        return round(bearing / len(questions), 6), round(tokens / len(questions), 3)

    study = CostStudy(args.storage, args.name, space=COST_KNOBS, seed=args.seed)
    current = COST_KNOBS.current(base)
    current["agent.observation_max_chars"] = current["agent.observation_max_chars"] or 8000
    study.enqueue(current)
    study.optimize(objective, args.trials)
    trials = study.trials()
    ref = next(t for t in trials if dict(t.params) == current)
    chosen = study.choose(ref.rate)
    front = sorted(study.pareto(), key=lambda t: t.tokens)
    png = study.plot(RESULTS_DIR / f"{args.name}.png", reference=ref, chosen=chosen)

    def row(label: str, t: Any) -> list[Any]:
        p = dict(t.params)
        return [
            label,
            t.number,
            t.rate,
            t.tokens,
            p["retrieval.default_size"],
            p["agent.observation_max_chars"],
            p["retrieval.rrf_k"],
            f"{p['retrieval.tag_weight']:.2f}/{p['retrieval.lexical_weight']:.2f}/{p['retrieval.semantic_weight']:.2f}",
            p["retrieval.branch_size"],
        ]

    header = [
        "",
        "trial",
        "answer-bearing",
        "tokens/call",
        "top-k",
        "cap",
        "rrf_k",
        "weights tag/lex/sem",
        "branch",
    ]
    md = markdown_table(header, [row("current", ref), row("chosen", chosen)])
    md += "\n\nPareto front (fewest tokens first):\n\n" + markdown_table(
        header, [row("pareto", t) for t in front]
    )
    md += f"\n\n![Pareto front]({png.name})"
    results = {
        "questions": len(questions),
        "tokenizer": tokenizer,
        "current": ref.__dict__ | {"params": dict(ref.params)},
        "chosen": chosen.__dict__ | {"params": dict(chosen.params)},
        **study.summary(),
    }
    notes = [
        f"{len(trials)} completed trials in {args.storage.name} (TPE, seed {args.seed}); rerun to add more.",
        f"{len(questions)} questions, {store.count()} KIs ({args.kis}), embedder {args.embedder}, tokens by "
        f"{tokenizer}; compact rendering; no LLM (plain plan, no rewrite).",
        "Chosen = the Pareto trial with the fewest tokens among those at least as answer-bearing as the "
        "current setting. Not yet checked end to end (needs the model).",
    ]
    write_results(
        args.name,
        machine=machine,
        params={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        results=results,
        summary_md=md,
        notes=notes,
    )
    print(f"current {ref.rate} / {ref.tokens}; chosen #{chosen.number} {chosen.rate} / {chosen.tokens}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
