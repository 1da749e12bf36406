"""The ``fields`` of a stored node's JSON text, compared without parsing the node.

A node's JSON column is written by one serializer (``sqlite._dumps``: pydantic's, deterministic, keys in model
order), so two texts hold the same ``Node.fields`` in the same order at every depth exactly when their
``"fields":{...}`` spans are the same text. What reads only the fields (the FTS columns, the lexical field
table) can then keep what it made of a node that was rewritten with its fields unchanged: a chat turn rewrites
the previous message (its link to the new one) and the owners it mentions (their floor ranges), not their text.
"""

from __future__ import annotations

import json

__all__ = ["fields_span", "same_fields"]

_JSON_DECODER = json.JSONDecoder()


def fields_span(text: str) -> str | None:
    """The ``"fields":{...}`` span of a node's JSON text, ``None`` when it cannot be found. The first
    ``"fields":`` is the top-level key: only ``id`` and ``type`` come before it, and inside a JSON string the
    quotes are escaped."""
    at = text.find('"fields":')
    if at < 0:
        return None
    try:
        _, end = _JSON_DECODER.raw_decode(text, at + len('"fields":'))
    except ValueError:
        return None
    return text[at:end]


def same_fields(old_json: str, new_json: str) -> bool:
    """Whether two node JSON texts hold the same ``fields`` in the same order at every depth; ``False`` when
    either has none to compare (the caller then treats the fields as changed)."""
    old = fields_span(old_json)
    return old is not None and old == fields_span(new_json)
