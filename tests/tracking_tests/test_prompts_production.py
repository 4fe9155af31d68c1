"""What the loop decides is what runs (issue 12 item 9).

The packaged prompts become version 1; ``production_setting`` resolves the production prompt
versions and their KI table; ``kitune context``/``extract``/``eval`` and the HTTP server use them,
and a promote/rollback changes what they use.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, ClassVar

import pytest
import typer
from typer.testing import CliRunner

from kitune.config import KituneConfig
from kitune.errors import ConfigError, PromptNotFoundError
from kitune.programs.instructions import instruction_version, load_instruction
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.memory import MemoryStore
from kitune.service.serving.prompts import (
    describe_setting,
    parse_prompt_selection,
    production_setting,
    versioned_store_cfg,
)
from kitune.testing.lm import mock_usage_lm
from kitune.testing.store_contract import make_ki
from kitune.tracking.prompts import PACKAGED_TAG, PromptRegistry, prompt_name, register_packaged

PROGRAMS = ("extractor", "rewriter", "disambiguator")
NEW_REWRITER = "Rewrite the question into a retrieval plan. Prefer entity tags; keep dates exact."
NEW_EXTRACTOR = load_instruction("extractor").text + "\n\nDomain focus (rivers): name the county."


def _sha(program: str, text: str) -> str:
    return instruction_version(program, text).split("@", 1)[1]


@pytest.fixture(scope="module")
def blank_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An initialised empty MLflow database (its schema set-up takes seconds; copying it does not)."""
    path = tmp_path_factory.mktemp("blank") / "mlflow.db"
    assert PromptRegistry(f"sqlite:///{path}").list() == []
    return path


@pytest.fixture
def cfg(tmp_path: Path, blank_db: Path) -> KituneConfig:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copyfile(blank_db, work / "mlflow.db")
    return KituneConfig(workdir=work, corpus_name="fixture", embedder={"type": "hash", "dim": 64})


def _promote(cfg: KituneConfig, program: str, text: str) -> int:
    """What the loop does when it accepts: register the packaged baseline first, then the new text."""
    reg = PromptRegistry(cfg.mlflow_uri)
    register_packaged(reg, cfg.corpus_name, PROGRAMS)
    name = prompt_name(cfg.corpus_name, program)
    pv = reg.register(name, text, commit_message="accepted by the loop")
    reg.promote(name, pv.version)
    return pv.version


def test_packaged_prompts_become_version_1_so_rollback_has_somewhere_to_go(cfg: KituneConfig) -> None:
    reg = PromptRegistry(cfg.mlflow_uri)
    first = register_packaged(reg, "fixture", PROGRAMS)
    assert sorted(first) == sorted(PROGRAMS)
    for program in PROGRAMS:
        v1 = reg.get(prompt_name("fixture", program), "production")
        packaged = load_instruction(program)
        assert (v1.version, v1.text, v1.tags[PACKAGED_TAG]) == (1, packaged.text, packaged.version)
    assert register_packaged(reg, "fixture", PROGRAMS) == {}  # idempotent: no second version
    assert [v.version for v in reg.versions("kitune-fixture-rewriter")] == [1]
    name = "kitune-fixture-rewriter"
    reg.promote(name, reg.register(name, NEW_REWRITER).version)
    assert reg.rollback(name).text == load_instruction("rewriter").text  # back to the packaged v1
    # a prompt with versions of its own (e.g. a bootstrap draft) is left alone
    reg.register("kitune-other-extractor", NEW_EXTRACTOR)
    assert register_packaged(reg, "other", ("extractor",)) == {}
    assert reg.get("kitune-other-extractor", "latest").text == NEW_EXTRACTOR


def test_production_setting_without_a_registry_is_packaged_and_creates_nothing(tmp_path: Path) -> None:
    cfg = KituneConfig(workdir=tmp_path / "fresh", corpus_name="fixture")
    prompts, versions, store_cfg = production_setting(cfg)
    assert prompts == {p: load_instruction(p).text for p in PROGRAMS}
    sha = _sha("extractor", load_instruction("extractor").text)
    assert (
        versions["extractor"]
        == f"packaged extractor@{sha} (no production version of kitune-fixture-extractor)"
    )
    assert store_cfg.store.table == f"kis-{sha}" and cfg.store.table == "kis"
    assert not (cfg.workdir / "mlflow.db").exists()  # reading never creates the registry
    with pytest.raises(PromptNotFoundError, match="no prompt named 'kitune-fixture-rewriter'"):
        production_setting(cfg, select={"rewriter": "candidate"})


def test_production_setting_follows_promote_and_rollback(cfg: KituneConfig) -> None:
    assert _promote(cfg, "rewriter", NEW_REWRITER) == 2
    assert _promote(cfg, "extractor", NEW_EXTRACTOR) == 2
    s = production_setting(cfg)
    assert s.prompts["rewriter"] == NEW_REWRITER and s.prompts["extractor"] == NEW_EXTRACTOR
    assert s.prompts["disambiguator"] == load_instruction("disambiguator").text
    assert s.versions["rewriter"] == "kitune-fixture-rewriter v2 (production)"
    assert s.versions["disambiguator"] == "kitune-fixture-disambiguator v1 (production)"
    assert s.store_cfg.store.table == f"kis-{_sha('extractor', NEW_EXTRACTOR)}"
    assert describe_setting(s, ("extractor",)) == [
        "extractor prompt: kitune-fixture-extractor v2 (production)",
        f"KI store: lancedb table kis-{_sha('extractor', NEW_EXTRACTOR)}",
    ]
    # explicit choices: one program pinned to v1, or packaged everything
    pinned = production_setting(cfg, select=parse_prompt_selection(["extractor=1"]))
    assert pinned.prompts["extractor"] == load_instruction("extractor").text
    assert pinned.prompts["rewriter"] == NEW_REWRITER
    assert pinned.versions["extractor"] == "kitune-fixture-extractor v1 (no alias)"
    packaged = production_setting(cfg, packaged=True)
    assert packaged.prompts["rewriter"] == load_instruction("rewriter").text
    assert packaged.versions["rewriter"].endswith("(--packaged)")
    with pytest.raises(PromptNotFoundError, match="has no version 7"):
        production_setting(cfg, select={"rewriter": "7"})
    with pytest.raises(ConfigError, match="give one of them"):
        production_setting(cfg, select={"rewriter": "1"}, packaged=True)
    PromptRegistry(cfg.mlflow_uri).rollback("kitune-fixture-extractor")
    back = production_setting(cfg)
    assert back.store_cfg.store.table == f"kis-{_sha('extractor', load_instruction('extractor').text)}"


def test_parse_prompt_selection() -> None:
    assert parse_prompt_selection(["candidate", "extractor=3"]) == {
        "extractor": "3",
        "rewriter": "candidate",
        "disambiguator": "candidate",
    }
    for bad in ("3", "judge=1", "rewriter="):
        with pytest.raises(ConfigError, match="--prompt-version"):
            parse_prompt_selection([bad])


def test_versioned_store_cfg_elasticsearch_names_the_index(cfg: KituneConfig) -> None:
    es = KituneConfig(workdir=cfg.workdir, store={"type": "elasticsearch"})
    out = versioned_store_cfg(es, "extractor@0a1b2c3d")
    assert out.store.index == "kitune-kis-0a1b2c3d" and es.store.index == "kitune-kis"


# -- done-when (g): after a promotion, get_context and extract use the promoted versions -------------
@pytest.fixture
def cli(cfg: KituneConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    import kitune.lm as lm_mod
    import kitune.retrieval as retrieval
    import kitune.service.serving.context as context_mod
    from kitune.cli import context_cmds, eval_cmds, extract_cmds

    monkeypatch.setenv("COLUMNS", "250")
    config = tmp_path / "kitune.yaml"
    config.write_text(
        f"workdir: {cfg.workdir}\ncorpus_name: fixture\nembedder:\n  type: hash\n  dim: 64\n",
        encoding="utf-8",
    )
    stores: dict[str, MemoryStore] = {}
    opened: list[str] = []

    def create_store(c: KituneConfig, embedder: Any = None) -> MemoryStore:
        opened.append(c.store.table)
        return stores.setdefault(c.store.table, MemoryStore(embedder=HashEmbedder(dim=64)))

    monkeypatch.setattr(retrieval, "create_store", create_store)
    monkeypatch.setattr(lm_mod, "build_lm", lambda cfg, role, ledger=None: mock_usage_lm("{}", ledger=ledger))
    seen: dict[str, Any] = {}
    real_get_context = context_mod.get_context

    def spy_get_context(query: str, **kw: Any) -> Any:
        seen["rewriter"] = kw["rewriter"].planner.signature.instructions if kw.get("rewriter") else None
        return real_get_context(query, **kw)

    monkeypatch.setattr(context_mod, "get_context", spy_get_context)
    app = typer.Typer()
    context_cmds.register(app)
    extract_cmds.register(app)
    eval_cmds.register(app)
    return {"app": app, "config": config, "stores": stores, "opened": opened, "seen": seen}


def test_context_and_extract_use_the_promoted_versions(
    cfg: KituneConfig, cli: dict[str, Any], fixture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kitune.service.pipelines.extraction as extraction

    packaged_table = f"kis-{_sha('extractor', load_instruction('extractor').text)}"
    promoted_table = f"kis-{_sha('extractor', NEW_EXTRACTOR)}"
    extracted: dict[str, Any] = {}

    class _Report:
        failed: ClassVar[dict[str, str]] = {}

        def summary_rows(self) -> list[tuple[str, str]]:
            return [("documents", "2")]

    def fake_extract_corpus(docs: Any, store: Any, extractor: Any, **kw: Any) -> _Report:
        extracted["instruction"] = extractor.extract.signature.instructions
        extracted["table"] = cli["opened"][-1]
        extracted["state"] = kw["state_path"].name
        store.upsert([make_ki("LaHave River", "Lunenburg County", docid="100818", predicate="located_in")])
        return _Report()

    monkeypatch.setattr(extraction, "extract_corpus", fake_extract_corpus)
    run = CliRunner().invoke
    args = ["-c", str(cli["config"])]
    # before any promotion: packaged prompts, the packaged extractor's table
    r = run(cli["app"], ["extract", "--data", str(fixture_dir), "--limit", "2", "--no-progress", *args])
    assert r.exit_code == 0, r.output
    assert (
        extracted["instruction"] == load_instruction("extractor").text
        and extracted["table"] == packaged_table
    )
    assert f"KI store: lancedb table {packaged_table}" in r.output
    # the loop accepts a new extractor and a new rewriter
    _promote(cfg, "extractor", NEW_EXTRACTOR)
    _promote(cfg, "rewriter", NEW_REWRITER)
    r = run(cli["app"], ["extract", "--data", str(fixture_dir), "--limit", "2", "--no-progress", *args])
    assert r.exit_code == 0, r.output
    assert extracted["instruction"] == NEW_EXTRACTOR and extracted["table"] == promoted_table
    assert _sha("extractor", NEW_EXTRACTOR) in extracted["state"]  # its own resume file too
    assert "extractor prompt: kitune-fixture-extractor v2 (production)" in r.output
    r = run(cli["app"], ["context", "Where is the LaHave River?", "--json", *args])
    assert r.exit_code == 0, r.output
    assert cli["seen"]["rewriter"] == NEW_REWRITER and cli["opened"][-1] == promoted_table
    assert json.loads(r.stdout)["kis"][0]["evidence_doc_ids"] == ["100818"]  # the promoted table's KIs
    assert "rewriter prompt: kitune-fixture-rewriter v2 (production)" in r.stderr
    # --packaged / --prompt-version override; rollback changes what runs next
    r = run(cli["app"], ["context", "LaHave", "--packaged", *args])
    assert r.exit_code == 0 and cli["seen"]["rewriter"] == load_instruction("rewriter").text
    assert cli["opened"][-1] == packaged_table
    r = run(cli["app"], ["context", "LaHave", "--prompt-version", "rewriter=1", *args])
    assert r.exit_code == 0 and cli["seen"]["rewriter"] == load_instruction("rewriter").text
    assert cli["opened"][-1] == promoted_table
    PromptRegistry(cfg.mlflow_uri).rollback("kitune-fixture-rewriter")
    r = run(cli["app"], ["context", "LaHave", *args])
    assert r.exit_code == 0 and cli["seen"]["rewriter"] == load_instruction("rewriter").text
    bad = run(cli["app"], ["context", "LaHave", "--prompt-version", "rewriter=9", *args])
    assert bad.exit_code == 2 and "has no version 9" in bad.output


def test_eval_in_context_uses_the_promoted_table_and_records_it(
    cfg: KituneConfig, cli: dict[str, Any], fixture_dir: Path
) -> None:
    from kitune.service.pipelines.evaluation import run_eval
    from kitune.testing.chat import ScriptedChatModel

    _promote(cfg, "extractor", NEW_EXTRACTOR)
    promoted_table = f"kis-{_sha('extractor', NEW_EXTRACTOR)}"
    cli["stores"][promoted_table] = store = MemoryStore(embedder=HashEmbedder(dim=64))
    store.upsert([make_ki("LaHave River", "Lunenburg County", docid="100818", predicate="located_in")])
    model = ScriptedChatModel(
        [
            json.dumps({"tool": "get_context", "args": {"query": "LaHave River"}}),
            json.dumps({"answer": {"explanation": "", "exact_answer": "Lunenburg", "confidence": 60}}),
        ]
    )
    shown: list[dict[str, str]] = []

    class NoCorpus:  # the raw-search fallback is never reached here
        def count(self) -> int:
            return 0

    res = run_eval(
        cfg,
        skill="in-context",
        data_dir=fixture_dir,
        limit=1,
        progress=False,
        use_judge=False,
        chat_model=model,
        corpus_store=NoCorpus(),
        on_setting=shown.append,  # type: ignore[arg-type]
    )
    assert res.traces[0].doc_ids_seen == ["100818"]  # KIs came from the promoted extractor's table
    assert res.prompt_versions == {
        "extractor": "kitune-fixture-extractor v2 (production)",
        "store": promoted_table,
    }
    assert shown == [res.prompt_versions]
    assert json.loads((res.run_dir / "run.json").read_text())["prompt_versions"] == res.prompt_versions
    assert res.run_dir.name == f"in-context-fixture-all-n1-{_sha('extractor', NEW_EXTRACTOR)}"


def test_server_follows_a_promotion_without_restart(cfg: KituneConfig) -> None:
    from fastapi.testclient import TestClient

    from kitune.server import create_app
    from kitune.service.serving.prompts import setting_summary
    from kitune.service.serving.setting import ServedRequestLog, ServedSetting
    from kitune.testing.tracking import RecordingTracker

    stores = {
        "old": MemoryStore(embedder=HashEmbedder(dim=64)),
        "new": MemoryStore(embedder=HashEmbedder(dim=64)),
    }
    stores["new"].upsert(
        [make_ki("LaHave River", "Lunenburg County", docid="100818", predicate="located_in")]
    )
    now = [0.0]
    calls: list[dict[str, str]] = []

    def source(current: Any) -> ServedSetting | None:
        calls.append(dict(current))
        served = {
            "extractor": production_setting(cfg).versions["extractor"],
            **{"store": setting_summary(production_setting(cfg))["store"]},
        }
        if served == dict(current):
            return None
        return ServedSetting(store=stores["new"], rewriter=None, versions=served)

    first = production_setting(cfg)
    versions = {"extractor": first.versions["extractor"], "store": first.store_cfg.store.table}
    tracker = RecordingTracker()
    log = ServedRequestLog(tracker)
    app = create_app(
        cfg,
        store=stores["old"],
        versions=versions,
        setting_source=source,
        refresh_s=30,
        clock=lambda: now[0],
        request_log=log,
    )
    client = TestClient(app)
    assert client.get("/healthz").json()["serving"] == versions
    ask = {"query": "Where is the LaHave River?"}
    assert client.post("/api/_get_context", json=ask).json()["kis"] == []
    assert calls == []  # no promotion, within refresh_s: the registry is not asked
    _promote(cfg, "extractor", NEW_EXTRACTOR)
    # issue 40: the very next request is answered by the promoted version (the promotion rewrote
    # the registry's production stamp; the clock has not moved, no refresh tick was needed)
    kis = client.post("/api/_get_context", json=ask).json()["kis"]
    assert [k["evidence_doc_ids"] for k in kis] == [["100818"]]
    assert len(calls) == 1
    promoted = "kitune-fixture-extractor v2 (production)"
    assert client.get("/healthz").json()["serving"]["extractor"] == promoted
    client.post("/api/_get_context", json=ask)
    assert len(calls) == 1  # stamp unchanged, within refresh_s: not asked again
    now[0] = 31.0
    client.post("/api/_get_context", json=ask)
    assert len(calls) == 2  # asked again after refresh_s; unchanged → same store kept
    # every served request is a trace in the tracking store naming the versions that answered it
    log.close()
    traces = tracker.by_name("serve").episodes
    assert [t.tags["kitune.prompt.extractor"] for t in traces] == [
        versions["extractor"],
        promoted,
        promoted,
        promoted,
    ]
    assert {t.tags["kitune.endpoint"] for t in traces} == {"http /api/_get_context"}
    assert [t.inputs["query"] for t in traces] == [ask["query"]] * 4
    assert traces[1].tags["kitune.store"] != traces[0].tags["kitune.store"] == versions["store"]
    assert all(t.ok and t.tags["kitune.status"] == "ok" for t in traces)


def test_prompts_promote_and_rollback_say_what_now_runs(cfg: KituneConfig, cli: dict[str, Any]) -> None:
    from kitune.cli import loop_cmds

    app = typer.Typer()
    loop_cmds.register(app)
    _promote(cfg, "rewriter", NEW_REWRITER)
    args = ["-c", str(cli["config"])]
    r = CliRunner().invoke(app, ["prompts", "rollback", "kitune-fixture-rewriter", *args])
    assert r.exit_code == 0, r.output
    assert (
        "now used by serve/context/extract/eval: rewriter prompt: kitune-fixture-rewriter v1 (production)"
        in (r.output)
    )
    r = CliRunner().invoke(app, ["prompts", "promote", "kitune-fixture-rewriter", "2", *args])
    assert "rewriter prompt: kitune-fixture-rewriter v2 (production)" in r.output
    r = CliRunner().invoke(app, ["prompts", "promote", "kitune-fixture-extractor", "1", *args])
    sha = _sha("extractor", load_instruction("extractor").text)
    # issue 37: its table is empty, so the promotion is refused (exit 1) and names the override
    assert r.exit_code == 1 and f"its KI table kis-{sha} holds 0 active KIs" in r.output
    assert "--force" in r.output
    r = CliRunner().invoke(app, ["prompts", "promote", "kitune-fixture-extractor", "1", "--force", *args])
    assert r.exit_code == 0, r.output
    assert f"KI store: lancedb table kis-{sha}" in r.output and "`kitune extract` fills it" in r.output


def test_versioned_store_cfg_keeps_an_explicit_workdir_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `KITUNE_WORKDIR=/tmp/a kitune demo --workdir /tmp/b`: the KI table must follow /tmp/b
    # like the corpus store, runs and MLflow do (newcomer check, issue 25).
    from kitune.config import load_config
    from kitune.retrieval import lance_path

    monkeypatch.setenv("KITUNE_WORKDIR", str(tmp_path / "a"))
    explicit = load_config(overrides={"workdir": str(tmp_path / "b")})
    assert explicit.workdir == tmp_path / "b"
    out = versioned_store_cfg(explicit, "extractor@0a1b2c3d")
    assert out.workdir == tmp_path / "b"
    assert out.store.table == "kis-0a1b2c3d"
    assert lance_path(out) == tmp_path / "b" / "lancedb"
    assert out.mlflow_uri == explicit.mlflow_uri
    # with no explicit workdir, the environment still decides
    from_env = versioned_store_cfg(load_config(), "extractor@0a1b2c3d")
    assert from_env.workdir == tmp_path / "a"
