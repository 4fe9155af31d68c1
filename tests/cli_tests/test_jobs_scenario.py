"""Issue 37's scenario: the three jobs through the CLI against one scripted OpenAI-compatible gateway.

New domain (bootstrap → extract → eval → optimize on 5 questions → serve), drift (one document
changed, one removed, one added, 2 questions added → a read-only check → a staged run → promote),
prompt versions (an empty version refused while serve answers → rollback). Every LLM role goes
to :class:`kitune.testing.openai_stub.StubServer`; the eval step meets a 429, a 500 and a timeout.
The README's three job sections are this test, command for command.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kitune.testing.faults import dspy_docid, request_text
from kitune.testing.openai_stub import RecordedRequest, Reply, StubServer

DOCS = {
    "curl": "curl is a tool for transferring data with URLs. curl is released under the MIT license.",
    "nano": "nano is a small text editor for the console. nano is released under the GPL-3 license.",
    "htop": "htop is an interactive process viewer. htop is written in the C language.",
    "jq": "jq is a lightweight JSON processor. jq is released under the MIT license.",
    "tmux": "tmux is a terminal multiplexer. tmux is released under the ISC license.",
    "less": "less is a pager for text files. less is maintained by Mark Nudelman.",
}
QUESTIONS = [
    ("q1", "Which license is curl released under?", "MIT", "curl"),
    ("q2", "Which license is nano released under?", "GPL-3", "nano"),
    ("q3", "Which language is htop written in?", "C", "htop"),
    ("q4", "Which license is jq released under?", "MIT", "jq"),
    ("q5", "Which license is tmux released under?", "ISC", "tmux"),
]
DESCRIPTION = {
    "domain": "Debian package descriptions",
    "summary": "One short paragraph per package.",
    "document_kinds": ["package description"],
    "entity_types": ["package", "license"],
    "predicates": ["released_under", "written_in"],
    "query_patterns": ["Which license is X released under?"],
    "date_range": "",
    "disambiguating_details": ["package name"],
}
_SENTENCE = re.compile(r"[^.]+\.")
_QUESTION = re.compile(r"Question: (?P<q>[^\n]*)")


def _write(root: Path, docs: dict[str, str], questions: list[tuple[str, str, str, str]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    with (root / "corpus.jsonl").open("w", encoding="utf-8") as fh:
        for docid, text in docs.items():
            fh.write(json.dumps({"docid": docid, "title": docid, "text": text}) + "\n")
    with (root / "questions.jsonl").open("w", encoding="utf-8") as fh:
        for qid, query, answer, doc in questions:
            fh.write(
                json.dumps(
                    {
                        "query_id": qid,
                        "query": query,
                        "answer": answer,
                        "evidence_docids": [doc],
                        "gold_docids": [doc],
                    }
                )
                + "\n"
            )
    return root


class Gateway:
    """The scripted gateway's answers by request kind (extraction, agent, reflection, description)."""

    def __init__(self) -> None:
        self.docs = dict(DOCS)
        self.gold = {q: a for _, q, a, _ in QUESTIONS}

    def facts(self, docid: str) -> list[dict[str, Any]]:
        text = self.docs.get(docid, "")
        out = []
        for sentence in (s.strip() for s in _SENTENCE.findall(text)):
            words = sentence.rstrip(".").split()
            obj = words[-2] if words[-1] == "license" else words[-1]
            out.append(
                {
                    "title": sentence,
                    "description": f"{sentence} Stated in the package description.",
                    "subject": words[0],
                    "predicate": "described_as",
                    "object": obj,
                    "evidence_span": sentence,
                    "confidence": 80,
                    "tags": ["package"],
                }
            )
        return out

    def __call__(self, request: RecordedRequest) -> Reply:
        text = request_text(request)
        if "new_instruction" in text:
            instruction = "Extract every fact of the package description, one per sentence, with its license."
            return Reply.ok(json.dumps({"new_instruction": instruction}), usage=(300, 40))
        docid = dspy_docid(request)
        if docid:
            return Reply.ok(json.dumps({"facts": self.facts(docid)}), usage=(200, 60))
        if "get_context" in text or "Question:" in text:
            messages = request.body.get("messages", [])
            m = _QUESTION.search(text)
            question = m.group("q").strip() if m else ""
            if len(messages) <= 2:
                return Reply.ok(
                    json.dumps({"tool": "get_context", "args": {"query": question}}), usage=(120, 10)
                )
            seen = " ".join(str(x.get("content", "")) for x in messages[2:])
            gold = self.gold.get(question, "")
            answer = gold if gold and gold in seen else "unknown"
            reply = {"answer": {"explanation": "from the KIs", "exact_answer": answer, "confidence": 70}}
            return Reply.ok(json.dumps(reply), usage=(150, 12))
        return Reply.ok(json.dumps(DESCRIPTION), usage=(400, 80))


def _tree_digest(folder: Path) -> str:
    """SHA-256 over every file's relative path and bytes (the served table, byte for byte)."""
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(folder)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def _drifted() -> tuple[dict[str, str], list[tuple[str, str, str, str]]]:
    """The data after the drift: curl's license changed, less removed, wget and q6, q7 added."""
    docs = dict(DOCS)
    docs["curl"] = "curl is a tool for transferring data with URLs. curl is released under the curl license."
    del docs["less"]
    docs["wget"] = "wget is a network downloader. wget is released under the GPL-3 license."
    questions = [
        *QUESTIONS,
        ("q6", "Which license is wget released under?", "GPL-3", "wget"),
        ("q7", "What is jq?", "processor", "jq"),
    ]
    return docs, questions


def _readme_block(marker: str) -> str:
    """The README's bash block holding ``marker`` (the job walk-throughs' data blocks)."""
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"README has {len(found)} bash blocks with {marker!r}"
    return found[0]


def test_readme_walkthrough_writes_the_scenario_data(tmp_path: Path) -> None:
    """The README's paste-able data blocks write, byte for byte, what the scenario below runs on."""
    import shutil
    import subprocess

    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash to run the README's blocks")
    subprocess.run([bash, "-ec", _readme_block("cat > debian/corpus.jsonl")], cwd=tmp_path, check=True)
    want = _write(tmp_path / "want", DOCS, QUESTIONS)
    for name in ("corpus.jsonl", "questions.jsonl"):
        assert (tmp_path / "debian" / name).read_bytes() == (want / name).read_bytes(), name
    subprocess.run([bash, "-ec", _readme_block("# the data changes")], cwd=tmp_path, check=True)
    want = _write(tmp_path / "want", *_drifted())
    for name in ("corpus.jsonl", "questions.jsonl"):
        assert (tmp_path / "debian" / name).read_bytes() == (want / name).read_bytes(), name
    assert sorted(p.name for p in (tmp_path / "debian").iterdir()) == ["corpus.jsonl", "questions.jsonl"]


@pytest.mark.slow
def test_three_jobs_through_one_gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    from kitune.cli import _register, app
    from kitune.cli.context_cmds import start_serving
    from kitune.config import load_config
    from kitune.server import create_app

    gateway = Gateway()
    data = _write(tmp_path / "debian", DOCS, QUESTIONS)
    cfg_path = tmp_path / "kitune.yaml"
    cfg_path.write_text(
        f"workdir: {tmp_path / 'work'}\n"
        "corpus_name: deb\n"
        "embedder: {type: hash, dim: 32}\n"
        "grading: {grader: match}\n"
        "agent: {max_steps: 4, concurrency: 1}\n"
        "extraction: {concurrency: 1}\n"
        "optimize: {seed: 0, validation_fraction: 0.4}\n"
        "lm:\n"
        "  gateway: {base_url_env: KI_GW_URL, api_key_env: KI_GW_KEY, default_model: m-small}\n"
        "  agent: {timeout_s: 1.0, num_retries: 3}\n",
        encoding="utf-8",
    )
    _register()
    runner = CliRunner()

    def kitune(*args: str) -> Any:
        return runner.invoke(app, [*args, "-c", str(cfg_path)])

    with StubServer(responder=gateway) as stub:
        monkeypatch.setenv("KI_GW_URL", stub.base_url)
        monkeypatch.setenv("KI_GW_KEY", "sk-gateway")

        # -- job 1: a new domain --------------------------------------------------------------
        r = kitune("bootstrap", "--corpus", str(data), "--no-track")
        assert r.exit_code == 0, r.output
        r = kitune("extract", "--data", str(data), "--no-progress")
        assert r.exit_code == 0, r.output
        assert re.search(r"done\s*│\s*6", r.output)
        r = kitune("status", "--json")
        status = json.loads(r.output.splitlines()[0])
        assert r.exit_code == 0 and status["status"] == "ok"
        served_table = status["table"]
        assert status["kis"] > 12  # two facts per document, plus bootstrap's description KIs

        # eval meets a 429, a 500 and a timeout on its first agent call, then answers everything
        stub.push(Reply.rate_limited(retry_after_s=0.01), Reply.server_error(500), Reply.slow(3.0))
        r = kitune("eval", "--skill", "in-context", "--data", str(data), "--no-progress")
        assert r.exit_code == 0, r.output
        run_dir = next((tmp_path / "work" / "runs").iterdir())
        usage = json.loads((run_dir / "usage.json").read_text())["agent/eval:in-context"]
        assert (usage["retries"], usage["failed_calls"], usage["timeouts"]) == (3, 3, 1)
        assert usage["billed_input_tokens"] == 120 * 5 + 150 * 5  # the rejected/abandoned calls bill 0
        assert usage["billed_output_tokens"] == 10 * 5 + 12 * 5
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["n_correct"] == 5
        r = kitune(
            "eval", "--skill", "in-context", "--data", str(data), "--no-progress", "--fail-under", "1.0"
        )
        assert r.exit_code == 0 and "reused 5 cached answer(s) of 5" in " ".join(r.output.split())

        r = kitune(
            "optimize",
            "--data",
            str(data),
            "--questions",
            "5",
            "--iterations",
            "1",
            "--programs",
            "extractor",
            "--max-metric-calls",
            "3",
            "--distractors",
            "1",
            "--no-feedback",
            "--no-progress",
        )
        assert r.exit_code == 0, r.output
        state = tmp_path / "work" / "optimize" / "optimize"
        assert (state / "fingerprint.json").is_file()

        cfg = load_config(cfg_path)
        now = [0.0]
        serving = start_serving(cfg, prompt_version=None, packaged=False, no_rewrite=True, refresh_s=1.0)
        api = TestClient(
            create_app(
                cfg,
                store=serving.served.store,
                versions=serving.served.versions,
                setting_source=serving.source,
                refresh_s=1.0,
                clock=lambda: now[0],
            )
        )
        health = api.get("/healthz").json()
        assert health["status"] == "ok" and health["table"] == served_table
        ask = {"query": "Which license is curl released under?"}
        assert any("MIT" in k["title"] for k in api.post("/api/_get_context", json=ask).json()["kis"])

        # -- job 3: drift ------------------------------------------------------------------------
        docs, questions = _drifted()  # the README's drift block writes the same files (test above)
        gateway.docs = docs
        gateway.gold.update({q: a for _, q, a, _ in questions})
        _write(data, docs, questions)
        lance = tmp_path / "work" / "lancedb" / f"{served_table}.lance"
        before = _tree_digest(lance)
        r = kitune("drift", "check", "--data", str(data), "--no-progress")
        assert r.exit_code == 0, r.output
        out = " ".join(r.output.split())
        assert "documents added │ 1: wget" in out and "documents removed │ 1: less" in out
        assert "documents changed │ 1: curl" in out and "documents unchanged │ 4" in out
        assert "questions new │ 2: q6, q7" in out and "questions removed │ 0" in out
        assert _tree_digest(lance) == before  # read-only, byte for byte

        r = kitune("drift", "run", "--data", str(data), "--no-progress")
        assert r.exit_code == 0, r.output
        staged = re.search(
            r"staged (kitune-deb-extractor) v(\d+) .*? table (\S+) with", " ".join(r.output.split())
        )
        assert staged, r.output
        name, version, table = staged.group(1), staged.group(2), staged.group(3)
        assert _tree_digest(lance) == before
        now[0] = 5.0
        assert api.get("/healthz").json()["table"] == served_table  # staged, not served

        r = kitune("prompts", "promote", name, version)
        assert r.exit_code == 0, r.output
        assert "drift fingerprint" in r.output  # the data now served is what drift compares with
        r = kitune("drift", "check", "--data", str(data), "--no-progress")
        out = " ".join(r.output.split())
        assert r.exit_code == 0 and "documents changed │ 0" in out and "questions new │ 0" in out
        now[0] = 10.0
        health = api.get("/healthz").json()
        assert health["status"] == "ok" and health["table"] == table
        ask = {"query": "Which license is curl released under?"}
        titles = [k["title"] for k in api.post("/api/_get_context", json=ask).json()["kis"]]
        assert any("curl license" in t for t in titles) and not any(
            "MIT" in t and "curl" in t for t in titles
        )
        from kitune.retrieval import create_store
        from kitune.schema import Filter
        from kitune.service.serving.prompts import table_store_cfg

        store = create_store(table_store_cfg(cfg, table))
        try:
            old = [
                k
                for k in store.iter_kis(Filter(statuses=("expired",)))
                if k.payload.properties.docid in ("curl", "less")
            ]
        finally:
            store.close()
        assert {k.payload.status_reason for k in old} == {"source_changed"}
        assert {k.payload.properties.docid for k in old} == {"curl", "less"}

        # -- job 2: prompt versions --------------------------------------------------------------
        from kitune.tracking.prompts import PromptRegistry

        empty = PromptRegistry(cfg.mlflow_uri).register(name, "Extract nothing at all from the package.")
        r = kitune("prompts", "promote", name, str(empty.version))
        assert r.exit_code == 1 and "holds 0 active KIs" in r.output and "--force" in r.output
        now[0] = 15.0
        assert api.get("/healthz").json()["table"] == table
        assert api.post("/api/_get_context", json=ask).json()["kis"]  # serve keeps answering

        r = kitune("prompts", "rollback", name)
        assert r.exit_code == 0, r.output
        # (drift check after a rollback names the changes again: tests/service_tests/test_drift.py)
        now[0] = 20.0
        assert api.get("/healthz").json()["table"] == served_table
        serving.served.store.close()
