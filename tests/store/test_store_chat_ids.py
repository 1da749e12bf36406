"""Chat id validation, and that every store method applies it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from memory_recall.errors import InputError
from memory_recall.model.records import PersistedRecall
from memory_recall.model.state import HistoryState, KnowledgeState
from memory_recall.store import Store, validate_chat_id


@pytest.mark.parametrize(
    "chat_id",
    ["ok-chat_1", "会话:1", "a", "x" * 128, "user@host", "a.b.c", "Ünïcödé", "ёлка", "١٢٣", "v1.2:3@x_y-z",
     "Seraphina - 2023-11-10@20h46m36s"],
)
def test_valid_chat_ids(chat_id: str) -> None:
    assert validate_chat_id(chat_id) == chat_id


@pytest.mark.parametrize(
    ("chat_id", "reason"),
    [
        ("", "must not be empty"),
        ("x" * 129, "must be at most 128 characters, got 129"),
        ("../x", "must not contain path separators ('/' at 2)"),
        ("a/b", "must not contain path separators ('/' at 1)"),
        ("a\\b", "must not contain path separators ('\\\\' at 1)"),
        (".hidden", "must not start with '.'"),
        ("a..b", "must not contain '..'"),
        ("..", "must not start with '.'"),
        ("a\x00b", "must not contain control characters (U+0000 at 1)"),
        ("a\nb", "must not contain control characters (U+000A at 1)"),
        ("a\u200bb", "must not contain control characters (U+200B at 1)"),
        (" ab", "must not start or end with a space"),
        ("ab ", "must not start or end with a space"),
        ("a*", "must contain only letters, digits, spaces and _ - . : @ ('*' at 1)"),
        ("chat?id=1", "must contain only letters, digits, spaces and _ - . : @ ('?' at 4)"),
        ("emoji😀", "must contain only letters, digits, spaces and _ - . : @ ('😀' at 5)"),
        (None, "must be a string, got NoneType"),
        (12, "must be a string, got int"),
    ],
)
def test_invalid_chat_ids(chat_id: Any, reason: str) -> None:
    with pytest.raises(InputError) as info:
        validate_chat_id(chat_id)
    assert (info.value.field, info.value.reason) == ("chat_id", reason)


CALLS: dict[str, Callable[[Store, str], object]] = {
    "chat_version": lambda s, c: s.chat_version(c),
    "stats": lambda s, c: s.stats(c),
    "get_node": lambda s, c: s.get_node(c, "n"),
    "get_nodes": lambda s, c: s.get_nodes(c),
    "get_edges": lambda s, c: s.get_edges(c),
    "edges_of": lambda s, c: s.edges_of(c, "n"),
    "get_knowledge": lambda s, c: s.get_knowledge(c),
    "get_regions": lambda s, c: s.get_regions(c),
    "get_timeline": lambda s, c: s.get_timeline(c),
    "get_summaries": lambda s, c: s.get_summaries(c),
    "get_history": lambda s, c: s.get_history(c),
    "get_journal": lambda s, c: s.get_journal(c),
    "load_graph": lambda s, c: s.load_graph(c),
    "get_embeddings": lambda s, c: s.get_embeddings(c, "m"),
    "embedding_hashes": lambda s, c: s.embedding_hashes(c, "m"),
    "get_record": lambda s, c: s.get_record(c, 0),
    "list_records": lambda s, c: s.list_records(c),
    "bm25": lambda s, c: s.bm25(c, ["x"]),
    "write": lambda s, c: s.write(c).__enter__(),
    "upsert_nodes": lambda s, c: s.upsert_nodes(c, []),
    "delete_nodes": lambda s, c: s.delete_nodes(c, []),
    "upsert_edges": lambda s, c: s.upsert_edges(c, []),
    "delete_edges": lambda s, c: s.delete_edges(c, []),
    "put_embeddings": lambda s, c: s.put_embeddings(c, "m", {"n": np.ones(2)}),
    "delete_embeddings": lambda s, c: s.delete_embeddings(c, "m"),
    "set_knowledge": lambda s, c: s.set_knowledge(c, KnowledgeState()),
    "set_history": lambda s, c: s.set_history(c, HistoryState()),
    "set_journal": lambda s, c: s.set_journal(c, []),
    "put_record": lambda s, c: s.put_record(c, PersistedRecall(chat_id=c, user_floor=0, injection_text="x")),
    "delete_record": lambda s, c: s.delete_record(c, 0),
    "delete_records_from": lambda s, c: s.delete_records_from(c, 0),
    "reinforce": lambda s, c: s.reinforce(c, [], 0),
    "delete_chat": lambda s, c: s.delete_chat(c),
}


@pytest.mark.parametrize("method", list(CALLS))
def test_every_method_validates_its_chat_id(store: Store, method: str) -> None:
    with pytest.raises(InputError) as info:
        CALLS[method](store, "../etc")
    assert info.value.field == "chat_id"
    assert store.list_chats() == []
