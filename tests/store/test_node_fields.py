"""The ``fields`` span of a stored node's JSON text (``store/node_fields.py``)."""

from __future__ import annotations

import json

from store_helpers import node

from memory_recall.store.node_fields import fields_span, same_fields
from memory_recall.store.sqlite import _dumps


def test_the_fields_span_is_the_top_level_one() -> None:
    """The ``fields`` compared are the node's own, whatever its values hold: a nested ``fields`` key, a value
    quoting ``"fields":``; another value or order compares unequal."""
    tricky = node("t", title='say "fields": {}', extra={"fields": [1, 2]})
    text = _dumps(tricky, "node")
    assert fields_span(text) == '"fields":' + json.dumps(tricky.fields, ensure_ascii=False, separators=(",", ":"))
    moved = _dumps(tricky.model_copy(update={"seq": 9, "next_id": "u"}), "node")
    assert same_fields(text, moved)
    assert not same_fields(text, _dumps(node("t", extra={"fields": [1, 2]}, title='say "fields": {}'), "node"))
    assert not same_fields(text, _dumps(node("t", title='say "fields": {}', extra={"fields": [2, 1]}), "node"))


def test_without_a_fields_span_nothing_is_the_same() -> None:
    assert fields_span("{}") is None
    assert fields_span('{"id":"a","fields":{"title":') is None  # cut mid-value
    assert not same_fields("{}", "{}")  # no fields to compare: treated as changed
    assert not same_fields('{"fields":{"a":1', '{"fields":{"a":1')
