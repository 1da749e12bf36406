"""Schemathesis hooks of ``test_service_schemathesis.py`` (not a test module; loaded by the schemathesis run
through its ``hooks`` setting, with tests/service on ``PYTHONPATH``).

The service's OpenAPI schema states every rule of a request that JSON Schema can state. A few it cannot; each is
written in the schema's descriptions, refused with a 422 naming the field, and tested on its own in
``test_service_schemathesis.py``. :func:`map_case` makes *positive* cases (the ones schemathesis expects to be
accepted) obey them and leaves negative cases as generated:

* a number with a zero fraction (``4.0``) is an integer to JSON Schema but not to the service, which takes an
  integer only as an integer literal: such numbers become integers;
* recall and re-recall ``messages``: floors ascending, each once; the target floor, when among them, a user
  message;
* sync ``messages``: floors ``0 … n-1``, each once; a ``message_added`` batch: each floor once;
* a node's ``seq_range`` starts at or before its end; an edge joins two different nodes.
"""

from __future__ import annotations

from typing import Any

import schemathesis
from schemathesis import Case, GenerationMode, HookContext


def integral(value: Any) -> Any:
    """``value`` with every float that has no fraction turned into an int (recursively)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [integral(v) for v in value]
    if isinstance(value, dict):
        return {k: integral(v) for k, v in value.items()}
    return value


def _messages_in_order(messages: Any, target: Any) -> Any:
    if not isinstance(messages, list) or not all(isinstance(m, dict) and isinstance(m.get("floor"), int)
                                                  for m in messages):
        return messages
    by_floor: dict[int, dict[str, Any]] = {}
    for m in messages:
        by_floor.setdefault(m["floor"], m)
    ordered = [by_floor[f] for f in sorted(by_floor)]
    if isinstance(target, int) and target in by_floor:
        by_floor[target]["role"] = "user"
    return ordered


def _other_id(node_id: str) -> str:
    return node_id[:-1] + ("a" if node_id[-1] != "a" else "b")


def repair(method: str, path: str, body: Any, path_parameters: dict[str, Any]) -> Any:
    """A positive ``body`` of ``method path`` made to obey the rules listed in the module docstring."""
    body = integral(body)
    if not isinstance(body, dict):
        return body
    if (method, path) == ("POST", "/v1/recall") and "messages" in body:
        body["messages"] = _messages_in_order(body["messages"], body.get("target_user_floor"))
    elif (method, path) == ("POST", "/v1/chats/{chat_id}/records/{floor}/rerecall") and "messages" in body:
        floor = path_parameters.get("floor")
        target = int(floor) if isinstance(floor, str) and floor.isdigit() else floor
        body["messages"] = _messages_in_order(body["messages"], target)
    elif (method, path) == ("POST", "/v1/chats/{chat_id}/sync") and isinstance(body.get("messages"), list):
        for floor, message in enumerate(body["messages"]):
            if isinstance(message, dict):
                message["floor"] = floor
    elif (method, path) == ("POST", "/v1/chats/{chat_id}/events") and isinstance(body.get("messages"), list):
        body["messages"] = _messages_in_order(body["messages"], None)
    elif (method, path) == ("POST", "/v1/chats/{chat_id}/nodes") and isinstance(body.get("nodes"), list):
        for node in body["nodes"]:
            seq_range = node.get("seq_range") if isinstance(node, dict) else None
            if isinstance(seq_range, list) and len(seq_range) == 2 and all(isinstance(x, int) for x in seq_range):
                node["seq_range"] = sorted(seq_range)
    elif (method, path) == ("POST", "/v1/chats/{chat_id}/edges") and isinstance(body.get("edges"), list):
        for edge in body["edges"]:
            if isinstance(edge, dict) and isinstance(edge.get("from_id"), str) and edge.get("from_id"):
                if edge.get("to_id") == edge["from_id"]:
                    edge["to_id"] = _other_id(edge["from_id"])
    return body


@schemathesis.hook
def map_case(context: HookContext, case: Case) -> Case:
    if case.meta is None or case.meta.generation.mode != GenerationMode.POSITIVE:
        return case
    body = case.body
    if isinstance(body, dict | list):
        case.body = repair(case.method.upper(), case.operation.path, body, dict(case.path_parameters or {}))
    return case
