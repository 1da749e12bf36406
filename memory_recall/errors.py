"""The one exception tree of memory-recall.

Every error the package raises on purpose is a :class:`MemoryRecallError`::

    MemoryRecallError
    ├── ConfigError            settings or provider configuration is invalid
    ├── InputError             a caller-supplied value is invalid (names the field and the reason)
    │   └── NotFound           a referenced chat, node, edge or record does not exist
    ├── StoreError             the SQLite store cannot be opened, migrated or written
    ├── EmbeddingUnavailable   the embedding provider failed (carries a failure category)
    ├── LLMUnavailable         the chat LLM failed (carries a failure category)
    ├── StrictModeViolation    strict recall refused to degrade (wraps the provider failure)
    └── StageFailed            a pipeline stage failed in a way that cannot degrade

The errors are caught in one place per entry point: the retrieve runner turns degradable provider failures into
a fallback status, the HTTP service maps the tree onto status codes, and the CLI prints one line.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "ConfigError",
    "EmbeddingFailure",
    "EmbeddingUnavailable",
    "InputError",
    "LLMFailure",
    "LLMUnavailable",
    "MemoryRecallError",
    "NotFound",
    "StageFailed",
    "StoreError",
    "StrictModeViolation",
]

#: Failure categories of an embedding call (architecture "Failure policy", recall-spec departure 3).
EmbeddingFailure = Literal[
    "timeout", "connect", "http_status", "bad_payload", "dimension_mismatch", "missing_vectors"
]
#: Failure categories of an LLM call.
LLMFailure = Literal["timeout", "connect", "http_status", "bad_payload", "refusal", "unknown_keys", "not_configured"]


class MemoryRecallError(Exception):
    """Base class of every error raised on purpose by memory-recall."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ConfigError(MemoryRecallError):
    """Settings or provider configuration is invalid."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.reason = message


class InputError(MemoryRecallError):
    """A caller-supplied value is invalid.

    ``field`` is a dotted path to the offending value (``"nodes[3].importance"``), ``reason`` says what is wrong.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}" if field else reason)
        self.field = field
        self.reason = reason


class NotFound(InputError):
    """A referenced chat, node, edge or record does not exist."""


class StoreError(MemoryRecallError):
    """The SQLite store cannot be opened, migrated or written."""


class EmbeddingUnavailable(MemoryRecallError):
    """The embedding provider failed; ``category`` says how."""

    def __init__(self, category: EmbeddingFailure, message: str) -> None:
        super().__init__(f"embedding {category}: {message}")
        self.category: EmbeddingFailure = category
        self.detail = message


class LLMUnavailable(MemoryRecallError):
    """The chat LLM failed or answered something unusable; ``category`` says how."""

    def __init__(self, category: LLMFailure, message: str) -> None:
        super().__init__(f"llm {category}: {message}")
        self.category: LLMFailure = category
        self.detail = message


class StrictModeViolation(MemoryRecallError):
    """Strict recall refused to degrade after a provider failure (the failure is ``cause``)."""

    def __init__(self, cause: EmbeddingUnavailable | LLMUnavailable) -> None:
        super().__init__(f"strict mode: {cause}")
        self.cause = cause


class StageFailed(MemoryRecallError):
    """A pipeline stage failed in a way that cannot degrade."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(f"stage {stage}: {message}")
        self.stage = stage
