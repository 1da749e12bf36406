"""memory-recall: memory for long roleplay chats.

A per-chat memory graph in a SQLite store, a deterministic retrieve pipeline over array snapshots of it, and
ready-to-inject prompt blocks. Usage::

    from memory_recall import Store, load_settings
    store = Store.open()                       # $MEMORY_RECALL_DATA_DIR or the per-user default
    settings = load_settings()                 # profile defaults < TOML < environment < overrides
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from memory_recall.errors import (
    ConfigError,
    EmbeddingUnavailable,
    InputError,
    LLMUnavailable,
    MemoryRecallError,
    NotFound,
    StageFailed,
    StoreError,
    StrictModeViolation,
)

if TYPE_CHECKING:
    from memory_recall.settings import RecallSettings, load_settings
    from memory_recall.store import Store

# Loaded on first use (PEP 562): importing any submodule runs this file, and the settings and the store pull in
# pydantic, numpy and scipy (0.5 s), which `memory-recall --version` and `--help` must not pay for.
_LAZY = {
    "RecallSettings": "memory_recall.settings",
    "load_settings": "memory_recall.settings",
    "Store": "memory_recall.store",
}

__all__ = [
    "ConfigError",
    "EmbeddingUnavailable",
    "InputError",
    "LLMUnavailable",
    "MemoryRecallError",
    "NotFound",
    "RecallSettings",
    "StageFailed",
    "Store",
    "StoreError",
    "StrictModeViolation",
    "load_settings",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'memory_recall' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
