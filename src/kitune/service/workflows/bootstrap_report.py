"""The bootstrap's result and its report: :class:`BootstrapResult`, ``report.md``/``report.json``.

:func:`write_report` writes ``report.md`` (:func:`render_markdown`), ``report.json``
(:meth:`BootstrapResult.to_dict`), ``description.json``, ``extractor.txt`` and ``extractor.diff``;
:func:`ledger_rows` and :func:`ledger_totals` give the report's token table; :func:`log_report`
logs the description, the draft, its diff, the report and the run's metrics to the tracking run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kitune.data.sampling import SampledDoc
from kitune.ki import KI
from kitune.programs.domain_describer import DescriptionResult
from kitune.programs.extractor_drafter import DraftedInstruction
from kitune.service.workflows.bootstrap_kis import cut_text
from kitune.usage import TokenLedger

if TYPE_CHECKING:
    from kitune.optimizers.protocols import Tracker

__all__ = [
    "BootstrapResult",
    "ledger_rows",
    "ledger_totals",
    "log_report",
    "render_markdown",
    "write_report",
]


@dataclass(frozen=True)
class BootstrapResult:
    """Everything one bootstrap produced (also written to ``report.json``)."""

    corpus_name: str
    corpus_path: str
    kind: str
    """``prose`` or ``records``."""
    n_documents: int
    seed: int
    sample: tuple[SampledDoc, ...]
    description: DescriptionResult
    draft: DraftedInstruction
    pin_types: tuple[str, ...]
    questions_path: str = ""
    n_questions: int = 0
    prompt_name: str = ""
    prompt_version: int | None = None
    """Registry version of the draft; None when not registered (see ``errors``)."""
    prompt_aliases: tuple[str, ...] = ()
    prompt_reused: bool = False
    """True when the same text was already registered (no new version was added)."""
    kis: tuple[KI, ...] = ()
    """Source-description KIs that passed the KI rules."""
    kis_written: int = 0
    errors: dict[str, str] = field(default_factory=dict)
    """What failed without stopping the run: ``registry``, ``ki:<predicate>``, ``store:<id>``."""
    tokens: tuple[dict[str, Any], ...] = ()
    """Ledger rows (role, stage, calls, input_tokens, output_tokens, …) of this run."""
    run_id: str | None = None
    out_dir: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (the content of ``report.json``)."""
        return {
            "corpus_name": self.corpus_name,
            "corpus_path": self.corpus_path,
            "kind": self.kind,
            "n_documents": self.n_documents,
            "seed": self.seed,
            "questions": {"path": self.questions_path, "count": self.n_questions},
            "sample": [{"docid": s.docid, "reason": s.reason, "why": s.why()} for s in self.sample],
            "description": self.description.description.model_dump(mode="json"),
            "description_status": self.description.status,
            "description_error": self.description.error,
            "lm_calls": self.description.lm_calls,
            "draft": {
                "version": self.draft.version,
                "neutral_version": self.draft.neutral_version,
                "entity_types": list(self.draft.entity_types),
                "pin_types": list(self.pin_types),
                "pins_restored": list(self.draft.pins_restored),
                "diff": self.draft.diff,
            },
            "prompt": {
                "name": self.prompt_name,
                "version": self.prompt_version,
                "aliases": list(self.prompt_aliases),
                "reused": self.prompt_reused,
            },
            "kis": [
                {"id": k.id, "title": k.title, "predicate": k.payload.properties.predicate, "tags": k.tags}
                for k in self.kis
            ],
            "kis_written": self.kis_written,
            "errors": dict(self.errors),
            "tokens": list(self.tokens),
            "run_id": self.run_id,
        }


def ledger_rows(ledger: TokenLedger, marker: int) -> list[dict[str, Any]]:
    """Ledger rows (role, stage, calls, tokens, …) of the records added since ``marker`` (a snapshot)."""
    sub = TokenLedger()
    for rec in ledger.since(marker):
        sub.record(rec)
    return sub.to_rows()


def ledger_totals(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Sum ``calls``/``input_tokens``/``output_tokens`` over ledger rows."""
    keys = ("calls", "input_tokens", "output_tokens")
    return {k: sum(int(r.get(k, 0)) for r in rows) for k in keys}


def write_report(res: BootstrapResult, out: Path, docs: dict[str, Any]) -> dict[str, Path]:
    """Write ``report.md``, ``report.json``, ``description.json``, ``extractor.txt``, ``extractor.diff``.

    Returns:
        File name → path written.
    """
    out.mkdir(parents=True, exist_ok=True)
    data = res.to_dict()
    files = {
        "report.json": out / "report.json",
        "report.md": out / "report.md",
        "description.json": out / "description.json",
        "extractor.txt": out / "extractor.txt",
        "extractor.diff": out / "extractor.diff",
    }
    files["report.json"].write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    files["description.json"].write_text(
        json.dumps(data["description"], indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    files["extractor.txt"].write_text(res.draft.text + "\n", encoding="utf-8")
    files["extractor.diff"].write_text(res.draft.diff, encoding="utf-8")
    files["report.md"].write_text(render_markdown(res, docs), encoding="utf-8")
    return files


def log_report(tracker: Tracker, res: BootstrapResult, files: dict[str, Path]) -> None:
    """Log one bootstrap to the active tracking run of ``tracker``.

    Artifacts: ``bootstrap/description.json``, ``prompts/extractor.txt``, ``bootstrap/extractor.diff``
    and the ``report.md``/``report.json`` of ``files`` (from :func:`write_report`) under ``bootstrap``.
    Metrics: ``sample_docs``, ``source_kis_written``, ``lm_calls``, ``input_tokens``,
    ``output_tokens`` (this run's ledger rows) and ``description_ok`` (1.0 or 0.0).
    """
    tracker.log_dict(res.description.description.model_dump(mode="json"), "bootstrap/description.json")
    tracker.log_text(res.draft.text, "prompts/extractor.txt")
    tracker.log_text(res.draft.diff or "(no change)\n", "bootstrap/extractor.diff")
    tracker.log_artifact(files["report.md"], "bootstrap")
    tracker.log_artifact(files["report.json"], "bootstrap")
    totals = ledger_totals(res.tokens)
    tracker.log_metrics(
        {
            "sample_docs": float(len(res.sample)),
            "source_kis_written": float(res.kis_written),
            "lm_calls": float(totals["calls"]),
            "input_tokens": float(totals["input_tokens"]),
            "output_tokens": float(totals["output_tokens"]),
            "description_ok": 1.0 if res.description.status == "ok" else 0.0,
        }
    )


def render_markdown(res: BootstrapResult, docs: dict[str, Any]) -> str:
    """The human-readable report: sample, description, diff, KIs, tokens, errors."""
    d = res.description.description
    lines = [
        f"# Bootstrap of `{res.corpus_name}`",
        "",
        f"- corpus: `{res.corpus_path}` ({res.kind}, {res.n_documents} documents)",
        f"- questions: `{res.questions_path or 'none'}` ({res.n_questions})",
        f"- seed: {res.seed}; sample: {len(res.sample)} documents",
        f"- description: {res.description.status} ({res.description.lm_calls} LM call(s))"
        + (f" — {res.description.error}" if res.description.error else ""),
        f"- draft: `{res.draft.version}` (from `{res.draft.neutral_version}`); pinned types: "
        f"{', '.join(res.pin_types) or 'none'}; restored: {', '.join(res.draft.pins_restored) or 'none'}",
        f"- prompt registry: `{res.prompt_name}` v{res.prompt_version} "
        f"aliases {', '.join(res.prompt_aliases) or '-'}"
        + (" (same text already registered: reused)" if res.prompt_reused else ""),
        f"- source-description KIs written: {res.kis_written}/{len(res.kis)}",
        f"- tracking run: {res.run_id or 'none'}",
        "",
        "## Sample",
        "",
        "| docid | title | why |",
        "|---|---|---|",
    ]
    for s in res.sample:
        title = getattr(docs.get(s.docid), "title", "") or ""
        lines.append(f"| {s.docid} | {cut_text(title, 60).replace('|', '/')} | {s.why().replace('|', '/')} |")
    lines += [
        "",
        "## Description",
        "",
        "```json",
        json.dumps(d.model_dump(mode="json"), indent=2, ensure_ascii=False),
    ]
    lines += ["```", "", "## Extractor draft (diff from the neutral instruction)", "", "```diff"]
    lines += [res.draft.diff.rstrip("\n") or "(no change)", "```", "", "## Source-description KIs", ""]
    lines += [f"- `{k.id}` {k.title}" for k in res.kis] or ["(none)"]
    lines += [
        "",
        "## Tokens",
        "",
        "| role | stage | calls | input tokens | output tokens |",
        "|---|---|---|---|---|",
    ]
    for row in res.tokens:
        lines.append(
            f"| {row['role']} | {row['stage']} | {row['calls']} "
            f"| {row['input_tokens']} | {row['output_tokens']} |"
        )
    if res.errors:
        lines += ["", "## Recorded failures", ""]
        lines += [f"- {k}: {v}" for k, v in sorted(res.errors.items())]
    return "\n".join(lines) + "\n"
