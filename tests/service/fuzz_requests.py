"""Request generators for fuzzing the service from its ``/openapi.json`` (not a test module; shared by
``test_service_fuzz.py`` and ``scripts/fuzz_service.py``, which import it as ``from fuzz_requests import ...``).

Two families of requests:

* :func:`request_for` — a body drawn from the operation's JSON schema (in and out of its bounds), random JSON,
  random bytes or no body, with hostile path values;
* :func:`hostile_request` — the same request made hostile on purpose: control characters (NUL included) or very
  long strings in one string field, ``NaN``/``Infinity`` written as raw JSON tokens, deep nesting, wrong content
  types, path-like and empty chat ids.

Every request is a ``(url, kwargs)`` pair for :meth:`httpx.Client.request`. ``chat_ids`` chooses the chat ids a
request may address; callers that must keep one chat untouched pass a strategy without it (see
:func:`chat_id_strategy`) and a ``body_chat`` other than it.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st

FUZZ_CHAT = "fz"

json_leaf = st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False) | st.text(max_size=20)
any_json = st.recursive(
    json_leaf, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4),
    max_leaves=12,
)


def from_schema(schema: dict[str, Any], spec: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """A strategy for values of one JSON schema; mostly valid, sometimes just outside a bound."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return st.deferred(lambda: from_schema(spec["components"]["schemas"][name], spec, depth + 1))
    if depth > 6:
        return json_leaf
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([from_schema(s, spec, depth + 1) for s in schema[key]])
    if "allOf" in schema:
        return from_schema(schema["allOf"][0], spec, depth + 1)
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "string":
        hi = min(int(schema.get("maxLength", 40)), 40)
        lo = min(int(schema.get("minLength", 0)), hi)
        return st.text(min_size=lo, max_size=hi) | st.sampled_from(["", " ", "..", "a/b", "\x00", "msg:0", "é漢字"])
    if kind in ("integer", "number"):
        low: Any = schema.get("minimum")
        high: Any = schema.get("maximum")
        edges = [v for v in (low, high) if v is not None]
        edges += [v - 1 for v in edges if v == low] + [v + 1 for v in edges if v == high]
        ints = st.integers(low, high) if kind == "integer" else st.floats(low, high, allow_nan=False)
        return ints | st.sampled_from(edges or [0])
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        items = from_schema(schema.get("items", {}), spec, depth + 1)
        if "prefixItems" in schema:
            return st.tuples(*[from_schema(s, spec, depth + 1) for s in schema["prefixItems"]]).map(list)
        return st.lists(items, min_size=min(int(schema.get("minItems", 0)), 3), max_size=3)
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        required = set(schema.get("required", ()))
        fixed = {k: from_schema(v, spec, depth + 1) for k, v in props.items() if k in required}
        optional = {k: from_schema(v, spec, depth + 1) for k, v in props.items() if k not in required}
        base = st.fixed_dictionaries(fixed, optional=optional)
        if not props:
            return st.dictionaries(st.text(max_size=10), any_json, max_size=4)
        return base
    return any_json


def operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """Every ``(METHOD, path template, operation)`` of the schema, sorted by path then method."""
    return [
        (method.upper(), path, op)
        for path, item in sorted(spec["paths"].items())
        for method, op in sorted(item.items())
    ]


HOSTILE_CHAT_IDS = ["nobody", "..", ".x", " a", "a b", "漢字", "x" * 129, "%2F", "a:b@c"]


def chat_id_strategy(named: str | None = FUZZ_CHAT, *, exclude: str | None = None) -> st.SearchStrategy[str]:
    """Chat ids for the path: ``named`` (a chat the caller may write to), hostile ids and random text.

    ``exclude`` never comes out (random text equal to it is replaced by ``named`` or ``"nobody"``).
    """
    fixed = ([named] if named else []) + HOSTILE_CHAT_IDS
    ids = st.sampled_from(fixed) | st.text(min_size=1, max_size=20)
    if exclude is None:
        return ids
    fallback = named or "nobody"
    return ids.map(lambda c: fallback if c == exclude else c)


chat_ids = chat_id_strategy()
floors = st.sampled_from(["0", "1", "4", "-1", "10000001", "x", "1.5", "99999999999999999999"]) | st.integers(
    0, 30
).map(str)


def request_for(
    data: st.DataObject, method: str, path: str, op: dict[str, Any], spec: dict[str, Any], *,
    chat_ids: st.SearchStrategy[str] = chat_ids, body_chat: str = FUZZ_CHAT, protect: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """One generated request for an operation: hostile path values and a schema / JSON / bytes / empty body.

    A body's top-level ``chat_id`` is half the time replaced by ``body_chat`` (so valid requests reach a real
    chat); otherwise it is whatever the schema strategy drew, except ``protect`` (replaced by ``body_chat``: hypothesis
    also draws string constants it finds in the calling code).
    """
    url = path
    if "{chat_id}" in url:
        url = url.replace("{chat_id}", quote(data.draw(chat_ids), safe=""))
    if "{floor}" in url:
        url = url.replace("{floor}", data.draw(floors))
    kwargs: dict[str, Any] = {}
    body_schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if body_schema is not None or method in ("POST", "PUT", "DELETE"):
        shape = data.draw(st.sampled_from(["schema", "schema", "schema", "json", "bytes", "none"]))
        if shape == "schema" and body_schema is not None:
            body = data.draw(from_schema(body_schema, spec))
            if isinstance(body, dict) and "chat_id" in body:
                if data.draw(st.booleans()) or body["chat_id"] == protect:
                    body["chat_id"] = body_chat
            kwargs["content"] = json.dumps(body).encode()
        elif shape == "json":
            kwargs["content"] = json.dumps(data.draw(any_json)).encode()
        elif shape == "bytes":
            kwargs["content"] = data.draw(st.binary(max_size=64))
        if "content" in kwargs:
            kwargs["headers"] = {"content-type": data.draw(st.sampled_from(["application/json", "text/plain"]))}
    return url, kwargs


# -- hostile variants --------------------------------------------------------------------------------------------

HOSTILE_KINDS = ("control", "long", "nonfinite", "deep", "content_type", "chat_path")
#: C0 controls (NUL included), DEL, C1, lone surrogates are not encodable and are left out.
CONTROL_CHARS = "".join(chr(c) for c in [*range(0x20), 0x7F, 0x85, 0x2028, 0x2029, 0xFEFF])
#: 200,000 is the service's message text limit; one just above and one far above.
LONG_SIZES = (200_001, 1_000_000, 70_000)
NONFINITE = ("NaN", "Infinity", "-Infinity")
WRONG_CONTENT_TYPES = (
    "text/plain", "application/xml", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
    "application/json; charset=utf-16", "application/octet-stream", "", "application/jsonx", "*/*",
)
#: Path-like, empty and odd chat ids, written into the URL as-is (not percent-encoded: that is the point).
PATH_CHAT_IDS = (
    "", "/", ".", "..", "../..", "%2e%2e", "%2E%2E%2F%2E%2E", "a/../b", "..%2F..%2Fetc", "%00", "a%00b", "%0A",
    "%20", "~", "C:%5Cwindows", "%2F%2Fetc%2Fpasswd", "a;b", "a?b=c", "a#b", "%FF%FE", "x" * 5000,
)


def _leaves(value: Any, kinds: tuple[type, ...], at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths (key / index tuples) of every leaf of ``value`` whose type is one of ``kinds`` (bool excluded)."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _leaves(v, kinds, (*at, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _leaves(v, kinds, (*at, i))]
    return [at] if isinstance(value, kinds) and not isinstance(value, bool) else []


def _replace(value: Any, at: tuple[Any, ...], new: Any) -> Any:
    if not at:
        return new
    value[at[0]] = _replace(value[at[0]], at[1:], new)
    return value


def hostile_request(
    data: st.DataObject, method: str, path: str, op: dict[str, Any], spec: dict[str, Any], *,
    chat_ids: st.SearchStrategy[str] = chat_ids, body_chat: str = FUZZ_CHAT, kind: str | None = None,
    protect: str | None = None,
) -> tuple[str, str, dict[str, Any]]:
    """``(kind, url, kwargs)``: a schema-shaped request for the operation made hostile in one way (``kind``, one of
    :data:`HOSTILE_KINDS`; drawn when not given). The body's top-level ``chat_id`` is ``body_chat`` or a path-like
    id, never ``protect``."""
    if kind is None:
        kind = data.draw(st.sampled_from(HOSTILE_KINDS))
    if kind not in HOSTILE_KINDS:
        raise ValueError(f"kind must be one of {HOSTILE_KINDS}; got {kind!r}")
    body_schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    url = path
    if "{chat_id}" in url:
        chat = quote(data.draw(chat_ids), safe="")
        if kind == "chat_path":
            chat = data.draw(st.sampled_from(PATH_CHAT_IDS))
        url = url.replace("{chat_id}", chat)
    if "{floor}" in url:
        url = url.replace("{floor}", data.draw(floors))
    body: Any = data.draw(from_schema(body_schema, spec)) if body_schema is not None else data.draw(any_json)
    if isinstance(body, dict) and "chat_id" in body:
        body["chat_id"] = body_chat if kind != "chat_path" else data.draw(st.sampled_from(PATH_CHAT_IDS))
    content_type = "application/json"
    raw: str | None = None
    if kind in ("control", "long"):
        spots = _leaves(body, (str,))
        if kind == "control":
            new = "".join(data.draw(st.lists(st.sampled_from(CONTROL_CHARS), min_size=1, max_size=8))) + "x\x00"
        else:
            new = data.draw(st.sampled_from("a漢\x00 ")) * data.draw(st.sampled_from(LONG_SIZES))
        body = _replace(body, data.draw(st.sampled_from(spots)), new) if spots else new
    elif kind == "nonfinite":
        # json.dumps writes float('nan') / inf as the bare tokens NaN / Infinity (not valid JSON: that is the point).
        token = data.draw(st.sampled_from(NONFINITE))
        spots = _leaves(body, (int, float))
        body = _replace(body, data.draw(st.sampled_from(spots)), float(token)) if spots else float(token)
        raw = json.dumps(body)
    elif kind == "deep":
        depth = data.draw(st.sampled_from([64, 1000, 5000, 100_000]))
        opener, closer = data.draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        nested = opener * depth + "1" + closer * depth
        spots = _leaves(body, (str, int, float))
        in_field: bool = data.draw(st.booleans())
        if spots and in_field:
            marker = "\ue000deep\ue000"
            raw = json.dumps(_replace(body, data.draw(st.sampled_from(spots)), marker)).replace(
                json.dumps(marker), nested, 1
            )
        else:
            raw = nested
    elif kind == "content_type":
        content_type = data.draw(st.sampled_from(WRONG_CONTENT_TYPES))
    if raw is None:
        raw = json.dumps(body)
    content = raw.encode("utf-16") if content_type.endswith("utf-16") else raw.encode("utf-8", "surrogatepass")
    headers = {"content-type": content_type} if content_type else {}
    return kind, url, {"content": content, "headers": headers}
