
import pytest

from kitune.config import load_config, mask_secrets
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
        "lm:\n  gateway:\n    base_url_env: GW_URL\n    api_key_env: GW_KEY\n    default_model: openai/cheap\n"
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
    with pytest.raises(ConfigError, match="not valid"):
        load_config(bad)


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
