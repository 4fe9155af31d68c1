"""The kitune exception tree.

Every error kitune raises on purpose derives from :class:`KituneError`::

    KituneError                        # root: catch-all for callers
    ├── ConfigError                    # invalid/missing config; message says how to fix it
    ├── LMError                        # an LLM call failed in a way we classified
    │   ├── LMAuthError                # 401/403: key missing or wrong (not retried)
    │   ├── LMConnectionError          # host unreachable, proxy in the way
    │   ├── LMTimeoutError             # the configured per-call timeout expired
    │   ├── LMRateLimitError           # 429 after bounded retries
    │   ├── EmptyCompletionError       # HTTP 200 with no choices / no content
    │   ├── LMContextWindowError       # the prompt does not fit the model's context
    │   └── ResponseFormatError        # the server rejected response_format
    ├── ParseError                     # model output held no usable JSON / fields
    ├── StoreError
    │   ├── StoreUnavailableError      # backend unreachable (ES down)
    │   └── DocumentNotFoundError      # also a KeyError, so mapping-style callers work
    ├── DataError                      # a dataset file is missing or malformed
    ├── HarnessError                   # our bug or misconfiguration, never a model mistake
    ├── OptimizationError
    ├── TrackingError
    │   ├── PromptNotFoundError        # no such prompt name / version / alias (also a KeyError)
    │   └── PromotionRefusedError      # promote/rollback to an empty or badly extracted KI table
    └── ReviewError                    # the review queue (kitune review)
        ├── ProposalNotFoundError      # no proposal with this id (also a KeyError)
        └── ProposalStateError         # the action does not fit the proposal's status

Constructors only store context (attributes); they never log or do I/O. Model mistakes and
budget exhaustion are data (``Step.error``, ``Episode.status``), not exceptions.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DataError",
    "DocumentNotFoundError",
    "EmptyCompletionError",
    "HarnessError",
    "KituneError",
    "LMAuthError",
    "LMConnectionError",
    "LMContextWindowError",
    "LMError",
    "LMRateLimitError",
    "LMTimeoutError",
    "OptimizationError",
    "ParseError",
    "PromotionRefusedError",
    "PromptNotFoundError",
    "ProposalNotFoundError",
    "ProposalStateError",
    "ResponseFormatError",
    "ReviewError",
    "StoreError",
    "StoreUnavailableError",
    "TrackingError",
]


class KituneError(Exception):
    """Root of every error kitune raises on purpose."""


class ConfigError(KituneError):
    """Configuration is invalid or incomplete; the message names the setting and the fix."""


class LMError(KituneError):
    """An LLM call failed.

    Attributes:
        model: the LiteLLM model string that was called (no secrets).
        api_base: the resolved base URL, or None for the provider default.
        retryable: whether a bounded retry may help (timeouts, 429, 5xx).
        input_tokens: prompt tokens the failed call was billed in the token ledger, summed over
            its attempts (estimated when the provider sent no usage); 0 when not from the LM layer.
        output_tokens: completion tokens the failed call was billed (0 unless a reply came back).
    """

    def __init__(
        self, message: str, *, model: str = "", api_base: str | None = None, retryable: bool = False
    ) -> None:
        super().__init__(message)
        self.model = model
        self.api_base = api_base
        self.retryable = retryable
        self.input_tokens = 0
        self.output_tokens = 0


class LMAuthError(LMError):
    """401/403 from the provider: the key is missing or wrong. Never retried."""


class LMConnectionError(LMError):
    """The host could not be reached, or a proxy answered instead of the provider."""


class LMTimeoutError(LMError):
    """The call exceeded the configured per-call timeout.

    Attributes:
        timeout_s: the timeout that applied, in seconds.
    """

    def __init__(self, message: str, *, timeout_s: float, model: str = "", api_base: str | None = None):
        super().__init__(message, model=model, api_base=api_base, retryable=True)
        self.timeout_s = timeout_s


class LMRateLimitError(LMError):
    """429 persisted after the bounded retries.

    Attributes:
        retry_after_s: the last wait hint the provider gave, in seconds, or None.
    """

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float | None = None,
        model: str = "",
        api_base: str | None = None,
    ) -> None:
        super().__init__(message, model=model, api_base=api_base, retryable=True)
        self.retry_after_s = retry_after_s


class EmptyCompletionError(LMError):
    """HTTP 200 but no usable content (empty ``choices``, e.g. a content filter).

    Attributes:
        reason: ``"content_filter"``, ``"no_choices"`` or ``"empty_content"``.
    """

    def __init__(self, message: str, *, reason: str, model: str = "", api_base: str | None = None) -> None:
        super().__init__(message, model=model, api_base=api_base, retryable=False)
        self.reason = reason


class LMContextWindowError(LMError):
    """The prompt does not fit the model's context window (case A1)."""


class ResponseFormatError(LMError):
    """The model or server rejected the requested ``response_format``."""


class ParseError(KituneError):
    """Model output could not be parsed into the expected structure.

    Attributes:
        raw: the raw text that failed to parse (kept for debugging).
        missing_fields: required fields that were absent, if known.
    """

    def __init__(self, message: str, *, raw: str = "", missing_fields: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.raw = raw
        self.missing_fields = missing_fields


class StoreError(KituneError):
    """A store operation failed.

    Attributes:
        backend: ``"lancedb"`` or ``"elasticsearch"``.
    """

    def __init__(self, message: str, *, backend: str = "") -> None:
        super().__init__(message)
        self.backend = backend


class StoreUnavailableError(StoreError):
    """The store backend cannot be reached or opened."""


class DocumentNotFoundError(StoreError, KeyError):
    """No KI or document has the requested id.

    Attributes:
        doc_id: the id that was asked for.
    """

    def __init__(self, doc_id: str, *, backend: str = "") -> None:
        super().__init__(f"no document or KI with id {doc_id!r}", backend=backend)
        self.doc_id = doc_id

    def __str__(self) -> str:
        return str(self.args[0])


class DataError(KituneError):
    """A dataset file is missing or malformed.

    Attributes:
        path: the file at fault.
        line: 1-based line number, or None.
    """

    def __init__(self, message: str, *, path: str = "", line: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


class HarnessError(KituneError):
    """A bug or misconfiguration in the eval harness (never a model mistake)."""


class OptimizationError(KituneError):
    """The optimisation loop could not proceed."""


class TrackingError(KituneError):
    """Experiment tracking (MLflow) failed in a way the caller must see."""


class PromptNotFoundError(TrackingError, KeyError):
    """The prompt registry has no such prompt name, version or alias.

    Attributes:
        name: the prompt name asked for.
        version: the version or alias asked for, or None when the name itself is unknown.
    """

    def __init__(self, message: str, *, name: str, version: str | None = None) -> None:
        super().__init__(message)
        self.name = name
        self.version = version

    def __str__(self) -> str:
        return str(self.args[0])


class PromotionRefusedError(TrackingError):
    """A promote or rollback refused: the version's KI table is empty or its extraction failed too often.

    Nothing was switched; the message names the table, the counts and the override
    (``--force``).
    """

    def __init__(
        self, message: str, *, table: str = "", kis: int = 0, failed: int = 0, total: int = 0
    ) -> None:
        super().__init__(message)
        self.table = table
        self.kis = kis
        self.failed = failed
        self.total = total


class ReviewError(KituneError):
    """A review-queue operation failed (``kitune review``, ``/api/proposals``)."""


class ProposalNotFoundError(ReviewError, KeyError):
    """No proposal has this id."""

    def __init__(self, proposal_id: str) -> None:
        super().__init__(f"no proposal {proposal_id!r}: list them with `kitune review list`")
        self.proposal_id = proposal_id

    def __str__(self) -> str:
        return str(self.args[0])


class ProposalStateError(ReviewError):
    """The action does not fit the proposal's status (e.g. approving a rejected proposal)."""

    def __init__(self, message: str, *, proposal_id: str = "", status: str = "") -> None:
        super().__init__(message)
        self.proposal_id = proposal_id
        self.status = status
