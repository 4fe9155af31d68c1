import pytest

from kitune.config import load_config, mask_secrets, with_overrides
from kitune.errors import ConfigError


def test_defaults_use_local_model_and_sqlite_tracking(tmp_path):
    cfg = load_config()
    assert cfg.uses_local_model("extract")
    assert cfg.agent.max_steps == 43
    assert cfg.extraction.max_facts_per_doc == 15
    assert cfg.mlflow_uri.startswith("sqlite:///") and cfg.mlflow_uri.endswith("mlflow.db")


def test_yaml_file_env_and_overrides_precedence(tmp_path, monkeypatch):
    f = tmp_path / "k.yaml"
    f.write_text(
        "lm:\n  gateway:\n    base_url_env: GW_URL\n    api_key_env: GW_KEY\n"
        "    default_model: openai/cheap\n"
        "  rewrite:\n    model: openai/strong\nagent:\n  max_steps: 10\n"
    )
    monkeypatch.setenv("KITUNE_AGENT__MAX_STEPS", "12")
    cfg = load_config(f, {"retrieval.rrf_k": 30})
    assert cfg.lm.rewrite.model == "openai/strong"
    assert cfg.lm.gateway.default_model == "openai/cheap"
    assert not cfg.uses_local_model("extract")
    assert cfg.agent.max_steps == 12  # env beats file
    assert cfg.retrieval.rrf_k == 30  # overrides beat everything


def test_toml_file(tmp_path):
    f = tmp_path / "k.toml"
    f.write_text('[lm.extract]\nmodel = "openai/x"\n[agent]\nmax_steps = 5\n')
    cfg = load_config(f)
    assert cfg.lm.extract.model == "openai/x" and cfg.agent.max_steps == 5


def test_literal_secret_in_file_is_refused(tmp_path):
    f = tmp_path / "k.yaml"
    f.write_text("lm:\n  gateway:\n    api_key: sk-123\n")
    with pytest.raises(ConfigError, match=r"lm\.gateway\.api_key.*environment variable"):
        load_config(f)


def test_invalid_value_names_the_setting(tmp_path):
    f = tmp_path / "k.yaml"
    f.write_text("agent:\n  max_steps: 0\n")
    with pytest.raises(ConfigError, match=r"agent\.max_steps"):
        load_config(f)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(bad)
    listed = tmp_path / "list.yaml"
    listed.write_text("- workdir\n- x\n")
    with pytest.raises(ConfigError, match="must hold a mapping at the top level"):
        load_config(listed)
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("workdir = [\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_config(bad_toml)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty).corpus_name == "corpus"  # an empty file is the defaults


def test_mask_secrets_shows_env_values_masked(monkeypatch):
    monkeypatch.setenv("GW_URL", "http://gw.local/v1")
    monkeypatch.setenv("GW_KEY", "sk-abcdefgh12345678")
    cfg = load_config(overrides={"lm.gateway.base_url_env": "GW_URL", "lm.gateway.api_key_env": "GW_KEY"})
    shown = mask_secrets(cfg)["lm"]["gateway"]
    assert shown["base_url_value"] == "http://gw.local/v1"
    assert shown["api_key_value"] == "…5678"
    assert "sk-abcdefgh12345678" not in repr(mask_secrets(cfg))
    monkeypatch.delenv("GW_KEY")
    assert mask_secrets(cfg)["lm"]["gateway"]["api_key_value"] == "<unset>"


def test_store_override_without_type_means_the_embedded_store(monkeypatch):
    monkeypatch.setenv("KITUNE_STORE__TABLE", "kis-abc")
    cfg = load_config()
    assert cfg.store.type == "lancedb" and cfg.store.table == "kis-abc"
    cfg2 = load_config(overrides={"store.table": "t2"})
    assert cfg2.store.table == "t2"


def test_overrides_beat_the_environment(monkeypatch):
    monkeypatch.setenv("KITUNE_AGENT__MAX_STEPS", "12")
    assert load_config(overrides={"agent.max_steps": 3}).agent.max_steps == 3
    assert load_config().agent.max_steps == 12


def test_naming_a_roles_model_keeps_that_roles_other_defaults(tmp_path, monkeypatch):
    # Issue 16: `reflection: {model: x}` used to reset reflection to temperature 0.0 / 1024 tokens.
    f = tmp_path / "k.yaml"
    f.write_text(
        "lm:\n  reflection:\n    model: openai/strong\n"
        "  judge:\n    model: openai/cheap\n    temperature: 0.3\n"
        "  extract:\n    model: openai/cheap\n"
    )
    monkeypatch.setenv("KITUNE_LM__AGENT__MODEL", "openai/agent")
    cfg = load_config(f, {"lm.rewrite.model": "openai/rw"})
    assert (cfg.lm.reflection.model, cfg.lm.reflection.temperature, cfg.lm.reflection.max_tokens) == (
        "openai/strong",
        1.0,
        4096,
    )
    assert (cfg.lm.judge.temperature, cfg.lm.judge.max_tokens) == (0.3, 256)  # explicit value kept
    assert cfg.lm.extract.max_tokens == 2048
    assert (cfg.lm.agent.model, cfg.lm.agent.max_tokens) == ("openai/agent", 512)
    assert (cfg.lm.rewrite.model, cfg.lm.rewrite.max_tokens) == ("openai/rw", 512)


def test_role_object_without_those_fields_gets_the_role_defaults():
    from kitune.config import LMConfig, LMRoleConfig

    lm = LMConfig(reflection=LMRoleConfig(model="m"), judge=LMRoleConfig(model="j", max_tokens=99))
    assert (lm.reflection.temperature, lm.reflection.max_tokens) == (1.0, 4096)
    assert lm.judge.max_tokens == 99


@pytest.mark.parametrize(
    ("setting", "pasted"),
    [
        ("lm.gateway.api_key_env", "sk-live-abcdef1234567890"),
        ("lm.gateway.base_url_env", "https://gw.example.com/v1"),
        ("lm.judge.api_key_env", "sk-live-abcdef1234567890"),
        ("lm.agent.api_base_env", "http://127.0.0.1:4000"),
        ("store.api_key_env", "abc-def=="),
    ],
)
def test_a_value_pasted_into_an_env_field_is_refused_and_never_echoed(tmp_path, setting, pasted):
    section, *middle, leaf = setting.split(".")
    body = f"{section}:\n" + ("  type: elasticsearch\n" if section == "store" else "")
    indent = "  "
    for part in middle:
        body += f"{indent}{part}:\n"
        indent += "  "
    body += f'{indent}{leaf}: "{pasted}"\n'
    f = tmp_path / "k.yaml"
    f.write_text(body)
    with pytest.raises(ConfigError) as info:
        load_config(f)
    msg = str(info.value)
    assert setting in msg and "name of an environment variable" in msg
    assert pasted not in msg and pasted not in repr(info.value.__cause__)
    assert "Value error" not in msg


def test_a_value_pasted_into_an_env_field_via_the_environment_is_refused(monkeypatch):
    monkeypatch.setenv("KITUNE_LM__GATEWAY__API_KEY_ENV", "sk-live-zzzz99999999")
    with pytest.raises(ConfigError) as info:
        load_config()
    assert "lm.gateway.api_key_env" in str(info.value) and "sk-live" not in str(info.value)


def test_config_show_never_prints_a_pasted_key(tmp_path):
    from typer.testing import CliRunner

    from kitune.cli import _register, app

    _register()
    f = tmp_path / "k.yaml"
    f.write_text('lm:\n  gateway:\n    api_key_env: "sk-live-abcdef1234567890"\n')
    result = CliRunner().invoke(app, ["config", "show", "--config", str(f)])
    assert result.exit_code == 2
    assert "sk-live" not in result.output and "lm.gateway.api_key_env" in result.output


def test_switching_the_store_type_by_override_drops_the_other_backends_keys(tmp_path):
    # issue 25: {"store.type": "elasticsearch"} failed on the embedded store's own keys
    from kitune.config import ElasticsearchStoreConfig, LanceStoreConfig

    es = load_config(overrides={"store.type": "elasticsearch"}).store
    assert es == ElasticsearchStoreConfig()  # the Elasticsearch defaults, nothing carried over
    path = tmp_path / "kitune.yaml"
    path.write_text(
        f"store: {{type: lancedb, path: {tmp_path / 'lance'}, table: firms, write_batch_size: 64}}\n",
        encoding="utf-8",
    )
    chosen = load_config(path, overrides={"store.type": "elasticsearch", "store.index": "firms-kis"}).store
    assert chosen == ElasticsearchStoreConfig(index="firms-kis")
    back = load_config(overrides={"store.type": "elasticsearch", "store.index": "x"})
    from kitune.config import with_overrides

    assert with_overrides(back, {"store.type": "lancedb"}).store == LanceStoreConfig()
    # the same type keeps the file's keys; a key the chosen backend does not have is named
    same = load_config(path, overrides={"store.type": "lancedb", "store.table": "t2"}).store
    assert (same.table, same.write_batch_size) == ("t2", 64)
    with pytest.raises(ConfigError) as e:
        load_config(path, overrides={"store.type": "elasticsearch", "store.table": "firms"})
    assert str(e.value) == "invalid configuration: store.table: Extra inputs are not permitted"


def test_overrides_keep_unset_settings_unset_so_concurrency_follows_the_slots(tmp_path):
    # Issue 22: any override (--workdir, --record, a loop knob) re-validated the whole dump, so every
    # setting counted as set and concurrency_for fell back to 4/2 instead of the server's slots.
    f = tmp_path / "k.yaml"
    f.write_text("lm:\n  local:\n    parallel: 6\n  extract:\n    max_tokens: 700\n")
    cfg = load_config(f, {"workdir": str(tmp_path / "w")})
    assert (
        cfg.concurrency_for("extraction"),
        cfg.concurrency_for("agent"),
        cfg.concurrency_for("judge"),
    ) == (6, 6, 6)
    knob = with_overrides(cfg, {"retrieval.rrf_k": 30})
    assert knob.concurrency_for("agent") == 6 and knob.retrieval.rrf_k == 30
    assert knob.lm.extract.max_tokens == 700 and knob.lm.reflection.temperature == 1.0
    assert knob.workdir == tmp_path / "w"
    pinned = with_overrides(knob, {"agent.concurrency": 2})
    assert pinned.concurrency_for("agent") == 2 and pinned.concurrency_for("extraction") == 6
    assert with_overrides(pinned, {"retrieval.rrf_k": 10}).concurrency_for("agent") == 2  # set stays set
