"""Per-type memory tables of the injection block (reference §4.2).

A table is ``<tableName>:``, a header row, a ``---`` row and one row per node::

    event_table:
    | story_time | summary |
    | --- | --- |
    | 第二天清晨 · ongoing | 艾琳在钟楼发现了地下入口 |

Columns
    Derived columns first — ``owner`` for ``pov_memory`` (``角色: <name>`` / ``用户: <name>`` / ``POV: <name>``,
    name = owner name, else owner id, else ``未命名``; in English blocks ``Character:`` / ``User:`` and
    ``unnamed``, see :mod:`injector.labels`); ``story_time`` for ``event`` / ``pov_memory`` and
    ``story_time_span`` for ``thread`` / ``synopsis`` / ``reflection`` when ``inject_story_time_label`` is on and at
    least one row has a label — then the schema columns, in schema order, that at least one row fills with a value
    other than null/missing/``""``.
Cells
    The JavaScript ``String(value)`` of the value (missing/null → empty, lists joined by ``","`` without spaces,
    objects ``[object Object]``, booleans ``true``/``false``, numbers as JS prints them: ``5.0`` → ``5``), then
    ``|`` → ``\\|`` and ``\\n`` → space (``\\r`` untouched), then cut to the first ``cell_chars`` UTF-16 units —
    after escaping, as the reference does, so a cut may split an escape.

Nodes are plain dicts as :meth:`memory_recall.model.graph.Node.model_dump` writes them (``RecallResult.nodes``);
camelCase keys of raw ST-BME nodes (``storyTime``, ``ownerName``…) are read too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict

from memory_recall.model.graph import NodeTypeSpec
from memory_recall.text.normalize import cut_js

from .labels import ZH, Labels

__all__ = [
    "InjectionTable",
    "as_node_dict",
    "build_table",
    "format_cell",
    "js_number",
    "js_string",
    "node_id",
    "node_type",
    "owner_cell",
    "row_line",
    "story_span_label",
    "story_time_label",
    "table_lines",
]

#: Derived ``story_time`` column (reference §4.2).
STORY_TIME_TYPES = frozenset({"event", "pov_memory"})
#: Derived ``story_time_span`` column (reference §4.2).
STORY_SPAN_TYPES = frozenset({"thread", "synopsis", "reflection"})


class InjectionTable(BaseModel):
    """One rendered table: its type, name, columns and cell rows (``node_ids[i]`` is the node of ``rows[i]``).
    ``heading`` is the legacy layout's ``## …`` group heading the table sits under (empty elsewhere)."""

    model_config = ConfigDict(frozen=True)

    type: str
    table_name: str
    columns: list[str]
    rows: list[list[str]]
    node_ids: list[str]
    heading: str = ""


# --- node access --------------------------------------------------------------------------------------------------


def as_node_dict(node: Any) -> dict[str, Any]:
    """A node (pydantic model or mapping) as a plain dict."""
    if isinstance(node, BaseModel):
        return node.model_dump(mode="json")
    if isinstance(node, Mapping):
        return dict(node)
    raise TypeError(f"a node must be a mapping or a pydantic model, got {type(node).__name__}")


def _get(obj: Any, *keys: str) -> Any:
    if not isinstance(obj, Mapping):
        return None
    for key in keys:
        if key in obj and obj[key] is not None:
            return obj[key]
    return None


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def node_id(node: Mapping[str, Any]) -> str:
    return str(node.get("id", ""))


def node_type(node: Mapping[str, Any]) -> str:
    return str(node.get("type", ""))


def story_time_label(node: Mapping[str, Any]) -> str:
    """``describeStoryTime`` of the node's point story time: label, plus `` · <tense>`` when the tense is known."""
    st = _get(node, "story_time", "storyTime")
    label = _text(_get(st, "label"))
    if not label:
        return ""
    tense = _text(_get(st, "tense"))
    return f"{label} · {tense}" if tense and tense != "unknown" else label


def story_span_label(obj: Mapping[str, Any]) -> str:
    """``describeStoryTimeSpan`` of a node's or summary entry's span: ``start -> end`` when both exist and
    differ, else whichever exists."""
    span = _get(obj, "story_time_span", "storyTimeSpan")
    start = _text(_get(span, "start_label", "startLabel"))
    end = _text(_get(span, "end_label", "endLabel"))
    if start and end and start != end:
        return f"{start} -> {end}"
    return start or end


def scope_owner(node: Mapping[str, Any]) -> tuple[str, str, str]:
    """``(owner_type, owner_name, owner_id)`` of the node's scope (empty strings when missing)."""
    scope = _get(node, "scope")
    return (
        _text(_get(scope, "owner_type", "ownerType")),
        _text(_get(scope, "owner_name", "ownerName")),
        _text(_get(scope, "owner_id", "ownerId")),
    )


def owner_cell(node: Mapping[str, Any], labels: Labels = ZH) -> str:
    """The derived ``owner`` value of a ``pov_memory`` row: ``<prefix>: <name>`` with ``labels``' prefix for the
    owner type (``POV`` for any other type) and name (owner name, else id, else ``labels.unnamed_owner``)."""
    owner_type, name, oid = scope_owner(node)
    prefix = labels.owner_prefix.get(owner_type, "POV")
    return f"{prefix}: {name or oid or labels.unnamed_owner}"


# --- JavaScript string conversion ---------------------------------------------------------------------------------


def js_number(value: float | int) -> str:
    """``String(number)`` as JavaScript prints it (``Number::toString``): shortest round-trip digits, plain
    notation for exponents in (-7, 21), ``1e+21`` / ``1e-7`` style otherwise."""
    if isinstance(value, int) and abs(value) <= 2**53:  # beyond 2**53 a JS number is a rounded double
        return str(value)
    x = float(value)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    _, digits_t, exponent = Decimal(repr(abs(x))).as_tuple()
    assert isinstance(exponent, int)
    # value = 0.<digits> × 10**n: the (s, k, n) of ECMAScript Number::toString.
    n = exponent + len(digits_t)
    digits = "".join(map(str, digits_t)).rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = f"{digits[:n]}.{digits[n:]}"
    elif -6 < n <= 0:
        out = f"0.{'0' * -n}{digits}"
    else:
        e = n - 1
        mantissa = digits if k == 1 else f"{digits[0]}.{digits[1:]}"
        out = f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"
    return sign + out


def js_string(value: Any) -> str:
    """JavaScript ``String(value)`` of a JSON value, except that null/missing is empty (reference §4.2). Inside
    lists, null items are empty too (``Array.prototype.join``) and nested lists join recursively."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return js_number(value)
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return "[object Object]"
    if isinstance(value, list | tuple):
        return ",".join(js_string(item) for item in value)
    return str(value)


def format_cell(value: Any, cell_chars: int) -> str:
    """One table cell: string form, ``|`` escaped, ``\\n`` → space, cut to ``cell_chars`` UTF-16 units."""
    text = js_string(value).replace("|", "\\|").replace("\n", " ")
    return cut_js(text, cell_chars)


def _filled(value: Any) -> bool:
    return value is not None and value != ""


# --- tables -------------------------------------------------------------------------------------------------------


def build_table(
    spec: NodeTypeSpec,
    nodes: Sequence[Mapping[str, Any]],
    *,
    cell_chars: int,
    story_time_labels: bool,
    heading: str = "",
    labels: Labels = ZH,
) -> InjectionTable:
    """The table of ``nodes`` (all of type ``spec.id``), rows in the given order; ``labels`` words the derived
    ``owner`` cells (default: the reference's Chinese)."""
    derived: list[tuple[str, Any]] = []
    if spec.id == "pov_memory":
        derived.append(("owner", lambda n: owner_cell(n, labels)))
    if story_time_labels and spec.id in STORY_TIME_TYPES and any(story_time_label(n) for n in nodes):
        derived.append(("story_time", story_time_label))
    if story_time_labels and spec.id in STORY_SPAN_TYPES and any(story_span_label(n) for n in nodes):
        derived.append(("story_time_span", story_span_label))
    fields: list[Mapping[str, Any]] = []
    for n in nodes:
        f = n.get("fields")
        fields.append(f if isinstance(f, Mapping) else {})
    shown = [c for c in spec.columns if any(_filled(f.get(c)) for f in fields)]
    rows = [
        [format_cell(fn(n), cell_chars) for _, fn in derived] + [format_cell(f.get(c), cell_chars) for c in shown]
        for n, f in zip(nodes, fields, strict=True)
    ]
    return InjectionTable(
        type=spec.id,
        table_name=spec.table_name,
        columns=[name for name, _ in derived] + shown,
        rows=rows,
        node_ids=[node_id(n) for n in nodes],
        heading=heading,
    )


def row_line(cells: Iterable[str]) -> str:
    return f"| {' | '.join(cells)} |"


def table_lines(table: InjectionTable) -> list[str]:
    """The text lines of ``table``."""
    return [
        f"{table.table_name}:",
        row_line(table.columns),
        row_line("---" for _ in table.columns),
        *(row_line(r) for r in table.rows),
    ]
