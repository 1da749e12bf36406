"""memory-recall: memory for long roleplay chats.

A per-chat memory graph in a SQLite store, a deterministic retrieve pipeline over array snapshots of it, and
ready-to-inject prompt blocks. Usage::

    from memory_recall import Store, load_settings
    store = Store.open()                       # $MEMORY_RECALL_DATA_DIR or the per-user default
    settings = load_settings()                 # profile defaults < TOML < environment < overrides
"""

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
from memory_recall.settings import RecallSettings, load_settings
from memory_recall.store import Store

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
