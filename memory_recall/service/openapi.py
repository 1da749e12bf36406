"""The service's OpenAPI document: FastAPI's, completed where a pydantic model cannot say it.

Usage::

    install_openapi(app)          # after the routes are added; /openapi.json then serves the completed document

What :func:`complete_openapi` adds:

* ``components.schemas.ChatId``: the chat id rules of :func:`~memory_recall.store.sqlite.validate_chat_id` as a
  length and a pattern (:func:`~memory_recall.store.sqlite.chat_id_pattern`, about 5,500 characters); every
  ``chat_id`` path parameter and every schema carrying that pattern refers to it instead of repeating it.
* ``components.schemas.JsonValue`` … ``JsonValue8``: a JSON value whose strings hold no NUL, nested at most
  :data:`JSON_MAX_DEPTH` levels below the value (what :class:`~memory_recall.model.graph.Node` accepts in
  ``fields``/``extra``): ``JsonValue<d>`` is a value at depth ``d``; at depth 8 an array or object must be empty.
* a ``400`` response on every operation that reads a body (a body that is not JSON text at all: not UTF-8, or
  nested too deeply for the parser).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from memory_recall.model.chat import NUL_FREE_SCHEMA
from memory_recall.store.sqlite import MAX_CHAT_ID_LENGTH, chat_id_pattern

__all__ = ["CHAT_ID_REF", "JSON_MAX_DEPTH", "JSON_VALUE_REF", "complete_openapi", "install_openapi", "json_value_ref"]

#: Deepest nesting of a node's field value (``_check_json_value``: a value at depth 9 is refused).
JSON_MAX_DEPTH = 8
CHAT_ID_REF = "#/components/schemas/ChatId"
JSON_VALUE_REF = "#/components/schemas/JsonValue"

_BAD_BODY = {
    "description": "The body is not JSON text (not UTF-8, or nested too deeply for the parser)",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
}


def json_value_ref(depth: int = 0) -> str:
    """The component of a JSON value at ``depth`` (0: the value itself)."""
    return JSON_VALUE_REF if depth == 0 else f"{JSON_VALUE_REF}{depth}"


def _json_value(depth: int) -> dict[str, Any]:
    scalars: list[dict[str, Any]] = [
        {"type": "string", **NUL_FREE_SCHEMA},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "null"},
    ]
    if depth >= JSON_MAX_DEPTH:
        containers: list[dict[str, Any]] = [{"type": "array", "maxItems": 0}, {"type": "object", "maxProperties": 0}]
    else:
        inner = {"$ref": json_value_ref(depth + 1)}
        containers = [{"type": "array", "items": inner}, {"type": "object", "additionalProperties": inner}]
    return {"anyOf": scalars + containers}


def _refer(node: Any, pattern: str) -> Any:
    """``node`` with every schema that carries the chat id pattern replaced by a reference to ``ChatId``."""
    if isinstance(node, list):
        return [_refer(item, pattern) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("pattern") == pattern:
        return {"$ref": CHAT_ID_REF, **{k: v for k, v in node.items() if k in ("description", "examples")}}
    return {k: _refer(v, pattern) for k, v in node.items()}


def complete_openapi(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (FastAPI's document, changed in place and returned) completed as the module docstring says."""
    pattern = chat_id_pattern()
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in list(components):
        components[name] = _refer(components[name], pattern)
    components["ChatId"] = {
        "type": "string", "minLength": 1, "maxLength": MAX_CHAT_ID_LENGTH, "pattern": pattern,
        "description": "Letters, decimal digits, spaces and _ - . : @; no leading or trailing space, no leading dot, "
        "no '..'.",
    }
    for depth in range(JSON_MAX_DEPTH + 1):
        components[json_value_ref(depth).rsplit("/", 1)[1]] = _json_value(depth)
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for param in operation.get("parameters", []):
                if param.get("name") == "chat_id" and param.get("in") == "path":
                    param["schema"] = {"$ref": CHAT_ID_REF}
            if "requestBody" in operation:
                responses = operation.setdefault("responses", {})
                responses.setdefault("400", _BAD_BODY)
                operation["requestBody"] = _refer(operation["requestBody"], pattern)
    return schema


def install_openapi(app: FastAPI) -> None:
    """Serve :func:`complete_openapi` of the app's generated document (built once, on first use)."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = complete_openapi(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
