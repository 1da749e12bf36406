"""Request and response bodies of the HTTP service (the recall hook itself reuses the controller's
:class:`~memory_recall.controller.RecallRequest` / :class:`~memory_recall.controller.RecallResponse`).

Every request model forbids unknown keys and bounds every list, so a body that passes validation cannot make
the service do unbounded work; the byte limit on the body (``service.max_body_bytes``) comes first.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator, model_validator

from memory_recall.controller.inputs import options_json_schema
from memory_recall.model.chat import MAX_MESSAGE_CHARS, ChatMessage, NulFreeStr
from memory_recall.model.graph import ID_PATTERN, MAX_ID_LENGTH, NODE_TYPES, Edge, Node
from memory_recall.service.openapi import json_value_ref

__all__ = [
    "MAX_BATCH",
    "MAX_SYNC_MESSAGES",
    "ChatEvent",
    "ChatList",
    "ChatStats",
    "ChatSummary",
    "DeleteResult",
    "EdgeBatch",
    "EdgeIn",
    "EmbeddingOutcome",
    "ErrorBody",
    "EventResult",
    "HealthBody",
    "HeapBody",
    "IdBatch",
    "ImportResult",
    "MemoryBody",
    "MessageAdded",
    "MessageDeleted",
    "MessageEdited",
    "MessageSwiped",
    "NodeBatch",
    "NodeIn",
    "RecordEdit",
    "RerecallBody",
    "ScopeIn",
    "StbmeExport",
    "StbmeImport",
    "SyncRequest",
    "SyncState",
    "SyncStatus",
    "VersionBody",
    "WriteResult",
]

#: Largest batch of messages, nodes, edges or ids per request.
MAX_BATCH = 5000
_Strict = ConfigDict(extra="forbid", frozen=True)


class ErrorBody(BaseModel):
    """Every non-2xx answer: ``error`` is one line naming the first bad field; ``detail`` lists all (422)."""

    error: str
    detail: list[dict[str, Any]] | str | None = None


# -- chat events -----------------------------------------------------------------------------------------------


def _not_null(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of an optional field that may be left out but not given as ``null``."""
    choices = [c for c in schema.pop("anyOf", []) if c != {"type": "null"}]
    schema.pop("default", None)
    if len(choices) == 1:
        schema.update(choices[0])


def _exactly_one(*names: str) -> Any:
    def extra(schema: dict[str, Any]) -> None:
        schema["oneOf"] = [{"required": [name]} for name in names]

    return extra


class MessageAdded(BaseModel):
    """A new message (``message``), or a batch (``messages``, e.g. syncing a chat); an existing floor is
    re-ingested, so re-sending a chat is idempotent. Exactly one of the two is given (the schema's ``oneOf``),
    and not as ``null``."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra=_exactly_one("message", "messages"))

    type: Literal["message_added"]
    message: ChatMessage | None = Field(default=None, json_schema_extra=_not_null)
    messages: list[ChatMessage] | None = Field(
        default=None, max_length=MAX_BATCH, json_schema_extra=_not_null, description="Each floor once."
    )

    @model_validator(mode="after")
    def _one_of(self) -> MessageAdded:
        given = [name for name in ("message", "messages") if name in self.model_fields_set]
        if len(given) != 1:
            raise ValueError("give exactly one of 'message' and 'messages'")
        if getattr(self, given[0]) is None:
            raise ValueError(f"'{given[0]}' must not be null")
        return self

    @property
    def batch(self) -> list[ChatMessage]:
        return [self.message] if self.message is not None else list(self.messages or [])


class MessageEdited(BaseModel):
    """The message at ``message.floor`` was edited: node updated, the floor's recall record dropped."""

    model_config = _Strict

    type: Literal["message_edited"]
    message: ChatMessage


def _assistant(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of a message that must be an assistant message."""
    schema["allOf"] = [{"$ref": schema.pop("$ref")}, {"properties": {"role": {"const": "assistant"}}}]


class MessageSwiped(BaseModel):
    """An assistant message was swiped to another alternative (``message`` holds the shown text; its role is
    ``assistant``)."""

    model_config = _Strict

    type: Literal["message_swiped"]
    message: ChatMessage = Field(json_schema_extra=_assistant)

    @field_validator("message")
    @classmethod
    def _assistant_message(cls, message: ChatMessage) -> ChatMessage:
        if message.role != "assistant":
            raise ValueError(f"a swipe replaces an assistant message; got role {message.role!r}")
        return message


class MessageDeleted(BaseModel):
    """The message at ``floor`` was deleted. Without ``shift`` its node is archived and its edges invalidated
    (the last message of a chat, or a host that keeps floors); with ``shift: true`` the later messages moved
    down one floor (a message removed from the middle of a SillyTavern chat): their nodes, edges, vectors and
    recall records move with them, nothing is re-ingested."""

    model_config = _Strict

    type: Literal["message_deleted"]
    floor: StrictInt = Field(ge=0, le=10_000_000)
    shift: StrictBool = False


ChatEvent = Annotated[
    MessageAdded | MessageEdited | MessageSwiped | MessageDeleted, Field(discriminator="type")
]


class EmbeddingOutcome(BaseModel):
    """Embedding of new or changed nodes after a write: ``queued`` (the background worker embeds them; the
    default), ``ok``/``failed`` (``?embed=inline``: embedded before the answer), ``disabled`` (no embedder)."""

    status: Literal["ok", "failed", "disabled", "queued"]
    model_id: str = ""
    embedded: int = 0
    failure_category: str = ""


class EventResult(BaseModel):
    """What an event changed in the graph (``version`` is the chat version afterwards)."""

    chat_id: str
    type: str
    version: int
    nodes_added: int = 0
    nodes_updated: int = 0
    nodes_retired: int = 0
    edges_added: int = 0
    edges_updated: int = 0
    edges_retired: int = 0
    records_invalidated: int = 0
    embedding: EmbeddingOutcome


# -- whole-chat sync --------------------------------------------------------------------------------------------

#: Most messages in one whole-chat sync.
MAX_SYNC_MESSAGES = 100_000


class SyncRequest(BaseModel):
    """A whole chat: ``messages`` hold floors ``0 … n-1`` once each, in any order. The chat becomes exactly
    these messages (message nodes past the end are retired); re-sending an unchanged chat writes nothing."""

    model_config = _Strict

    messages: list[ChatMessage] = Field(
        max_length=MAX_SYNC_MESSAGES, description="Floors 0 … n-1, each once, in any order."
    )


SyncState = Literal["ingesting", "embedding", "done", "failed"]


class SyncStatus(BaseModel):
    """Progress of a whole-chat sync (``POST`` answers at once with it; ``GET`` polls it).

    ``state``: ``ingesting`` (the messages are being written), ``embedding`` (the graph is complete and recall
    works on it, lexically for the nodes still without a vector; ``vectors_done`` of ``vectors_total`` are
    stored), ``done``, or ``failed`` (``error`` says why; a failed embedding leaves the graph written and is
    retried by the next write). ``version`` is the chat version the ingest produced.
    """

    job_id: str
    chat_id: str
    state: SyncState
    messages: int
    nodes_added: int = 0
    nodes_updated: int = 0
    nodes_retired: int = 0
    version: int = 0
    vectors_total: int = 0
    vectors_done: int = 0
    embedding_model: str = ""
    error: str = ""
    failure_category: str = ""
    started_at: int
    ingested_at: int | None = None
    finished_at: int | None = None


# -- graph ------------------------------------------------------------------------------------------------------


def _json_object(*, named: bool) -> Any:
    """``json_schema_extra`` of a ``dict[str, Any]`` of JSON values (``named``: keys must not be empty)."""

    def extra(schema: dict[str, Any]) -> None:
        schema["additionalProperties"] = {"$ref": json_value_ref()}
        if named:
            schema["propertyNames"] = {"minLength": 1}

    return extra


class ScopeIn(BaseModel):
    """The memory scope of a node or edge in a request body, typed exactly (no coercion, unlike the lenient
    :class:`~memory_recall.model.graph.MemoryScope` the ST-BME importer feeds), then normalised by it (owner
    fields blank on the objective layer, the primary region appended to the path …)."""

    model_config = _Strict

    layer: Literal["objective", "pov"] = "objective"
    owner_type: Literal["", "character", "user"] = ""
    owner_id: StrictStr = ""
    owner_name: StrictStr = ""
    region_primary: StrictStr = ""
    region_path: tuple[StrictStr, ...] = ()
    region_secondary: tuple[StrictStr, ...] = ()


class NodeIn(Node):
    """A node in a request body: a :class:`~memory_recall.model.graph.Node` with an exactly typed ``scope``;
    :meth:`to_node` is the node stored."""

    scope: ScopeIn = Field(default_factory=ScopeIn)  # type: ignore[assignment]
    fields: dict[str, Any] = Field(default_factory=dict, json_schema_extra=_json_object(named=True))
    extra: dict[str, Any] = Field(default_factory=dict, json_schema_extra=_json_object(named=True))

    def to_node(self) -> Node:
        return Node.model_validate(self.model_dump())


class EdgeIn(Edge):
    """An edge in a request body: an :class:`~memory_recall.model.graph.Edge` with an exactly typed ``scope``;
    :meth:`to_edge` is the edge stored."""

    scope: ScopeIn = Field(default_factory=ScopeIn)  # type: ignore[assignment]
    extra: dict[str, Any] = Field(default_factory=dict, json_schema_extra=_json_object(named=False))

    def to_edge(self) -> Edge:
        return Edge.model_validate(self.model_dump())


class NodeBatch(BaseModel):
    """Nodes to insert or replace (by id; a node repeated in the batch is written once, with its last value).
    A node's ``seq_range`` starts at or before its end."""

    model_config = _Strict

    nodes: list[NodeIn] = Field(min_length=1, max_length=MAX_BATCH)


class EdgeBatch(BaseModel):
    """Edges to insert or replace (by id); an edge joins two different nodes, and both must exist in the chat
    (else 404 naming the edge)."""

    model_config = _Strict

    edges: list[EdgeIn] = Field(min_length=1, max_length=MAX_BATCH)


class IdBatch(BaseModel):
    """Ids to delete (unknown ids are ignored and not counted)."""

    model_config = _Strict

    ids: list[Annotated[StrictStr, Field(min_length=1, max_length=128)]] = Field(min_length=1, max_length=MAX_BATCH)


class StbmeImport(BaseModel):
    """The schema of ``POST /v1/chats/{chat_id}/import`` (the body is read by
    :func:`~memory_recall.ingest.import_stbme_report`, not by this model): an ST-BME graph export. Nodes need a
    known ``type``; an ``id`` is a usable id, a number, or empty/``null`` (derived); other keys of a node are kept
    as extra data (JSON values, non-empty names). Not stated here, so refused with a 422 naming the item: two
    nodes with one id, and an edge whose ends both exist with an unusable id or extra value (edges whose ends do
    not exist are skipped with a warning). Also accepted, and not described: a wrapper object holding the export
    under one key (``{"graph": {...}}``, also as JSON text, up to three levels deep)."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra=lambda schema: schema.update(
            properties={
                "nodes": {"type": "array", "items": _STBME_NODE},
                "edges": {"anyOf": [{"type": "array", "items": {"type": "object"}}, {"type": "null"}]},
            },
            required=["nodes"],
        ),
    )


def _number_below(limit: int, minimum: int | None = None) -> dict[str, Any]:
    number: dict[str, Any] = {"type": "number", "exclusiveMaximum": limit}
    if minimum is not None:
        number["minimum"] = minimum
    return {"anyOf": [number, {"not": {"type": "number"}}]}  # a non-number is replaced, with a warning


_STBME_NODE: dict[str, Any] = {
    "type": "object",
    "required": ["type"],
    "properties": {
        "id": {
            "anyOf": [
                {"type": "string", "maxLength": 0},
                {"type": "string", "maxLength": MAX_ID_LENGTH, "pattern": ID_PATTERN},
                {"type": "integer"},
                {"type": "null"},
            ]
        },
        "type": {"type": "string", "enum": list(NODE_TYPES)},
        "fields": {
            "anyOf": [
                {
                    "type": "object",
                    "propertyNames": {"minLength": 1},
                    "additionalProperties": {"$ref": json_value_ref()},
                },
                {"type": "null"},
            ]
        },
        "seq": _number_below(10_000_001, minimum=-1),  # floored: -1 … 10,000,000
        "level": _number_below(65),  # floored, and below 0 raised to 0: at most 64
    },
    "propertyNames": {"minLength": 1},
    "additionalProperties": {"$ref": json_value_ref()},
}


class WriteResult(BaseModel):
    chat_id: str
    version: int
    count: int
    embedding: EmbeddingOutcome


class ImportResult(BaseModel):
    chat_id: str
    version: int
    node_count: int
    edge_count: int
    warnings: list[str]
    embedding: EmbeddingOutcome


class DeleteResult(BaseModel):
    chat_id: str
    deleted: bool


# -- records ----------------------------------------------------------------------------------------------------


class RecordEdit(BaseModel):
    """New injection text of a recall record (marks the record as manually edited)."""

    model_config = _Strict

    injection_text: StrictStr = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)


class RerecallBody(BaseModel):
    """Optional context of a forced re-recall (without ``messages`` the floor's text comes from its record).
    The fields are those of the recall request: ``messages`` in floor order, each floor once, and the floor
    re-recalled a user message when it is among them."""

    model_config = _Strict

    messages: list[ChatMessage] = Field(default_factory=list, max_length=1000)
    query_text: NulFreeStr = Field(default="", max_length=MAX_MESSAGE_CHARS)
    active_region: NulFreeStr = Field(default="", max_length=200)
    options: dict[str, dict[str, Any]] | None = Field(default=None, json_schema_extra=options_json_schema)


# -- chats, health ----------------------------------------------------------------------------------------------


class ChatSummary(BaseModel):
    chat_id: str
    version: int
    node_count: int
    edge_count: int
    created_at: int
    updated_at: int


class ChatList(BaseModel):
    chats: list[ChatSummary]


class ChatStats(BaseModel):
    """Counts of one chat (:meth:`~memory_recall.store.Store.stats`): ``embedded`` counts nodes with a vector
    per embedding model id."""

    chat_id: str
    version: int
    node_count: int
    nodes_by_type: dict[str, int]
    archived_count: int
    edge_count: int
    embedded: dict[str, int]
    record_count: int


class StbmeExport(BaseModel):
    """An ST-BME graph export (:func:`~memory_recall.ingest.export_stbme`, GRAPH_VERSION 9, camelCase keys);
    ``POST …/import`` reads it back to an equal graph."""

    model_config = ConfigDict(extra="forbid")

    # The export's own camelCase keys, in its order (the response keeps them so).
    version: int
    nodes: list[dict[str, Any]]
    edges: list[dict[str, Any]]
    historyState: dict[str, Any]
    knowledgeState: dict[str, Any]
    regionState: dict[str, Any]
    timelineState: dict[str, Any]
    summaryState: dict[str, Any]
    batchJournal: list[dict[str, Any]]
    lastProcessedSeq: int
    lastRecallResult: None
    vectorIndexState: dict[str, Any]
    maintenanceJournal: list[Any]


class HealthBody(BaseModel):
    status: Literal["ok"]


class HeapBody(BaseModel):
    """The C allocator's figures (glibc ``mallinfo2``, summed over its arenas; see
    :class:`memory_recall.heap.HeapUsage`)."""

    in_use_bytes: int = Field(description="Held by the process: blocks in the heaps and in their own mappings.")
    free_bytes: int = Field(description="Free space inside the heaps (resident until reused or trimmed).")
    heaps_bytes: int = Field(description="The heaps' size: in use (outside own mappings) plus free.")
    mapped_bytes: int = Field(description="Blocks in their own mappings (part of in_use_bytes).")


class MemoryBody(BaseModel):
    """The service process's memory: whether a rising RSS is what glibc's allocator hands out
    (``heap.in_use_bytes`` rising with it) or not (``in_use_bytes`` level: the heaps fragmenting, or Python's
    small objects, which live in Python's own arenas outside ``mallinfo2``)."""

    anonymous_rss_bytes: int | None = Field(
        description="Anonymous resident memory (Linux RssAnon; the model file's pages are not in it); null elsewhere."
    )
    heap: HeapBody | None = Field(description="The allocator's figures; null without glibc 2.33 or later.")
    heap_trims: int = Field(description="Trims of the heaps' free pages so far (service.heap_trim_s).")
    heap_trim_seconds: float = Field(description="Seconds those trims took in all.")


class VersionBody(BaseModel):
    name: str
    version: str
    api: str
    schema_version: int
    embedding_model: str
