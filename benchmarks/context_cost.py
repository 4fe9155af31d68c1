"""Context cost: tokens the agent's context receives per retrieval call, baseline vs KIs.

For each question, the question text is sent once through each skill's retrieval tool, built
exactly as the eval harness builds it (:func:`kitune.evaluation.tools.build_toolbox` with the
configured sizes):

* **baseline** — ``search`` over the corpus store: up to ``retrieval.search_hits`` documents ×
  ``retrieval.snippets_per_hit`` snippets of ``retrieval.snippet_chars`` characters;
* **in-context** — ``get_context`` over the KI store: ``retrieval.default_size`` KIs rendered by
  :func:`kitune.service.serving.context.render_context` (plain plan, no LLM rewrite).

Reported per skill: input tokens per call (median / p95 / mean, :func:`kitune.usage.estimate_tokens`),
the share of calls whose context contains the gold answer (answer-bearing rate, after
:func:`kitune.text.normalize_answer` on both sides), tokens until the first answer-bearing result
in rank order (the prefix an agent must read), answer-bearing rate per 1k tokens, and the ratios
in-context / baseline. A skill without a store is reported as missing, never invented.

Issue 39.2's observation changes are measured side by side (``--kis`` given):

* **KI rendering** — ``full`` (title — description (docs: …) + a facet line, the rendering before)
  against ``compact`` (:func:`kitune.service.serving.context.compact_line`: the fact once,
  documents as ``[docid]``, of the facet line only its entities), each on the same KIs;
* **de-duplication** — a second look-up per question (the question's capitalised name runs, the
  entity a reformulating agent asks for next; questions without one are skipped): its tokens
  with and without the KIs the first look-up already showed, and the answer-bearing rate of the
  two look-ups together (unchanged by construction: only what was already shown is left out);
* **history** — a scripted agent that repeats the same pair of calls (``get_context`` and
  ``search`` on the question, the looping episode of issue 39) run through the real agent on
  these stores, with the call rules before issue 39 (``legacy``: identical results re-sent in
  full, refusals not counted) and after (``bounded``); input tokens per episode counted on the
  messages sent (the same tokenizer), and where each ends.

``--questions`` restricts to the ids of a committed run's ``questions.json`` (``tune`` +
``validation``); ``--docs-from`` restricts the corpus to the documents named in JSONL files
(``docid`` per line, e.g. that run's extraction state files): the corpus the KIs were extracted
from, so both skills search the same documents. ``--distractors N`` rebuilds a loop run's corpus
exactly as the loop built it (every evidence/gold document of those questions plus N seeded
distractors, :func:`kitune.service.tuning.slicing.select_documents`) — for a run whose extraction
state files also list documents of an earlier run whose cache it reused.

Usage::

    python benchmarks/context_cost.py --kis experiments/loop-dev-48/kis/kis-d6e68232.jsonl \
        --questions experiments/loop-dev-48/questions.json \
        --docs-from experiments/loop-dev-48/extractions/*.jsonl --embedder hash
    python benchmarks/context_cost.py --kis experiments/loop-dev-100/kis/kis-d6e68232.jsonl \
        --questions experiments/loop-dev-100/questions.json --distractors 20 --name context_cost.dev100
    python benchmarks/context_cost.py --data ../shared/data/fixture --kis PATH
    python benchmarks/context_cost.py                                       # baseline side only
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _common import enable_tiktoken, machine_info, markdown_table, summarize, write_results

from kitune.data.loaders import Question, load_dataset
from kitune.text import normalize_answer

DEV_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "dev"
_ITEM_RE = re.compile(r"^\d+\. ", re.MULTILINE)


def contains_answer(text: str, golds: Sequence[str]) -> bool:
    """True when any normalised gold appears as a whole-word run in the normalised ``text``."""
    hay = f" {normalize_answer(text)} "
    return any(g and f" {g} " in hay for g in (normalize_answer(x) for x in golds))


def split_items(text: str) -> list[str]:
    """Split a rendered result list (``1. …`` / ``2. …``) into its items, in rank order.

    Text before the first item and a trailing ``facets:`` line stay with the neighbouring item,
    so the items concatenate back to ``text`` minus nothing but the joins.
    """
    starts = [m.start() for m in _ITEM_RE.finditer(text)]
    if not starts:
        return [text] if text else []
    starts[0] = 0
    bounds = [*starts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def tokens_to_answer(items: Sequence[str], golds: Sequence[str], count: Callable[[str], int]) -> int | None:
    """Tokens of the shortest prefix of ``items`` whose last item holds the answer (None: never)."""
    total = 0
    for item in items:
        total += count(item)
        if contains_answer(item, golds):
            return total
    return None


BOOTSTRAP_RESAMPLES = 2000
"""Resamples of every bootstrap interval (seeded: the same inputs give the same intervals)."""


def bootstrap_ci(
    values: Sequence[float],
    stat: Callable[[Sequence[float]], float],
    *,
    seed: int = 0,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> tuple[float, float] | None:
    """Seeded percentile-bootstrap 95% interval of ``stat`` over ``values`` (None: no values)."""
    if not values:
        return None
    rng = random.Random(seed)
    n = len(values)
    draws = sorted(stat([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    return round(draws[int(0.025 * (resamples - 1))], 3), round(draws[round(0.975 * (resamples - 1))], 3)


def paired_ratio_ci(
    num: Sequence[float], den: Sequence[float], *, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[float, float] | None:
    """Seeded paired-bootstrap 95% interval of ``sum(num) / sum(den)`` (questions resampled together).

    Raises:
        ValueError: ``num`` and ``den`` differ in length (they must be the same questions).
    """
    if len(num) != len(den):
        raise ValueError(f"paired_ratio_ci: {len(num)} numerators vs {len(den)} denominators")
    if not num:
        return None
    rng = random.Random(seed)
    n = len(num)
    draws: list[float] = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        d = sum(den[i] for i in idx)
        if d:
            draws.append(sum(num[i] for i in idx) / d)
    if not draws:
        return None
    draws.sort()
    return round(draws[int(0.025 * (len(draws) - 1))], 3), round(draws[round(0.975 * (len(draws) - 1))], 3)


def _median(values: Sequence[float]) -> float:
    return summarize(values).median


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def measure(
    skill_call: Callable[[str], Any], questions: Sequence[Question], count: Callable[[str], int]
) -> dict[str, Any]:
    """One call per question: tokens, answer-bearing rate and tokens to the first answer, with intervals.

    The per-question values are kept under ``per_question`` (tokens per call, 0/1 answer-bearing)
    for the paired ratios; :func:`main` drops them before writing.
    """
    from kitune.evaluation.summary import wilson_interval

    per_call: list[int] = []
    to_answer: list[int] = []
    bearing_each: list[int] = []
    docs_hit = 0
    for q in questions:
        obs = skill_call(q.query)
        per_call.append(count(obs.text))
        bearing_each.append(int(contains_answer(obs.text, q.golds)))
        t = tokens_to_answer(split_items(obs.text), q.golds, count)
        if t is not None:
            to_answer.append(t)
        docs_hit += int(bool(set(obs.doc_ids) & set(q.evidence_docids)))
    n = len(questions)
    bearing = sum(bearing_each)
    tok = summarize(per_call)
    rate = bearing / n
    lo, hi = wilson_interval(bearing, n)
    return {
        "n": n,
        "tokens_per_call": tok.to_dict(1),
        "tokens_per_call_mean_ci95": bootstrap_ci(per_call, _mean),
        "answer_bearing": bearing,
        "answer_bearing_rate": round(rate, 4),
        "answer_bearing_rate_ci95": (round(lo, 3), round(hi, 3)),
        "evidence_doc_shown_rate": round(docs_hit / n, 4),
        "tokens_to_first_answer": summarize(to_answer).to_dict(1) if to_answer else None,
        "tokens_to_first_answer_median_ci95": bootstrap_ci(to_answer, _median),
        "answer_bearing_per_1k_tokens": round(rate / (tok.mean / 1000), 4) if tok.mean else 0.0,
        "per_question": {"tokens": per_call, "bearing": bearing_each},
    }


_NAME_RUN = re.compile(r"[A-Z][\w'’.-]*(?:\s+(?:(?:of|the|de|von|van)\s+)*[A-Z][\w'’.-]*)*")


def entity_query(question: str) -> str | None:
    """The question's capitalised name runs (first word aside): the next look-up; None when none."""
    words = question.split(maxsplit=1)
    rest = words[1] if len(words) > 1 else ""
    runs = [m.group(0).strip() for m in _NAME_RUN.finditer(rest)]
    runs = [r for r in runs if len(r) > 2]
    return " ".join(runs) if runs else None


def measure_dedupe(
    make_box: Callable[[bool], Any], questions: Sequence[Question], count: Callable[[str], int]
) -> dict[str, Any]:
    """Two look-ups per question (the question, then :func:`entity_query`), with and without dedupe."""
    second: dict[bool, list[int]] = {False: [], True: []}
    bearing: dict[bool, int] = {False: 0, True: 0}
    n = 0
    for q in questions:
        follow = entity_query(q.query)
        if follow is None or follow == q.query:
            continue
        n += 1
        for dedupe in (False, True):
            box = make_box(dedupe)
            a = box.call("get_context", {"query": q.query})
            b = box.call("get_context", {"query": follow})
            second[dedupe].append(count(b.text))
            bearing[dedupe] += int(contains_answer(a.text + "\n" + b.text, q.golds))
    return {
        "questions": n,
        "second_lookup_tokens_without": summarize(second[False]).to_dict(1) if n else None,
        "second_lookup_tokens_with": summarize(second[True]).to_dict(1) if n else None,
        "answer_bearing_two_lookups_without": round(bearing[False] / n, 4) if n else None,
        "answer_bearing_two_lookups_with": round(bearing[True] / n, 4) if n else None,
    }


def measure_loop(
    make_box: Callable[[], Any],
    questions: Sequence[Question],
    count: Callable[[str], int],
    *,
    rules: str,
    max_steps: int,
) -> dict[str, Any]:
    """The scripted looping agent (get_context, search on the question, repeated) under ``rules``."""
    from kitune.chat import ChatResponse
    from kitune.evaluation.agent import Agent
    from kitune.evaluation.budget import Budget
    from kitune.testing.chat import ScriptedChatModel

    def turn(reply: str) -> Callable[[Any], ChatResponse]:
        def f(messages: Any) -> ChatResponse:
            sent = sum(count(str(m.get("content") or "")) for m in messages)
            return ChatResponse(text=reply, input_tokens=sent, output_tokens=count(reply))

        return f

    tokens: list[int] = []
    steps: list[int] = []
    ended: dict[str, int] = {}
    for q in questions:
        calls = [json.dumps({"tool": t, "args": {"query": q.query}}) for t in ("get_context", "search")]
        model = ScriptedChatModel([turn(calls[i % 2]) for i in range(max_steps + 2)])
        budget = Budget(max_steps=max_steps, max_tokens=None, call_rules=rules)  # type: ignore[arg-type]
        ep = Agent(model, make_box(), budget=budget).run(q.query)
        tokens.append(ep.input_tokens)
        steps.append(len(ep.steps))
        why = ep.exhausted_by or ep.status
        ended[why] = ended.get(why, 0) + 1
    return {
        "input_tokens_per_episode": summarize(tokens).to_dict(1),
        "steps_per_episode": summarize(steps).to_dict(1),
        "ended_by": ended,
    }


def _brief(m: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in m.items() if k != "per_question"}


def open_kis(path: Path, embedder: Any) -> Any:
    from kitune.ki import KI

    if path.is_file():
        from kitune.retrieval.memory import MemoryStore

        store = MemoryStore(embedder)
        lines = path.read_text(encoding="utf-8").splitlines()
        store.upsert([KI.model_validate_json(line) for line in lines if line.strip()])
        return store
    from kitune.retrieval.lance import LanceStore

    return LanceStore(path, embedder, read_consistency=None)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEV_DATA, help="dataset folder (BrowseComp-Plus layout)")
    ap.add_argument("--kis", type=Path, default=None, help="KIs: JSONL file or LanceDB folder (kis table)")
    ap.add_argument("--limit", type=int, default=None, help="first N questions only")
    ap.add_argument("--embedder", default="wordllama", choices=("wordllama", "hash"))
    ap.add_argument("--quick", action="store_true", help="first 30 questions")
    ap.add_argument("--name", default=None)
    ap.add_argument(
        "--questions", type=Path, default=None, help="a run's questions.json: its tune+validation ids"
    )
    ap.add_argument(
        "--docs-from", type=Path, nargs="*", default=(), help="JSONL files naming the corpus docs"
    )
    ap.add_argument(
        "--distractors",
        type=int,
        default=None,
        help="rebuild a loop run's corpus as it was built: the questions' evidence/gold documents plus "
        "this many seeded distractors (kitune's select_documents; needs --questions)",
    )
    ap.add_argument("--distractor-seed", type=int, default=0, help="seed of --distractors (the loop's: 0)")
    ap.add_argument("--loop-steps", type=int, default=43, help="step budget of the scripted looping agent")
    args = ap.parse_args(argv)
    if args.quick:
        args.limit = args.limit or 30
    split = args.data.resolve().name
    name = args.name or f"context_cost.{split}" + (".quick" if args.quick else "")
    machine = machine_info()
    tokenizer = enable_tiktoken()

    from kitune.config import load_config
    from kitune.evaluation.tools import build_toolbox
    from kitune.retrieval.embedders import HashEmbedder, WordLlamaEmbedder
    from kitune.retrieval.lance_corpus import LanceCorpusStore
    from kitune.service.pipelines.evaluation import make_context_fn
    from kitune.usage import estimate_tokens

    cfg = load_config()
    r = cfg.retrieval
    ds = load_dataset(args.data.resolve())
    pool = list(ds.questions)
    if args.questions is not None:
        spec = json.loads(args.questions.read_text(encoding="utf-8"))
        wanted = [str(i) for i in (*spec.get("tune", ()), *spec.get("validation", ()))]
        by_id = {q.query_id: q for q in pool}
        pool = [by_id[i] for i in wanted if i in by_id]
    questions = pool[: args.limit] if args.limit else pool
    documents = list(ds.documents)
    if args.docs_from:
        keep = {
            str(json.loads(line)["docid"])
            for f in args.docs_from
            for line in f.read_text(encoding="utf-8").splitlines()
            if line.strip()
        }
        documents = [d for d in documents if d.docid in keep]
    if args.distractors is not None:
        if args.questions is None:
            raise SystemExit("--distractors rebuilds a loop run's corpus: give that run's --questions too")
        from kitune.service.tuning.slicing import select_documents

        evidence, picked = select_documents(
            pool, documents, distractors=args.distractors, seed=args.distractor_seed
        )
        documents = [*evidence, *picked]
    embedder = WordLlamaEmbedder(256) if args.embedder == "wordllama" else HashEmbedder(256)
    tmp = Path(tempfile.mkdtemp(prefix="kitune-bench-context-"))
    results: dict[str, Any] = {"questions": len(questions), "tokenizer": tokenizer}
    notes = [
        f"Tokens counted with {tokenizer} (kitune.usage.estimate_tokens).",
        "One call per question with the question text as the query; tool observations are built by "
        "the harness's own toolboxes (same rendering and caps the agent sees).",
        f"Baseline sizes: {r.search_hits} hits x {r.snippets_per_hit} snippets x {r.snippet_chars} chars; "
        f"in-context size: {r.default_size} KIs; observation cap {cfg.agent.observation_max_chars} chars.",
    ]
    try:
        corpus = LanceCorpusStore(tmp / "corpus", embedder)
        for i in range(0, len(documents), 2000):
            corpus.add_documents(documents[i : i + 2000])
        results["documents"] = len(documents)
        box = build_toolbox("baseline", cfg, corpus_store=corpus)
        results["baseline"] = measure(lambda q: box.call("search", {"query": q}), questions, estimate_tokens)
        print(f"baseline: {_brief(results['baseline'])}", flush=True)
        if args.kis is not None:
            kis = open_kis(args.kis.resolve(), embedder)
            results["kis_in_store"] = kis.count()
            ctx_fn = make_context_fn(cfg, kis, disambiguation=False)

            from kitune.evaluation.tools import in_context_toolbox

            limits = {
                "search_hits": r.search_hits,
                "snippets_per_hit": r.snippets_per_hit,
                "snippet_chars": r.snippet_chars,
                "max_chars": cfg.agent.observation_max_chars,
            }

            def ic_box(render: str, dedupe: bool = False, store: Any = None) -> Any:
                return in_context_toolbox(
                    ctx_fn, corpus_store=store, ki_render=render, dedupe_kis=dedupe, **limits
                )  # type: ignore[arg-type]

            for render in ("full", "compact"):
                key = "in_context" if render == "full" else "in_context_compact"
                results[key] = measure(
                    lambda q, render=render: ic_box(render).call("get_context", {"query": q}),
                    questions,
                    estimate_tokens,
                )
                print(f"{key}: {_brief(results[key])}", flush=True)
            results["dedupe"] = measure_dedupe(lambda d: ic_box("compact", d), questions, estimate_tokens)
            print(f"dedupe: {results['dedupe']}", flush=True)
            for rules, render, dedupe in (("legacy", "full", False), ("bounded", "compact", True)):
                results[f"loop_{rules}"] = measure_loop(
                    lambda render=render, dedupe=dedupe: ic_box(render, dedupe, corpus),
                    questions,
                    estimate_tokens,
                    rules=rules,
                    max_steps=args.loop_steps,
                )
                print(f"loop {rules}: {results[f'loop_{rules}']}", flush=True)
            notes += [
                f"Corpus: {len(documents)} documents "
                f"({'--distractors' if args.distractors is not None else '--docs-from'}), "
                f"{results['kis_in_store']} KIs, "
                f"{len(questions)} questions.",
                "in-context (full, before): the rendering before issue 39.2 (title — description (docs: …) "
                "+ facet line); in-context (compact, after): agent.ki_render=compact (the fact once, "
                "[docid], the facet line's entities only).",
                "Second look-up: the question's capitalised name runs as the query, after the question "
                "itself; 'with de-duplication' = agent.dedupe_kis (KIs the first look-up showed are left out "
                "with a count line).",
                f"Scripted loop: a model alternating get_context and search on the question for "
                f"{args.loop_steps} steps, no token budget; legacy = agent.call_rules legacy with the full "
                "rendering, bounded = the defaults (pointer for repeats, refusals end the episode, compact, "
                "de-duplicated). Tokens are those of the messages sent (JSON mode, no tool schemas).",
            ]
            kis.close()
        else:
            results["in_context"] = None
            notes.append(
                "No KIs were given (--kis): the in-context side and the ratios were not measured. "
                "Extract KIs for this split, then rerun with --kis."
            )
        corpus.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    b, c = results["baseline"], results["in_context"]
    cc = results.get("in_context_compact")
    per_q = {k: m.pop("per_question") for k, m in (("b", b), ("c", c), ("cc", cc)) if m is not None}

    def ratios(m: dict[str, Any], pq: dict[str, list[int]]) -> dict[str, Any]:
        ta, tb = m["tokens_to_first_answer"], b["tokens_to_first_answer"]
        return {
            "tokens_per_call_mean": round(m["tokens_per_call"]["mean"] / b["tokens_per_call"]["mean"], 3),
            "tokens_per_call_mean_ci95": paired_ratio_ci(pq["tokens"], per_q["b"]["tokens"]),
            "tokens_per_call_median": round(
                m["tokens_per_call"]["median"] / b["tokens_per_call"]["median"], 3
            ),
            "answer_bearing_rate": round(m["answer_bearing_rate"] / b["answer_bearing_rate"], 3)
            if b["answer_bearing_rate"]
            else None,
            "answer_bearing_rate_ci95": paired_ratio_ci(pq["bearing"], per_q["b"]["bearing"]),
            "tokens_to_first_answer_median": round(ta["median"] / tb["median"], 3) if ta and tb else None,
        }

    if c is not None:
        results["ratio_in_context_over_baseline"] = ratios(c, per_q["c"])
    if cc is not None:
        results["ratio_compact_over_baseline"] = ratios(cc, per_q["cc"])

    def fmt(point: Any, ci: Any) -> str:
        return f"{point} [{ci[0]}, {ci[1]}]" if ci else str(point)

    rows = []
    for skill, m in (("baseline", b), ("in-context (full, before)", c), ("in-context (compact, after)", cc)):
        if m is None and skill.startswith("in-context (compact"):
            continue
        if m is None:
            rows.append([skill, "not measured (no KIs)", "", "", "", "", ""])
            continue
        t, ta = m["tokens_per_call"], m["tokens_to_first_answer"]
        rows.append(
            [
                skill,
                t["median"],
                t["p95"],
                fmt(t["mean"], m["tokens_per_call_mean_ci95"]),
                fmt(
                    f"{m['answer_bearing_rate']} ({m['answer_bearing']}/{m['n']})",
                    m["answer_bearing_rate_ci95"],
                ),
                fmt(ta["median"], m["tokens_to_first_answer_median_ci95"]) + f" (n={ta['n']})" if ta else "-",
                m["answer_bearing_per_1k_tokens"],
            ]
        )
    md = markdown_table(
        [
            "skill",
            "tokens/call p50",
            "tokens/call p95",
            "tokens/call mean [95% CI]",
            "answer-bearing rate [Wilson 95%]",
            "tokens to first answer p50 [95% CI] (n answered)",
            "answer-bearing per 1k tokens",
        ],
        rows,
    )
    if c is not None:
        md += "\n\n**in-context (full) / baseline:** " + ", ".join(
            f"{k} {v}" for k, v in results["ratio_in_context_over_baseline"].items()
        )
    if cc is not None:
        md += "\n\n**in-context (compact) / baseline:** " + ", ".join(
            f"{k} {v}" for k, v in results["ratio_compact_over_baseline"].items()
        )
    d = results.get("dedupe")
    if d and d["questions"]:
        md += "\n\n" + markdown_table(
            ["second look-up (compact)", "tokens p50", "tokens mean", "answer-bearing, both look-ups"],
            [
                [
                    "without de-duplication",
                    d["second_lookup_tokens_without"]["median"],
                    d["second_lookup_tokens_without"]["mean"],
                    d["answer_bearing_two_lookups_without"],
                ],
                [
                    "with de-duplication",
                    d["second_lookup_tokens_with"]["median"],
                    d["second_lookup_tokens_with"]["mean"],
                    d["answer_bearing_two_lookups_with"],
                ],
            ],
        )
        md += f"\n\n({d['questions']} questions with a name run for the second look-up.)"
    if results.get("loop_legacy"):
        rows_loop = []
        for rules in ("legacy", "bounded"):
            m = results[f"loop_{rules}"]
            rows_loop.append(
                [
                    rules,
                    m["input_tokens_per_episode"]["median"],
                    m["input_tokens_per_episode"]["max"],
                    m["steps_per_episode"]["median"],
                    ", ".join(f"{k} {v}" for k, v in sorted(m["ended_by"].items())),
                ]
            )
        md += "\n\n" + markdown_table(
            [
                f"scripted get_context/search loop ({args.loop_steps} steps)",
                "input tokens/episode p50",
                "max",
                "steps p50",
                "ended by",
            ],
            rows_loop,
        )
    write_results(
        name,
        machine=machine,
        params={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        results=results,
        summary_md=md,
        notes=notes,
    )
    print(f"wrote benchmarks/results/{name}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
