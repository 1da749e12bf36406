"""Builders and hypothesis strategies shared by the store tests (not a test module)."""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from memory_recall.model.graph import NODE_TYPES, Edge, Node

_counter = itertools.count()


def new_chat_id() -> str:
    """A chat id never used before in this test session (hypothesis examples share one store)."""
    return f"chat-{next(_counter)}"


# -- builders ------------------------------------------------------------------------------------------------


def node(node_id: str, type_: str = "event", **fields: Any) -> Node:
    """A node with the given fields (seq defaults to 1)."""
    return Node(id=node_id, type=type_, fields=fields, seq=1)


def edge(edge_id: str, a: str, b: str, **kw: Any) -> Edge:
    return Edge(id=edge_id, from_id=a, to_id=b, **kw)


def dump_database(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table (FTS content included) and the header versions: exact before/after checks."""
    conn = sqlite3.connect(str(path))
    try:
        out: dict[str, list[tuple[Any, ...]]] = {}
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'nodes_fts_%' "
                "AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
        for table in tables:
            out[table] = sorted(conn.execute(f"SELECT rowid, * FROM {table}").fetchall(), key=repr)
        out["_header"] = [
            (
                conn.execute("PRAGMA user_version").fetchone()[0],
                conn.execute("PRAGMA application_id").fetchone()[0],
            )
        ]
        return out
    finally:
        conn.close()


# -- strategies ----------------------------------------------------------------------------------------------

_CJK = st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF)
# Printable-ish text: no surrogates (not UTF-8), no controls (ids reject them), no NUL (models reject it).
_ANY = st.characters(exclude_categories=("Cs", "Cc"))
text = st.one_of(
    st.text(_CJK, max_size=12), st.text(_ANY, max_size=16), st.sampled_from(["钟楼入口", "Café", ""])
)
ident = st.text(st.one_of(_ANY, _CJK), min_size=1, max_size=24).filter(lambda s: bool(s.strip()))
key = st.text(st.one_of(_ANY, _CJK), min_size=1, max_size=10)

_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    text,
)
_level1 = st.one_of(_leaf, st.lists(_leaf, max_size=4), st.dictionaries(key, _leaf, max_size=4))
json_value = st.one_of(_level1, st.lists(_level1, max_size=3), st.dictionaries(key, _level1, max_size=3))

_field_keys = st.one_of(
    st.sampled_from(
        [
            "name",
            "title",
            "summary",
            "insight",
            "state",
            "traits",
            "participants",
            "status",
            "belief",
            "goal",
            "date",
            "speaker",
        ]
    ),
    key,
)
millis = st.integers(min_value=0, max_value=253_402_300_799_999)
_region = st.one_of(
    text, st.sampled_from(["王都/钟楼", "城堡 > 地牢", "a, b; c", "旧城区, 集市 / 下水道 / 钟楼"])
)

scope = st.fixed_dictionaries(
    {
        "layer": st.sampled_from(["objective", "pov"]),
        "owner_type": st.sampled_from(["", "character", "user"]),
        "owner_id": text,
        "owner_name": text,
        "region_primary": _region,
        "region_path": st.lists(_region, max_size=3),
        "region_secondary": st.lists(_region, max_size=3),
    }
)
story_time = st.fixed_dictionaries(
    {
        "segment_id": text,
        "label": text,
        "tense": st.sampled_from(["past", "ongoing", "future", "flashback", "hypothetical", "unknown"]),
        "relation": st.sampled_from(["same", "after", "before", "parallel", "unknown"]),
        "anchor_label": text,
        "confidence": st.sampled_from(["high", "medium", "low"]),
        "source": st.sampled_from(["extract", "derived", "manual"]),
    }
)
story_time_span = st.fixed_dictionaries(
    {
        "start_segment_id": text,
        "end_segment_id": text,
        "start_label": text,
        "end_label": text,
        "mixed": st.booleans(),
        "source": st.sampled_from(["extract", "derived", "manual"]),
    }
)


@st.composite
def nodes(draw: st.DrawFn, node_id: st.SearchStrategy[str] = ident) -> Node:
    seq = draw(st.integers(min_value=-1, max_value=10_000_000))
    kwargs: dict[str, Any] = {
        "id": draw(node_id),
        "type": draw(st.sampled_from(NODE_TYPES)),
        "fields": draw(st.dictionaries(_field_keys, json_value, max_size=6)),
        "seq": seq,
        "archived": draw(st.booleans()),
        "importance": draw(st.floats(min_value=0.0, max_value=10.0)),
        "access_count": draw(st.integers(min_value=0, max_value=10**9)),
        "last_access_time": draw(millis),
        "created_time": draw(millis),
        "updated_at": draw(millis),
        "level": draw(st.integers(min_value=0, max_value=64)),
        "parent_id": draw(st.none() | ident),
        "child_ids": tuple(draw(st.lists(ident, max_size=3))),
        "prev_id": draw(st.none() | ident),
        "next_id": draw(st.none() | ident),
        "scope": draw(scope),
        "story_time": draw(story_time),
        "story_time_span": draw(story_time_span),
        "evidence": tuple(draw(st.lists(text, max_size=3))),
        "extra": draw(st.dictionaries(key, json_value, max_size=3)),
    }
    seq_range = draw(
        st.one_of(
            st.just("omit"),
            st.none(),
            st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)).map(lambda t: (min(t), max(t))),
        )
    )
    if seq_range != "omit":
        kwargs["seq_range"] = seq_range
    return Node(**kwargs)


@st.composite
def graphs(draw: st.DrawFn) -> tuple[list[Node], list[Edge]]:
    """Unique-id nodes and edges between them."""
    ns = draw(st.lists(nodes(), max_size=8, unique_by=lambda n: n.id))
    es: list[Edge] = []
    if len(ns) >= 2:
        for edge_id in draw(st.lists(ident, max_size=8, unique=True)):
            a, b = draw(st.lists(st.sampled_from([n.id for n in ns]), min_size=2, max_size=2, unique=True))
            es.append(
                Edge(
                    id=edge_id,
                    from_id=a,
                    to_id=b,
                    relation=draw(st.sampled_from(["related", "involved_in", "contradicts", "自定义"])),
                    strength=draw(st.floats(min_value=0.0, max_value=1.0)),
                    edge_type=draw(st.sampled_from([0, 255])),
                    valid_at=draw(st.none() | millis),
                    invalid_at=draw(st.none() | millis),
                    expired_at=draw(st.none() | millis),
                    created_time=draw(millis),
                    updated_at=draw(millis),
                    scope=draw(scope),
                    extra=draw(st.dictionaries(key, json_value, max_size=2)),
                )
            )
    return ns, es


