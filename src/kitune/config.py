"""Configuration: pydantic models loaded from a YAML/TOML file plus environment variables.

Precedence, lowest to highest: field defaults → the config file → ``KITUNE_*`` environment
variables (nested with ``__``, e.g. ``KITUNE_LM__EXTRACT__MODEL=openai/gpt-4o-mini``) →
explicit ``overrides`` passed to :func:`load_config`.

Secrets (API keys) never live in the file: the file names the *environment variable* that holds
a key (``api_key_env``), and :func:`load_config` refuses a file that contains a literal key.

LLM roles: ``extract``, ``rewrite``, ``agent``, ``judge`` and ``reflection`` (the optimisers'
proposer). Each names its own model; all share one OpenAI-compatible gateway (base URL + key)
when ``lm.gateway`` is set. When no role has a model and no gateway is configured, kitune uses
the embedded local model (llama.cpp), see :class:`LocalModelConfig`.
"""

from __future__ import annotations

import contextvars
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

from kitune.errors import ConfigError

__all__ = [
    "ROLES",
    "STORE_SECTIONS",
    "AgentConfig",
    "ElasticsearchStoreConfig",
    "EmbedderConfig",
    "ExtractionConfig",
    "GatewayConfig",
    "GradingConfig",
    "KituneConfig",
    "LMConfig",
    "LMRoleConfig",
    "LanceStoreConfig",
    "LifecycleConfig",
    "LocalModelConfig",
    "MemoryStoreConfig",
    "OptimizeConfig",
    "ProposalKindName",
    "RetrievalConfig",
    "ReviewConfig",
    "Role",
    "StoreConfig",
    "StoreSection",
    "TrackingConfig",
    "load_config",
    "mask_secrets",
    "register_store_section",
    "with_overrides",
]

Role = Literal["extract", "rewrite", "agent", "judge", "reflection"]
ROLES: tuple[Role, ...] = ("extract", "rewrite", "agent", "judge", "reflection")

_IGNORE_ENV: contextvars.ContextVar[bool] = contextvars.ContextVar("kitune_config_ignore_env", default=False)

_SECRET_KEYS = {"api_key", "apikey", "password", "token", "secret", "bearer_token"}

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _env_name(value: str | None, info: ValidationInfo) -> str | None:
    """Refuse an ``*_env`` value that is not an environment-variable name, without echoing it.

    A key or URL pasted where the *name* of a variable belongs would otherwise be printed by
    ``kitune config show`` and quoted in "export <value>=..." advice.
    """
    if value is None or _ENV_NAME.fullmatch(value):
        return value
    # PydanticCustomError: the message as written, without pydantic's "Value error, " prefix.
    raise PydanticCustomError(
        "env_var_name",
        f"{info.field_name} must be the name of an environment variable (letters, digits and _, e.g. "
        "KITUNE_GATEWAY_KEY), not the key or URL itself (the value given is not shown): export the value in "
        "a variable and put that variable's name here",
    )


_WORK_ROLE: dict[str, Role] = {
    "extraction": "extract",
    "agent": "agent",
    "judge": "judge",
    "optimizer": "agent",
}
"""The LM role whose model does each kind of concurrent work (``KituneConfig.concurrency_for``)."""


class _Section(BaseModel):
    # hide_input_in_errors: a validation error never repeats a value (it may be a pasted key).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, hide_input_in_errors=True)


class LMRoleConfig(_Section):
    """One LLM role (extract, rewrite, agent, judge or reflection)."""

    model: str | None = Field(
        default=None,
        description="LiteLLM model string, e.g. 'openai/gpt-4o-mini'. None: the gateway's "
        "default_model, else the embedded local model.",
    )
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="Sampling temperature.")
    max_tokens: int = Field(default=1024, ge=1, le=200_000, description="Max output tokens per call.")
    timeout_s: float = Field(
        default=120.0, gt=0, description="Per-call timeout in seconds; actually enforced."
    )
    num_retries: int = Field(default=3, ge=0, le=10, description="Bounded retries for 429/5xx/timeouts.")
    api_base_env: str | None = Field(
        default=None, description="Env var holding this role's base URL (overrides the gateway's)."
    )
    api_key_env: str | None = Field(
        default=None, description="Env var holding this role's API key (overrides the gateway's)."
    )

    _check_env_names = field_validator("api_base_env", "api_key_env")(_env_name)


class GatewayConfig(_Section):
    """One OpenAI-compatible gateway shared by every role (a LiteLLM proxy, OpenRouter, vLLM …)."""

    base_url_env: str | None = Field(
        default=None, description="Env var holding the gateway base URL, e.g. KITUNE_GATEWAY_URL."
    )
    api_key_env: str | None = Field(
        default=None, description="Env var holding the gateway API key, e.g. KITUNE_GATEWAY_KEY."
    )
    default_model: str | None = Field(
        default=None, description="Model used by roles that name none, e.g. 'openai/gpt-4o-mini'."
    )

    _check_env_names = field_validator("base_url_env", "api_key_env")(_env_name)


class LocalModelConfig(_Section):
    """The embedded local model: llama.cpp serving a GGUF shipped on PyPI, on 127.0.0.1."""

    model: Literal["qwen2.5-coder-1.5b", "qwen2.5-0.5b", "gemma3-270m"] = Field(
        default="qwen2.5-coder-1.5b", description="Which packaged GGUF to serve."
    )
    gguf_path: Path | None = Field(default=None, description="Use this GGUF file instead of a packaged one.")
    n_ctx: int = Field(
        default=8192, ge=512, description="Context window in tokens (per slot with llama-server)."
    )
    n_threads: int | None = Field(default=None, ge=1, description="CPU threads; None: all cores.")
    port: int = Field(default=0, ge=0, le=65535, description="Port on 127.0.0.1; 0 picks a free one.")
    startup_timeout_s: float = Field(default=180.0, gt=0, description="How long to wait for the server.")
    server: Literal["auto", "llama-server", "xllamacpp", "llama-cpp-python"] = Field(
        default="auto",
        description="Which llama.cpp runtime serves the model (kitune.localmodel.runtimes): 'auto' (the "
        "fastest present: a native llama-server compiled for this CPU by `kitune lm build`, else the "
        "prebuilt xllamacpp wheel of the `local` extra; nothing is compiled unless asked), 'llama-server' "
        "(the native build only), 'xllamacpp' (the wheel only) or 'llama-cpp-python' (python -m "
        "llama_cpp.server: one request at a time; installed with `install_local_model.sh --python-server`). "
        "All but llama-cpp-python decode `parallel` slots together with continuous batching.",
    )
    parallel: int = Field(
        default=4,
        ge=1,
        le=64,
        description="llama-server slots: requests decoded together in one batch; each slot gets n_ctx "
        "tokens of context (the KV cache holds parallel x n_ctx). Also the default concurrency of "
        "extraction, evaluation, judging and optimiser threads when the embedded model serves them. "
        "llama-cpp-python always serves one request at a time.",
    )
    server_path: Path | None = Field(
        default=None,
        description="The native llama-server executable; default: $KITUNE_LLAMA_SERVER, else the newest "
        "build `kitune lm build` cached for this CPU, else one beside the Python interpreter, else "
        "`llama-server` on PATH.",
    )

    @property
    def slots(self) -> int:
        """Requests the server decodes at once (>= 1).

        ``parallel`` for llama-server and xllamacpp (``auto`` picks one of them), 1 for
        llama-cpp-python (one request at a time).
        """
        return 1 if self.server == "llama-cpp-python" else self.parallel


class LMConfig(_Section):
    """LLM access for every role."""

    gateway: GatewayConfig = Field(default_factory=GatewayConfig, description="Shared gateway.")
    extract: LMRoleConfig = Field(
        default_factory=lambda: LMRoleConfig(max_tokens=2048), description="Extractor."
    )
    rewrite: LMRoleConfig = Field(
        default_factory=lambda: LMRoleConfig(max_tokens=512), description="Query rewriter."
    )
    agent: LMRoleConfig = Field(
        default_factory=lambda: LMRoleConfig(max_tokens=512), description="Eval agent."
    )
    judge: LMRoleConfig = Field(default_factory=lambda: LMRoleConfig(max_tokens=256), description="Judge.")
    reflection: LMRoleConfig = Field(
        default_factory=lambda: LMRoleConfig(temperature=1.0, max_tokens=4096),
        description="Optimiser proposer.",
    )
    local: LocalModelConfig = Field(default_factory=LocalModelConfig, description="Embedded local model.")
    cache: bool = Field(default=False, description="Use DSPy's response cache (usage still recorded).")
    record_dir: Path | None = Field(
        default=None,
        description="Record every LLM call (request hash, response, usage, finish reason) to "
        "<dir>/calls.jsonl "
        "(the CLI's --record DIR).",
    )
    replay_dir: Path | None = Field(
        default=None,
        description="Answer every LLM call from <dir>/calls.jsonl, contacting no provider; an unrecorded "
        "call "
        "fails naming it (the CLI's --replay DIR).",
    )

    @model_validator(mode="before")
    @classmethod
    def _role_blocks_over_role_defaults(cls, data: Any) -> Any:
        # `reflection: {model: x}` must keep reflection's temperature 1.0 and 4096 max_tokens,
        # not fall back to LMRoleConfig's generic 0.0 / 1024.
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for role in ROLES:
            block = out.get(role)
            if not isinstance(block, dict | LMRoleConfig):
                continue
            # The role's own defaults: what its default_factory sets explicitly (e.g. max_tokens).
            factory = cls.model_fields[role].default_factory
            own: Any = factory() if factory is not None else LMRoleConfig()  # type: ignore[call-arg]
            defaults = own.model_dump(exclude_unset=True)
            if isinstance(block, dict):
                out[role] = {**defaults, **block}
            else:
                unset = {k: v for k, v in defaults.items() if k not in block.model_fields_set}
                if unset:
                    out[role] = block.model_copy(update=unset)
        return out

    @model_validator(mode="after")
    def _record_or_replay(self) -> LMConfig:
        if self.record_dir is not None and self.replay_dir is not None:
            raise ValueError("lm.record_dir and lm.replay_dir are both set: record or replay, not both")
        return self

    def role(self, role: Role) -> LMRoleConfig:
        """Return the config of ``role``."""
        cfg: LMRoleConfig = getattr(self, role)
        return cfg

    def model_label(self, role: Role) -> str:
        """The model ``role`` uses as configured, for logs and run records (no environment read).

        The role's ``model``, else the gateway's ``default_model``, else ``local:<name>`` for the
        embedded model.
        """
        return self.role(role).model or self.gateway.default_model or f"local:{self.local.model}"


class EmbedderConfig(_Section):
    """Text embedder used by the embedded stores."""

    type: Literal["wordllama", "hash"] = Field(
        default="wordllama", description="wordllama (offline) or hash (tests)."
    )
    dim: int = Field(default=256, ge=8, le=4096, description="Vector dimension.")


class StoreSection(_Section):
    """What every KI store backend's config section has: its ``type`` and a named KI collection.

    A backend subclasses it (its own settings as fields), names the field that holds the KI
    collection's name (:attr:`collection_field`: LanceDB's ``table``, Elasticsearch's ``index``)
    and registers the subclass (:func:`register_store_section`, which
    :func:`kitune.retrieval.backends.register_store_backend` calls), so ``store.type: <name>``
    validates into it. Nothing outside the backend reads a backend's own fields.
    """

    type: str = Field(description="The backend (a registered store type).")
    collection_field: ClassVar[str] = "table"
    """The field naming the KI table/index; the loop versions it as ``<name>-<sha8>``."""
    collection_kind: ClassVar[str] = "table"
    """What the backend calls that collection, for messages (``table``, ``index``)."""

    @property
    def collection(self) -> str:
        """The KI table/index name (the value of :attr:`collection_field`)."""
        return str(getattr(self, self.collection_field))


class LanceStoreConfig(StoreSection):
    """Embedded default store on LanceDB (no server)."""

    type: Literal["lancedb"] = "lancedb"
    path: Path | None = Field(default=None, description="Database folder; None: <workdir>/lancedb.")
    table: str = Field(default="kis", description="KI table name.")
    write_batch_size: int = Field(default=512, ge=1, description="KIs per commit.")
    compact_every_fragments: int = Field(
        default=32, ge=2, description="optimize() once this many fragments exist."
    )
    # -- issue 14: compaction off the write path ------------------------------------------------
    background_compaction: bool = Field(
        default=True,
        description="Compact in a background thread in quiet moments (an upsert never waits for it); "
        "False: inside the upsert that crossed compact_every_fragments.",
    )
    compaction_quiet_s: float = Field(
        default=1.0, ge=0.0, description="Background compaction starts once no write happened for this long."
    )
    # -- issue 39.5: queries never left scanning unindexed rows ---------------------------------
    maintain_unindexed_rows: int = Field(
        default=2000,
        ge=0,
        description="Request maintenance (LanceDB optimize(): compaction + new rows folded into every "
        "index + cleanup) once an index leaves this many rows unindexed (index_stats' "
        "num_unindexed_rows, read after each write); 0: off.",
    )
    maintain_every_writes: int = Field(
        default=20,
        ge=0,
        description="Request maintenance after this many committed writes since the last run (LanceDB's "
        "rule of thumb: optimize after more than 20 data modification operations); 0: off.",
    )
    compaction_max_wait_s: float | None = Field(
        default=10.0,
        ge=0.0,
        description="A requested background maintenance starts at the latest this long after the request, "
        "even while writes continue (None: only in a quiet moment, the behaviour before issue 39.5).",
    )


class ElasticsearchStoreConfig(StoreSection):
    """Elasticsearch 9.x backend (scale-out)."""

    collection_field: ClassVar[str] = "index"
    collection_kind: ClassVar[str] = "index"
    type: Literal["elasticsearch"] = "elasticsearch"
    url_env: str = Field(default="KITUNE_ES_URL", description="Env var holding the cluster URL.")
    api_key_env: str | None = Field(default="KITUNE_ES_API_KEY", description="Env var holding an API key.")
    index: str = Field(default="kitune-kis", description="KI index name.")
    inference_id: str = Field(
        default=".elser-2-elasticsearch", description="semantic_text inference endpoint."
    )
    mapping: Literal["kitune", "ai-index"] = Field(
        default="kitune",
        description="Index layout: kitune's mapping, or Elastic's published ai-index@mappings shape.",
    )
    bulk_chunk_size: int = Field(default=500, ge=1, description="Documents per bulk request.")
    max_retries: int = Field(default=5, ge=0, description="Retries of 429 items, with backoff.")

    _check_env_names = field_validator("url_env", "api_key_env")(_env_name)


class MemoryStoreConfig(StoreSection):
    """In-process store (:class:`kitune.retrieval.memory.MemoryStore`): nothing on disk, gone at exit.

    One store per table name for the life of the process, so an extraction and the evaluation
    after it in one process share it; for tests, trials and the store conformance suite.
    """

    type: Literal["memory"] = "memory"
    table: str = Field(default="kis", description="KI table name (one in-process store per name).")


STORE_SECTIONS: dict[str, type[StoreSection]] = {
    "lancedb": LanceStoreConfig,
    "elasticsearch": ElasticsearchStoreConfig,
    "memory": MemoryStoreConfig,
}
"""``store.type`` → its config section. Built-ins here; a plug-in backend adds its own through
:func:`register_store_section` (via :func:`kitune.retrieval.backends.register_store_backend`)."""


def register_store_section(section: type[StoreSection], *, replace: bool = False) -> type[StoreSection]:
    """Make ``store.type: <section's type default>`` validate into ``section``; returns it.

    Raises:
        ValueError: ``section.type`` has no string default, or that type is taken by another
            section and ``replace`` is False.
    """
    default = section.model_fields["type"].default
    if not isinstance(default, str) or not default:
        raise ValueError(f"{section.__name__}.type needs a default naming the backend, e.g. 'mystore'")
    old = STORE_SECTIONS.get(default)
    if old is not None and old is not section and not replace:
        raise ValueError(f"store type {default!r} is already registered ({old.__name__})")
    STORE_SECTIONS[default] = section
    return section


StoreConfig = SerializeAsAny[StoreSection]
"""The ``store`` section: one of :data:`STORE_SECTIONS`, chosen by its ``type``."""


class RetrievalConfig(_Section):
    """Hybrid retrieval knobs (Optuna may tune them)."""

    rrf_k: int = Field(default=60, ge=1, le=1000, description="RRF constant k in 1/(k + rank).")
    tag_weight: float = Field(default=1.0, ge=0.0, description="RRF weight of the tag branch.")
    lexical_weight: float = Field(default=1.0, ge=0.0, description="RRF weight of BM25 on titles.")
    semantic_weight: float = Field(default=1.0, ge=0.0, description="RRF weight of vectors on descriptions.")
    branch_size: int = Field(default=50, ge=1, le=1000, description="Candidates per branch before fusion.")
    default_size: int = Field(default=10, ge=1, le=100, description="KIs returned by get_context.")
    max_size: int = Field(default=50, ge=1, le=1000, description="Largest size a request may ask for.")
    confidence_floor: int = Field(default=0, ge=0, le=100, description="Drop KIs below this confidence.")
    snippet_chars: int = Field(default=700, ge=50, le=10_000, description="Baseline search snippet size.")
    snippets_per_hit: int = Field(default=3, ge=1, le=10, description="Baseline snippets per hit.")
    search_hits: int = Field(default=10, ge=1, le=100, description="Baseline hits per search.")
    # -- issue 14: lifecycle on the read path ------------------------------------------------
    serve_stale: bool = Field(
        default=False,
        description="Also serve stale KIs when a plan's filter names no statuses (default: active only).",
    )


class ExtractionConfig(_Section):
    """Extractor run settings."""

    max_facts_per_doc: int = Field(default=15, ge=0, le=50, description="Cap on facts per document.")
    concurrency: int = Field(default=4, ge=1, le=256, description="Documents extracted in parallel.")
    chunk_chars: int = Field(default=6000, ge=500, description="Split documents longer than this.")
    max_retry_tokens: int = Field(
        default=8192,
        ge=1,
        description="Cap on max_tokens when a reply cut at its token limit is retried (doubled up to this); "
        "at or below lm.extract.max_tokens there is no bigger retry and the chunk is "
        "split (see split_cut_chunks) — on a slow CPU model a doubled retry can cost minutes per document.",
    )
    split_cut_chunks: bool = Field(
        default=True,
        description="A reply still cut at max_retry_tokens: re-extract its chunk as two halves (two more "
        "calls). False: no more calls when the cut reply has complete facts (kept only with "
        "keep_truncated_records).",
    )
    keep_truncated_records: bool = Field(
        default=False,
        description="Keep the complete records of a reply still cut at its token limit after the retry "
        "with more room (document status partial, counted kept_from_truncated). False: they are counted "
        "truncated_records_dropped and the document is recorded failed (retried on the next run).",
    )
    evidence_mode: Literal["quote", "sentences"] = Field(
        default="quote",
        description="quote: the model quotes its evidence (located verbatim after Unicode folding); "
        "sentences: it cites numbered sentences and kitune copies them (verbatim by construction). "
        "With the embedded 1.5B model sentences kept 1.6 KIs per fixture document and quote 0 "
        "(benchmarks/results/evidence_modes.md), so configs/experiments/demo.yaml uses sentences.",
    )
    call_unit: Literal["chunk", "sentence"] = Field(
        default="chunk",
        description="What one extractor call covers: chunk (the whole chunk) or sentence (one call per "
        "numbered sentence of a prose chunk, the chunk shown as context; needs evidence_mode: sentences; "
        "dialogue chunks keep one call). See benchmarks/results/extraction_variants.md.",
    )
    grammar_limits: bool = Field(
        default=True,
        description="With the embedded llama.cpp model: the output schema carries the guardrails' "
        "limits (title <= 140, description <= 350 characters, 1-3 cited sentences), compiled into the "
        "decoding grammar, so no fact is written too long to keep. Measured on 12 fixture questions "
        "(benchmarks/results/extraction_variants.q12.md): 3.25 KIs/document, answer coverage 9/12, "
        "32.6 s/document vs 2.00, 7/12, 113.1 s without. Providers' requests are unchanged.",
    )
    write_batch_size: int = Field(default=256, ge=1, description="KIs buffered before a store write.")
    flush_interval_s: float = Field(
        default=10.0,
        ge=0.0,
        description="Also write (and mark documents done) when the oldest buffered document waited this "
        "long; "
        "bounds the work a crash can cost with a slow LLM.",
    )
    max_doc_chars: int = Field(
        default=2_000_000,
        ge=1,
        description="Documents longer than this are recorded failed without any LM call "
        "(a 10 MB page would cost ~1,700 chunk calls); raise it to extract them.",
    )

    @model_validator(mode="after")
    def _sentence_calls_cite_sentences(self) -> ExtractionConfig:
        if self.call_unit == "sentence" and self.evidence_mode != "sentences":
            raise ValueError(
                "extraction.call_unit=sentence asks about numbered sentences: set extraction.evidence_mode "
                "to sentences, or call_unit to chunk"
            )
        return self


class GradingConfig(_Section):
    """How answers are graded."""

    grader: Literal["llm", "match"] = Field(
        default="llm",
        description="llm: the judge role's model grades each answer (BrowseComp-style); match: deterministic "
        "answer matching (yes/no rule, exact match after normalisation, gold contained as whole words), no "
        "LLM — use it when the judge model is too weak to grade (the embedded 1.5B model).",
    )
    include_adversarial: bool = Field(
        default=False,
        description="Count adversarial (abstention) questions — LoCoMo category 5 — in a run's headline "
        "score as ordinary questions. False: they are scored apart (summary abstention_* fields), as "
        "LoCoMo's authors and published memory-system evaluations report.",
    )


class AgentConfig(_Section):
    """Eval agent budget and concurrency."""

    max_steps: int = Field(default=43, ge=1, le=500, description="Step budget per question.")
    max_tokens: int | None = Field(
        default=64_000,
        ge=1,
        description="Input-token budget per question (None: unlimited). Checked before each agent call as "
        "well: a call whose prompt would cross it is not made and the episode ends as budget_exhausted "
        "with a force-commit on the trimmed trace, before the history can overflow the model's context. "
        "Default: 2x the largest committed per-question median (LoCoMo search-and-fetch, 32,226 tokens in "
        "6 steps, experiments/locomo-conv1/per_question.csv) and above every committed episode (max "
        "43,738); dev in-context medians are ~7,400 (experiments/loop-dev-48/evals).",
    )
    timeout_s: float | None = Field(
        default=None, gt=0, description="Optional wall-clock budget per question."
    )
    ki_render: Literal["compact", "full"] = Field(
        default="compact",
        description="How get_context shows KIs to the agent: 'compact' (each KI's fact once — the "
        "description when it holds every word of the title —, its documents as [docid], and of the facet "
        "line only its entities) or 'full' (title — description (docs: …) and the whole facet line). "
        "Measured in benchmarks/results/context_cost.dev.md (30% fewer tokens per look-up, same "
        "answer-bearing rate on the loop-dev-48 KIs).",
    )
    dedupe_kis: bool = Field(
        default=True,
        description="Do not show a KI again that an earlier get_context of the same episode showed (a count "
        "line says how many were left out; order kept); a look-up with nothing new counts as one that did "
        "not answer.",
    )
    call_rules: Literal["bounded", "legacy"] = Field(
        default="bounded",
        description="How the agent bounds repeated and refused calls: 'bounded' (an identical call is "
        "answered by a pointer to its earlier result and booked by its tool, the 3rd identical call of the "
        "episode is blocked, a call refused twice or a 3rd refusal ends the episode with a force-commit, "
        "the token budget is checked before each call, failed calls get a JSON error object); 'legacy': "
        "the rules before issue 39, only to replay recordings made with them (kitune demo --replay).",
    )
    observation_max_chars: int | None = Field(
        default=None,
        ge=200,
        description="Cap on one tool result in characters, the same for every skill (None: no cap, the "
        "published baseline: 10 hits × 3 snippets of ≤ 700 characters). Whole results are cut and only "
        "what was shown counts as seen.",
    )
    concurrency: int = Field(default=2, ge=1, le=64, description="Questions run in parallel.")
    tool_calling: Literal["auto", "native", "json"] = Field(
        default="auto",
        description="How the agent calls tools: native function calling (tools=), the JSON-in-text protocol, "
        "or auto (native when LiteLLM says the agent model supports function calling; json for the "
        "embedded model and unknown gateway models).",
    )


class LifecycleConfig(_Section):
    """KI lifecycle."""

    stale_after_days: float = Field(
        default=7.0, gt=0, description="Unseen this long → stale; twice → expired."
    )
    # -- issue 14: retention of disambiguation / source-description KIs ------------------------
    derived_retention: Literal["while_evidence", "age"] = Field(
        default="while_evidence",
        description="Disambiguation and source-description KIs: 'while_evidence' refreshes them on every "
        "extraction run whose corpus still holds all their evidence documents (they age only once one "
        "is gone); 'age' refreshes them only when re-written.",
    )
    derived_stale_after_days: float | None = Field(
        default=None,
        gt=0,
        description="Their stale window in days (twice it → expired); None: stale_after_days.",
    )


class TrackingConfig(_Section):
    """MLflow tracking. Registries need a database store, hence SQLite by default."""

    tracking_uri: str | None = Field(default=None, description="None: sqlite:///<workdir>/mlflow.db.")
    experiment: str = Field(default="kitune", description="MLflow experiment name.")


class OptimizeConfig(_Section):
    """Optimisation loop."""

    optimizer: str = Field(
        default="gepa",
        pattern=r"^[a-z0-9_-]+$",
        description="Optimiser name from kitune.optimizers.registry (built in: gepa, mipro; plug-ins "
        "register more). Checked against the registry when the loop starts (config.py cannot import it).",
    )
    iterations: int = Field(default=2, ge=1, le=100, description="Loop iterations.")
    max_metric_calls: int | None = Field(
        default=None,
        ge=1,
        description="GEPA metric calls per program per iteration (MIPROv2: trials); --max-metric-calls wins. "
        "None: sized per run to the smallest budget that makes min_proposals proposals on its split sizes "
        "(GEPA; MIPROv2: 8 trials). A set budget below that minimum is refused with the minimum named.",
    )
    min_proposals: int = Field(
        default=1,
        ge=1,
        le=100,
        description="Proposals (reflection + minibatch evaluations) a GEPA budget must be able to pay for; "
        "see kitune.optimizers.gepa.min_metric_calls.",
    )
    max_pareto_examples: int = Field(
        default=6,
        ge=1,
        le=100,
        description="Most examples in GEPA's Pareto (validation) set per program and iteration; fewer when "
        "a set max_metric_calls cannot pay for min_proposals proposals with that many (every proposal that "
        "beats its parent is scored on the whole set). Chosen per iteration from the tuning split, seeded, "
        "the gold documents / questions of no-candidate and out-of-budget failures first.",
    )
    gate: bool = Field(
        default=True,
        description="Keep a feedback KI only when every tuning and validation question whose get_context "
        "results it changes still gets its right answer (those questions are re-run; a rejected KI is "
        "retired through its status). See kitune.optimizers.gate.",
    )
    max_input_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Stop one program's optimiser run (GEPA) once it has spent this many LLM input tokens "
        "(task and reflection calls, counted in the token ledger); None: no token cap.",
    )
    improvers: list[str] = Field(
        default_factory=lambda: ["prompts", "knobs", "disambiguation"],
        description="The improve step's rooms, in order (kitune.optimizers.improvers; plug-ins register "
        "more): prompts (the optimiser on each tuned program), knobs (Optuna, when --knob-trials > 0), "
        "disambiguation (feedback KIs, with --feedback). Checked against the registry when the loop starts.",
    )
    reflection_context_tokens: int | None = Field(
        default=None,
        ge=512,
        description="The reflection model's context window in tokens (reflection prompts are sized to it). "
        "None: the embedded model's n_ctx, LiteLLM's model table, else what the server reports (/props, "
        "/models); when nothing reports it, 8192 (kitune.optimizers.gepa.DEFAULT_REFLECTION_CONTEXT_TOKENS). "
        "A context-overflow error halves the reflection prompt for the retry and every later call.",
    )
    accept_margin: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Paired validation score gain needed to accept (0: any gain).",
    )
    validation_fraction: float = Field(
        default=0.5, gt=0.0, lt=1.0, description="Share of questions held out."
    )
    seed: int = Field(default=0, description="Seed for splits and optimisers.")
    accuracy_weight: float = Field(
        default=1.0, ge=0.0, description="Loop-score weight of the accuracy difference to the reference run."
    )
    token_weight: float = Field(
        default=0.1,
        ge=0.0,
        description="Loop-score penalty per doubling of input tokens per question relative to the reference "
        "run "
        "(scale-free: the same at 5k and 1.8M tokens).",
    )
    timeout_weight: float = Field(
        default=0.2,
        ge=0.0,
        description="Loop-score penalty per unit of timeout-rate difference to the reference.",
    )
    max_failed_share: float = Field(
        default=0.2,
        ge=0.0,
        le=1.0,
        description="Above this share of failed questions (LLM calls that did not go through) in a run, "
        "the loop neither accepts nor rejects.",
    )
    require_significance: bool = Field(
        default=False,
        description="Also require the paired bootstrap 95% interval of the accuracy gain above 0 to accept.",
    )
    max_feedback_attempts: int = Field(
        default=2,
        ge=1,
        le=10,
        description="Disambiguation attempts per question across iterations (a new attempt needs a new "
        "wrong answer).",
    )
    gate_rank_tolerance: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="The gate's retrieval check: a feedback KI is rejected when another question's gold "
        "reciprocal rank in the top retrieval.default_size falls by more than this (0.5: rank 1 -> 2 "
        "passes, 1 -> 3 does not) or its gold recall@k is lost. See kitune.optimizers.gate.",
    )
    # -- issue 36: the decision rule -------------------------------------------------------------
    decision_rule: Literal["stage", "permissive"] = Field(
        default="stage",
        description="stage: each change (a program's instruction, the knobs) is accepted only when a "
        "one-sided paired test on its stage metric on validation reaches alpha / (changes tested in the "
        "round) with at least min_effect, and end-to-end accuracy is non-inferior "
        "(kitune.optimizers.acceptance.decide_change); a KI batch (the feedback KIs the gate kept; a KI "
        "change in the review queue) only when shown to lower the gold reciprocal rank of fewer than a "
        "noninferiority_margin share of the questions (exact binomial) and to be non-inferior end to end "
        "(decide_noninferior; batches count in the round's tests); a changed write-only program (the "
        "disambiguator) keeps the incumbent for lack of a validation stage metric; else "
        "the incumbent is kept ('not enough evidence') or the change rejected (worse). The review queue's "
        "labelled gate uses the same rule. permissive: the old rule (any paired end-to-end score gain, no "
        "test; accepts most pure-noise rounds; KI batches only gated).",
    )
    alpha: float = Field(
        default=0.05,
        gt=0.0,
        lt=0.5,
        description="One-sided level of the stage rule for a round as a whole (Bonferroni over its tests).",
    )
    min_effect: float = Field(
        default=0.02,
        ge=0.0,
        le=1.0,
        description="Smallest stage-metric gain worth a change (answer coverage share, MRR), even when "
        "significant.",
    )
    noninferiority_margin: float = Field(
        default=0.10,
        ge=0.0,
        le=1.0,
        description="End-to-end accuracy may be at most this much lower at the one-sided (1 - alpha) bound "
        "of the paired difference for a change to be accepted; also the largest share of validation "
        "questions whose gold reciprocal rank a KI batch may lower (acceptance.noninferiority_test: "
        "nothing lowered passes from log(alpha/m)/log(1 - margin) questions, 35 at 0.025 and 0.1).",
    )
    power: float = Field(
        default=0.8,
        ge=0.5,
        lt=1.0,
        description="Power of the minimum detectable effects kitune optimize prints before a run.",
    )


ProposalKindName = Literal["re_extract", "add_ki", "retire_ki", "rewriter_feedback"]


class ReviewConfig(_Section):
    """What ``kitune review`` proposes from failure signals, and what it may apply without a person."""

    auto_approve: list[ProposalKindName] = Field(
        default_factory=list,
        description="Proposal kinds approved without a person, and only when the labelled validation "
        "gate (the paired acceptance rule on labelled questions) accepts the change.",
    )
    re_extract_min_traces: int = Field(
        default=2, ge=1, description="Re-extract a document read by a fall-back in this many traces."
    )
    retire_min_episodes: int = Field(
        default=2, ge=1, description="Retire a KI shown in this many unsupported or looped episodes."
    )
    rewriter_min_empty: int = Field(
        default=2, ge=1, description="Rewriter feedback once this many distinct look-ups found nothing."
    )
    max_feedback_queries: int = Field(
        default=10, ge=1, le=50, description="Empty look-ups quoted in one rewriter-feedback proposal."
    )
    watch_proposals: bool = Field(
        default=True, description="kitune loop --watch mines new traces for signals and files proposals."
    )
    draft_kis: bool = Field(
        default=True, description="The production extractor drafts KIs for re_extract / add_ki (LLM calls)."
    )
    mcp_tools: bool = Field(
        default=False,
        description="Expose the review queue as MCP tools (list/show/approve/reject/revert): they write.",
    )
    effect_questions: int = Field(
        default=20, ge=2, le=1000, description="Newest labelled questions a proposal's effect is measured on."
    )


class KituneConfig(BaseSettings):
    """The whole configuration. See the module docstring for precedence and secrets."""

    model_config = SettingsConfigDict(
        env_prefix="KITUNE_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_assignment=True,
        hide_input_in_errors=True,
    )

    workdir: Path = Field(default=Path("kitune-work"), description="Where stores, runs and traces live.")
    corpus_name: str = Field(default="corpus", description="Name used in KI references (index://<name>).")
    lm: LMConfig = Field(default_factory=LMConfig, description="LLM roles and the embedded model.")
    embedder: EmbedderConfig = Field(default_factory=EmbedderConfig, description="Embedder.")
    store: StoreConfig = Field(default_factory=LanceStoreConfig, description="KI store backend.")
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig, description="Retrieval knobs.")
    extraction: ExtractionConfig = Field(default_factory=ExtractionConfig, description="Extraction.")
    agent: AgentConfig = Field(default_factory=AgentConfig, description="Eval agent.")
    grading: GradingConfig = Field(default_factory=GradingConfig, description="Answer grading.")
    lifecycle: LifecycleConfig = Field(default_factory=LifecycleConfig, description="KI lifecycle.")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="MLflow tracking.")
    optimize: OptimizeConfig = Field(default_factory=OptimizeConfig, description="Optimisation loop.")
    review: ReviewConfig = Field(default_factory=ReviewConfig, description="Review queue of proposals.")

    @field_validator("store", mode="before")
    @classmethod
    def _default_store_type(cls, value: Any) -> Any:
        # KITUNE_STORE__TABLE=x (or a file with store: {path: ...}) names no type: the embedded store.
        if isinstance(value, Mapping):
            kind = value.get("type", "lancedb")
            section = STORE_SECTIONS.get(kind) if isinstance(kind, str) else None
            if section is None:
                raise PydanticCustomError(
                    "store_type",
                    "unknown store.type {kind}: use one of {known} (a plug-in backend registers its type "
                    "when its module is imported)",
                    {"kind": repr(kind), "known": ", ".join(sorted(STORE_SECTIONS))},
                )
            return section.model_validate({"type": kind, **value})
        return value

    @classmethod
    def settings_customise_sources(  # noqa: D102 (pydantic-settings hook: sources and their order)
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment beats the file; the file arrives as init kwargs. load_config validates
        # the already-merged dict (file + env + overrides) with the environment switched off,
        # so explicit overrides win.
        if _IGNORE_ENV.get():
            return (init_settings,)
        return (env_settings, init_settings)

    def uses_local_model(self, role: Role) -> bool:
        """True when ``role`` resolves to the embedded local model (no model and no gateway model)."""
        return self.lm.role(role).model is None and self.lm.gateway.default_model is None

    def local_slots(self) -> int:
        """Requests the embedded model serves at once (>= 1): ``lm.local.slots``."""
        return self.lm.local.slots

    def concurrency_for(self, work: Literal["extraction", "agent", "judge", "optimizer"]) -> int:
        """How many independent LLM-bound jobs of ``work`` run at once (>= 1).

        An explicit setting wins (``extraction.concurrency`` for extraction, ``agent.concurrency``
        for the agent, the judge and optimiser metric threads). Otherwise, when the work's role runs
        on the embedded model, the server's slots (:meth:`local_slots`) — one setting sizes every
        pool to what the server decodes together; with a provider, the field's default
        (extraction 4, agent 2).

        Args:
            work: ``extraction`` (documents, role ``extract``), ``agent`` (questions, role
                ``agent``), ``judge`` (verdicts, role ``judge``) or ``optimizer`` (metric calls of
                GEPA/MIPROv2, role ``agent``).
        """
        section: ExtractionConfig | AgentConfig = self.extraction if work == "extraction" else self.agent
        role = _WORK_ROLE[work]
        if "concurrency" in section.model_fields_set or not self.uses_local_model(role):
            return section.concurrency
        return self.local_slots()

    @property
    def mlflow_uri(self) -> str:
        """The MLflow tracking URI (``sqlite:///<workdir>/mlflow.db`` by default)."""
        return self.tracking.tracking_uri or f"sqlite:///{self.workdir.resolve() / 'mlflow.db'}"


def _find_secrets(data: Any, path: str = "") -> list[str]:
    found: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            here = f"{path}.{key}" if path else str(key)
            if str(key).lower() in _SECRET_KEYS and value not in (None, ""):
                found.append(here)
            found.extend(_find_secrets(value, here))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found.extend(_find_secrets(value, f"{path}[{i}]"))
    return found


def _read_file(path: Path) -> dict[str, Any]:
    """The config file's mapping, read by pydantic-settings' own YAML/TOML source.

    Raises:
        ConfigError: the file is missing, not valid YAML/TOML, or its top level is not a mapping.
    """
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist: pass an existing --config file or omit it")
    toml = path.suffix.lower() == ".toml"
    try:  # the sources read the file when built
        source = (
            TomlConfigSettingsSource(KituneConfig, toml_file=path)
            if toml
            else YamlConfigSettingsSource(KituneConfig, yaml_file=path, yaml_file_encoding="utf-8")
        )
        data = source()
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"config file {path} is not valid {'TOML' if toml else 'YAML'}: {e}") from e
    except (TypeError, ValueError) as e:  # a list or a scalar at the top level
        raise ConfigError(
            f"config file {path} must hold a mapping at the top level (setting: value lines)"
        ) from e
    return dict(data)


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _dotted_to_nested(overrides: dict[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for dotted, value in overrides.items():
        node = nested
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


def with_overrides(cfg: KituneConfig, overrides: Mapping[str, Any]) -> KituneConfig:
    """``cfg`` with dotted-key ``overrides`` applied and re-validated; ``cfg`` is not changed.

    The one override merger: :func:`load_config` and the loop's knob settings both use it. The
    environment is not read again, so an override always wins. Only the settings ``cfg`` was
    given (``model_fields_set``, recursively) and the overrides count as set in the result; the
    rest keep their defaults *as defaults*, so "unset" rules such as
    :meth:`KituneConfig.concurrency_for` (the embedded server's slots unless a concurrency is set)
    still apply after an override. An override that switches ``store.type`` (the backend) starts
    the store section afresh: the other backend's settings do not carry over
    (``{"store.type": "elasticsearch"}`` gives the Elasticsearch defaults plus the other
    ``store.*`` overrides); a ``store.*`` override the new backend does not have is an error.

    Args:
        cfg: the configuration.
        overrides: dotted keys, e.g. ``{"retrieval.rrf_k": 30}``; empty: ``cfg`` itself.

    Raises:
        pydantic.ValidationError: an override has an invalid value (the error names the setting).
    """
    if not overrides:
        return cfg
    base = cfg.model_dump(mode="python", exclude_unset=True)
    nested = _dotted_to_nested(dict(overrides))
    store = nested.get("store")
    if isinstance(store, dict) and store.get("type", cfg.store.type) != cfg.store.type:
        base["store"] = {}  # another backend: the current one's keys are not its keys
    merged = _deep_merge(base, nested)
    token = _IGNORE_ENV.set(True)
    try:
        return KituneConfig.model_validate(merged)
    finally:
        _IGNORE_ENV.reset(token)


def load_config(path: Path | str | None = None, overrides: dict[str, Any] | None = None) -> KituneConfig:
    """Load the effective configuration.

    Args:
        path: a ``.yaml``/``.yml``/``.toml`` file, or None for defaults + environment. When None
            and ``KITUNE_CONFIG`` is set, that file is used.
        overrides: dotted keys applied last, e.g. ``{"lm.extract.model": "openai/gpt-4o-mini"}``.

    Returns:
        The validated :class:`KituneConfig`.

    Raises:
        ConfigError: the file is missing or malformed, holds a literal secret, or a value is
            invalid (the message names the setting).
    """
    if path is None and os.environ.get("KITUNE_CONFIG"):
        path = os.environ["KITUNE_CONFIG"]
    data: dict[str, Any] = _read_file(Path(path)) if path is not None else {}
    secrets = _find_secrets(data)
    if secrets:
        raise ConfigError(
            f"config file {path} contains secret value(s) at {', '.join(secrets)}: put the secret in an "
            "environment variable and name that variable instead (e.g. api_key_env: MY_PROVIDER_KEY)"
        )
    try:
        cfg = with_overrides(KituneConfig(**data), overrides or {})
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"invalid configuration: {problems}") from e
    return cfg


def mask_secrets(cfg: KituneConfig) -> dict[str, Any]:
    """Return the config as a JSON-able dict plus the resolved env values, secrets masked.

    For every ``*_env`` setting, a sibling ``*_value`` key shows whether the variable is set:
    base URLs are shown in full, keys as ``'sk-…abcd'`` (last 4 characters) or ``'<unset>'``.
    """
    data = cfg.model_dump(mode="json")

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            out: dict[str, Any] = {}
            for key, value in node.items():
                out[key] = walk(value)
                if key.endswith("_env") and isinstance(value, str):
                    raw = os.environ.get(value)
                    shown: str
                    if raw is None or raw == "":
                        shown = "<unset>"
                    elif "key" in key or "token" in key:
                        shown = f"…{raw[-4:]}" if len(raw) > 8 else "****"
                    else:
                        shown = raw
                    out[key.removesuffix("_env") + "_value"] = shown
            return out
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    result: dict[str, Any] = walk(data)
    return result
