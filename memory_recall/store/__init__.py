"""Persistence: the SQLite store of chats, memory graphs, embeddings and recall records."""

from memory_recall.store.sqlite import (
    ChatInfo,
    Store,
    StoreReader,
    StoreWriter,
    default_data_dir,
    validate_chat_id,
)

__all__ = ["ChatInfo", "Store", "StoreReader", "StoreWriter", "default_data_dir", "validate_chat_id"]
