"""The memory graph: node types, nodes, edges and memory scopes (stbme-reference §1.2–§1.4).

Field names are Python-style (``seq_range``, ``created_time``); the ST-BME importer maps the reference's camelCase
export onto them. Every model is a pydantic v2 model; invalid data raises :class:`~memory_recall.errors.InputError`
through :func:`parse_node` / :func:`parse_edge` (or pydantic's ``ValidationError`` when the classes are used
directly), naming the field and the reason.

Time stamps are integers in milliseconds since the epoch, as in the reference.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from memory_recall.errors import InputError

__all__ = [
    "ANCHOR_FIELDS",
    "CORE_TYPES",
    "DEFAULT_SCHEMA",
    "EMBEDDING_TEXT_KEYS",
    "ID_PATTERN",
    "INHIBIT_EDGE_TYPE",
    "MAX_ID_LENGTH",
    "NODE_TYPES",
    "PRIMARY_LEXICAL_FIELDS",
    "SECONDARY_LEXICAL_FIELDS",
    "Edge",
    "FieldValue",
    "MemoryScope",
    "Node",
    "NodeTypeSpec",
    "StoryTime",
    "StoryTimeSpan",
    "anchor_terms",
    "describe_memory_scope",
    "embedding_text",
    "first_validation_error",
    "parse_edge",
    "parse_node",
    "split_region_tokens",
    "validate_id",
]

#: Edge type of inhibit edges (reference §1.3): diffusion pushes negative energy through them.
INHIBIT_EDGE_TYPE = 255
MAX_ID_LENGTH = 128

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: JSON Schema ``pattern`` of the ids :func:`validate_id` accepts (with ``maxLength`` :data:`MAX_ID_LENGTH`): no
#: control character and at least one character that is neither one nor white space (``str.strip``'s set).
ID_PATTERN = (
    r"^[^\x00-\x1f\x7f]*"
    r"[^\x00-\x20\x7f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
    r"[^\x00-\x1f\x7f]*$"
)


def validate_id(value: str, field: str = "id") -> str:
    """Return ``value`` if it is a usable node/edge id: 1–128 characters, no control characters."""
    if not isinstance(value, str):
        raise InputError(field, f"must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InputError(field, "must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise InputError(field, f"must be at most {MAX_ID_LENGTH} characters, got {len(value)}")
    if _CONTROL.search(value):
        raise InputError(field, "must not contain control characters")
    return value


def _id_check(value: str) -> str:
    try:
        return validate_id(value)
    except InputError as exc:
        raise ValueError(exc.reason) from None


NodeId = Annotated[
    StrictStr, AfterValidator(_id_check), Field(json_schema_extra={"pattern": ID_PATTERN, "maxLength": MAX_ID_LENGTH})
]


class NodeTypeSpec(BaseModel):
    """One node type of the schema: its table name, ordered columns and whether it is always injected."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    label: str
    table_name: str
    columns: tuple[str, ...]
    always_inject: bool = False


#: ``DEFAULT_NODE_SCHEMA`` of the reference plus ``message``: raw chat turns ingested without an LLM.
DEFAULT_SCHEMA: tuple[NodeTypeSpec, ...] = (
    NodeTypeSpec(id="event", label="事件", table_name="event_table",
                 columns=("title", "summary", "participants", "status"), always_inject=True),
    NodeTypeSpec(id="character", label="角色", table_name="character_table",
                 columns=("name", "traits", "state", "goal", "inventory", "core_note")),
    NodeTypeSpec(id="location", label="地点", table_name="location_table",
                 columns=("name", "state", "features", "danger")),
    NodeTypeSpec(id="rule", label="规则", table_name="rule_table",
                 columns=("title", "constraint", "scope", "status"), always_inject=True),
    NodeTypeSpec(id="thread", label="主线", table_name="thread_table",
                 columns=("title", "summary", "status"), always_inject=True),
    NodeTypeSpec(id="synopsis", label="全局概要（旧）", table_name="synopsis_table",
                 columns=("summary", "scope"), always_inject=True),
    NodeTypeSpec(id="reflection", label="反思", table_name="reflection_table",
                 columns=("insight", "trigger", "suggestion")),
    NodeTypeSpec(id="pov_memory", label="主观记忆", table_name="pov_memory_table",
                 columns=("summary", "belief", "emotion", "attitude", "certainty", "about")),
    # Not in the reference: one node per chat message, so recall works before (or without) LLM extraction.
    # Not always-injected: a long chat has thousands of them.
    NodeTypeSpec(id="message", label="消息", table_name="message_table",
                 columns=("speaker", "summary", "participants", "date")),
    # Not in the reference: a proper or quoted name found in chat messages, linked to the messages that mention
    # it, so names anchor recall before any LLM extraction has produced character/location nodes.
    NodeTypeSpec(id="entity", label="实体", table_name="entity_table",
                 columns=("name", "kind", "aliases", "summary")),
)
NODE_TYPES: tuple[str, ...] = tuple(spec.id for spec in DEFAULT_SCHEMA)
CORE_TYPES: frozenset[str] = frozenset(spec.id for spec in DEFAULT_SCHEMA if spec.always_inject)

#: Lexical roles (reference §1.2): primary fields weigh most in field matching.
PRIMARY_LEXICAL_FIELDS: tuple[str, ...] = ("name", "title")
SECONDARY_LEXICAL_FIELDS: tuple[str, ...] = (
    "summary", "insight", "state", "traits", "participants", "status",
)
#: Fields whose values become entity anchor terms (JS-length ≥ 2).
ANCHOR_FIELDS: tuple[str, ...] = ("name", "title")
#: Preferred key order of the embedding text (reference ``buildNodeVectorText``).
EMBEDDING_TEXT_KEYS: tuple[str, ...] = (
    "summary", "insight", "title", "name", "state", "traits", "constraint", "goal", "participants",
    "suggestion", "status", "scope",
)

FieldValue = str | int | float | bool | None | list[Any] | dict[str, Any]


def _check_json_value(value: Any, path: str, depth: int = 0) -> None:
    if depth > 8:
        raise ValueError(f"{path}: nested deeper than 8 levels")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{path}: must be a finite number")
    if isinstance(value, str) and "\x00" in value:
        raise ValueError(f"{path}: must not contain NUL characters")
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_json_value(item, f"{path}[{i}]", depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{path}: keys must be strings")
            _check_json_value(item, f"{path}.{key}", depth + 1)
    elif value is not None and not isinstance(value, str | int | float | bool):
        raise ValueError(f"{path}: unsupported value of type {type(value).__name__}")


# ---------------------------------------------------------------------------------------------------------------
# Memory scope (reference §1.4)
# ---------------------------------------------------------------------------------------------------------------

_REGION_ARROWS = re.compile(r"[＞>→]")
_REGION_SPLIT = re.compile(r"[,\n，/\\、；;|]")
_REGION_OBJECT_KEYS = ("name", "title", "label", "value", "text")


def split_region_tokens(value: Any) -> list[str]:
    """Region tokens of one scope field: strings split on ``, \\n ， / \\ 、 ； ; |`` (arrows become ``/``),
    objects contribute their name/title/label/value/text, lists are flattened; trimmed, deduped
    case-insensitively in first-occurrence order."""
    raw: list[str] = []
    # Depth first, left to right, with a stack of its own: a nested function calling itself would make a reference
    # cycle per call, which only the cyclic garbage collector frees (every node parse builds a scope).
    stack = [value]
    while stack:
        item = stack.pop()
        if item is None:
            continue
        if isinstance(item, list | tuple):
            stack.extend(reversed(item))
            continue
        if isinstance(item, dict):
            for key in _REGION_OBJECT_KEYS:
                if isinstance(item.get(key), str) and item[key].strip():
                    stack.append(item[key])
                    break
            continue
        text = _REGION_ARROWS.sub("/", str(item))
        raw.extend(_REGION_SPLIT.split(text))
    seen: set[str] = set()
    out: list[str] = []
    for token in raw:
        t = token.strip()
        if t and t.lower() not in seen:
            seen.add(t.lower())
            out.append(t)
    return out


class MemoryScope(BaseModel):
    """Who a memory belongs to and where it happened (reference §1.4), normalised on construction.

    ``layer`` is ``"pov"`` (a character's or the user's subjective memory) or ``"objective"``. Owner fields are
    blank on the objective layer. ``region_primary`` is the last token of the primary region; it is appended to
    ``region_path`` when missing; ``region_secondary`` never repeats the primary or a path element.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    layer: Literal["objective", "pov"] = "objective"
    owner_type: Literal["", "character", "user"] = ""
    owner_id: str = ""
    owner_name: str = ""
    region_primary: str = ""
    region_path: tuple[str, ...] = ()
    region_secondary: tuple[str, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        d = dict(data)
        layer = "pov" if d.get("layer") == "pov" else "objective"
        owner_type = d.get("owner_type") if layer == "pov" else ""
        if owner_type not in ("character", "user"):
            owner_type = ""
        owner_name = str(d.get("owner_name") or "").strip() if owner_type else ""
        owner_id = str(d.get("owner_id") or "").strip() if owner_type else ""
        owner_id = owner_id or owner_name
        primary_tokens = split_region_tokens(d.get("region_primary"))
        path = split_region_tokens(d.get("region_path"))
        if len(primary_tokens) > 1 and not path:
            path = list(primary_tokens)
        primary = primary_tokens[-1] if primary_tokens else (path[-1] if path else "")
        if primary and primary.lower() not in {p.lower() for p in path}:
            path.append(primary)
        taken = {primary.lower(), *(p.lower() for p in path)}
        secondary = [s for s in split_region_tokens(d.get("region_secondary")) if s.lower() not in taken]
        return {
            "layer": layer,
            "owner_type": owner_type,
            "owner_id": owner_id,
            "owner_name": owner_name,
            "region_primary": primary,
            "region_path": tuple(path),
            "region_secondary": tuple(secondary),
        }

    @property
    def owner_key(self) -> str:
        """``"<ownerType>:<lowercase owner id or name>"``; empty on the objective layer."""
        if self.layer != "pov" or not self.owner_type:
            return ""
        who = (self.owner_id or self.owner_name).lower()
        return f"{self.owner_type}:{who}" if who else ""

    def region_tokens(self) -> list[str]:
        """Primary, then path, then secondary regions, deduped case-insensitively."""
        seen: set[str] = set()
        out: list[str] = []
        for token in (self.region_primary, *self.region_path, *self.region_secondary):
            if token and token.lower() not in seen:
                seen.add(token.lower())
                out.append(token)
        return out


def describe_memory_scope(scope: MemoryScope) -> str:
    """``describeMemoryScope``: ``客观``/``POV``, then ``<ownerType>:<name>``, then ``地区:<primary>``."""
    parts = ["POV" if scope.layer == "pov" else "客观"]
    if scope.layer == "pov" and scope.owner_type:
        parts.append(f"{scope.owner_type}:{scope.owner_name or scope.owner_id}")
    if scope.region_primary:
        parts.append(f"地区:{scope.region_primary}")
    return " | ".join(parts)


# ---------------------------------------------------------------------------------------------------------------
# Story time (reference §1.2, §1.7)
# ---------------------------------------------------------------------------------------------------------------


class StoryTime(BaseModel):
    """A node's point in story time."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    segment_id: StrictStr = ""
    label: StrictStr = ""
    tense: Literal["past", "ongoing", "future", "flashback", "hypothetical", "unknown"] = "unknown"
    relation: Literal["same", "after", "before", "parallel", "unknown"] = "unknown"
    anchor_label: StrictStr = ""
    confidence: Literal["high", "medium", "low"] = "medium"
    source: Literal["extract", "derived", "manual"] = "derived"

    def describe(self) -> str:
        """``describeStoryTime``: label plus `` · <tense>`` when the tense is known."""
        if not self.label:
            return ""
        return f"{self.label} · {self.tense}" if self.tense != "unknown" else self.label


class StoryTimeSpan(BaseModel):
    """The story-time span a summary-like node covers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    start_segment_id: StrictStr = ""
    end_segment_id: StrictStr = ""
    start_label: StrictStr = ""
    end_label: StrictStr = ""
    mixed: StrictBool = False
    source: Literal["extract", "derived", "manual"] = "derived"

    def describe(self) -> str:
        """``describeStoryTimeSpan``: ``start -> end`` when both exist and differ, else whichever exists."""
        if self.start_label and self.end_label and self.start_label != self.end_label:
            return f"{self.start_label} -> {self.end_label}"
        return self.start_label or self.end_label


# ---------------------------------------------------------------------------------------------------------------
# Nodes and edges
# ---------------------------------------------------------------------------------------------------------------

Millis = Annotated[StrictInt, Field(ge=0, le=253_402_300_799_999)]  # up to year 9999
Seq = Annotated[StrictInt, Field(ge=-1, le=10_000_000)]  # a floor, or -1: before the chat
# A range end: an integer a JavaScript host holds exactly (|n| < 2**53; the store packs both ends as int64). Not
# bounded like ``seq``: stores and ST-BME exports written before that bound may hold wider ranges (an ST-BME range is
# a JavaScript number, within these bounds), and they must stay readable.
RangeEnd = Annotated[StrictInt, Field(ge=-(2**53 - 1), le=2**53 - 1)]


class Node(BaseModel):
    """One memory (reference §1.2).

    ``seq_range`` is ``None`` when the node has no finite floor range: such nodes are never recall candidates
    (core nodes are still injected). ``evidence`` holds source locators (e.g. LoCoMo ``dia_id``s) of nodes built
    from chat messages. ``extra`` keeps unknown keys of imported data so an export round-trips them.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Strict scalar types (no "3" or true for a number, no number for a string): the store and the ST-BME
    # importer hand over typed values, and a request body must not be coerced either.
    id: NodeId
    type: StrictStr = Field(json_schema_extra={"enum": list(NODE_TYPES)})
    fields: dict[str, Any] = Field(default_factory=dict)
    seq: Seq = 0
    seq_range: tuple[RangeEnd, RangeEnd] | None = None
    archived: StrictBool = False
    importance: StrictFloat = Field(default=5.0, ge=0.0, le=10.0, allow_inf_nan=False)
    access_count: StrictInt = Field(default=0, ge=0)
    last_access_time: Millis = 0
    created_time: Millis = 0
    updated_at: Millis = 0
    level: StrictInt = Field(default=0, ge=0, le=64)
    parent_id: StrictStr | None = None
    child_ids: tuple[StrictStr, ...] = ()
    prev_id: StrictStr | None = None
    next_id: StrictStr | None = None
    scope: MemoryScope = Field(default_factory=MemoryScope)
    story_time: StoryTime = Field(default_factory=StoryTime)
    story_time_span: StoryTimeSpan = Field(default_factory=StoryTimeSpan)
    evidence: tuple[StrictStr, ...] = ()
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if value not in NODE_TYPES:
            raise ValueError(f"unknown node type {value!r}; expected one of {', '.join(NODE_TYPES)}")
        return value

    @field_validator("fields", "extra")
    @classmethod
    def _json_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key, item in value.items():
            if not isinstance(key, str) or not key:
                raise ValueError("keys must be non-empty strings")
            _check_json_value(item, key)
        return value

    @model_validator(mode="after")
    def _default_range(self) -> Node:
        if self.seq_range is None and "seq_range" not in self.model_fields_set:
            object.__setattr__(self, "seq_range", (self.seq, self.seq))
        if self.seq_range is not None and self.seq_range[0] > self.seq_range[1]:
            raise ValueError(f"seq_range start {self.seq_range[0]} is after its end {self.seq_range[1]}")
        return self

    @property
    def recency(self) -> int:
        """``seqRange[1]``, falling back to ``seq`` (reference: "recency")."""
        return self.seq_range[1] if self.seq_range is not None else self.seq

    def field_text(self, key: str) -> list[str]:
        """Non-empty string values of one field (a list contributes each non-empty string)."""
        value = self.fields.get(key)
        if isinstance(value, str):
            return [value] if value.strip() else []
        if isinstance(value, list):
            return [v for v in value if isinstance(v, str) and v.strip()]
        if isinstance(value, int | float) and not isinstance(value, bool):
            return [str(value)]
        return []

    def label(self) -> str:
        """Human label: name, title, summary, insight or the id."""
        for key in ("name", "title", "summary", "insight"):
            texts = self.field_text(key)
            if texts:
                return texts[0]
        return self.id


def anchor_terms(node: Node) -> list[str]:
    """Entity anchor terms: trimmed ``name`` and ``title`` values of JS-length ≥ 2 (reference §1.2)."""
    from memory_recall.text.normalize import js_len

    out: list[str] = []
    for key in ANCHOR_FIELDS:
        for text in node.field_text(key):
            t = text.strip()
            if js_len(t) >= 2 and t not in out:
                out.append(t)
    return out


def _value_text(value: Any) -> str:
    import json

    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ", ".join(t for t in (_value_text(v) for v in value) if t)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return str(value)


def embedding_text(node: Node) -> str:
    """The passage text a node's vector represents (reference ``buildNodeVectorText``)."""
    parts: list[str] = []
    for key in EMBEDDING_TEXT_KEYS:
        t = _value_text(node.fields.get(key))
        if t:
            parts.append(t)
    for key, value in node.fields.items():
        if key in EMBEDDING_TEXT_KEYS:
            continue
        t = _value_text(value)
        if t:
            parts.append(f"{key}: {t}")
    parts.append(f"memory_scope: {describe_memory_scope(node.scope)}")
    if node.scope.region_path:
        parts.append("memory_region_path: " + " / ".join(node.scope.region_path))
    if node.scope.region_secondary:
        parts.append("memory_region_secondary: " + ", ".join(node.scope.region_secondary))
    return " | ".join(parts)


class Edge(BaseModel):
    """A link between two nodes (reference §1.3). Recall treats every edge as undirected.

    An edge is *active* at ``now`` iff ``invalid_at`` and ``expired_at`` are unset or in the future.
    ``edge_type`` 255 marks an inhibit edge.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: NodeId
    from_id: NodeId
    to_id: NodeId
    relation: StrictStr = Field(default="related", min_length=1, max_length=64)
    strength: StrictFloat = Field(default=0.8, ge=0.0, le=1.0, allow_inf_nan=False)
    edge_type: StrictInt = Field(default=0, ge=0, le=255)
    valid_at: Millis | None = None
    invalid_at: Millis | None = None
    expired_at: Millis | None = None
    created_time: Millis = 0
    updated_at: Millis = 0
    scope: MemoryScope = Field(default_factory=MemoryScope)
    extra: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _distinct_ends(self) -> Edge:
        if self.from_id == self.to_id:
            raise ValueError("from_id and to_id must differ")
        return self

    @field_validator("extra")
    @classmethod
    def _json_extra(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key, item in value.items():
            _check_json_value(item, key)
        return value

    @property
    def inhibit(self) -> bool:
        return self.edge_type == INHIBIT_EDGE_TYPE

    def active(self, now_ms: int) -> bool:
        """Reference §1.3: no ``invalid_at``/``expired_at``, or both in the future."""
        return (self.invalid_at is None or self.invalid_at > now_ms) and (
            self.expired_at is None or self.expired_at > now_ms
        )


def first_validation_error(exc: ValidationError, prefix: str = "") -> InputError:
    """Turn a pydantic error into an :class:`InputError` naming the first failing field path."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__")
    path = f"{prefix}.{loc}" if prefix and loc else (prefix or loc or "value")
    msg = str(err.get("msg", "invalid value"))
    msg = msg.removeprefix("Value error, ")
    return InputError(path, msg)


def parse_node(data: Any, where: str = "node") -> Node:
    """Validate one node, raising :class:`InputError` (``"nodes[3].importance: …"``) on bad data."""
    if isinstance(data, Node):
        return data
    try:
        return Node.model_validate(data)
    except ValidationError as exc:
        raise first_validation_error(exc, where) from None


def parse_edge(data: Any, where: str = "edge") -> Edge:
    """Validate one edge, raising :class:`InputError` naming the field on bad data."""
    if isinstance(data, Edge):
        return data
    try:
        return Edge.model_validate(data)
    except ValidationError as exc:
        raise first_validation_error(exc, where) from None


def nfkc_fold(text: str) -> str:
    """NFKC, lower-case, punctuation and spaces removed: the loose form used for alias matching (§1.5)."""
    t = unicodedata.normalize("NFKC", text).lower()
    return "".join(ch for ch in t if not (ch.isspace() or unicodedata.category(ch).startswith("P")))


def unique(items: Iterable[str]) -> list[str]:
    """Unique non-empty strings in first-occurrence order."""
    seen: set[str] = set()
    out: list[str] = []
    for item in items:
        if item and item not in seen:
            seen.add(item)
            out.append(item)
    return out
