"""Request and response bodies of the HTTP service (the recall hook itself reuses the controller's
:class:`~memory_recall.controller.RecallRequest` / :class:`~memory_recall.controller.RecallResponse`).

Every request model forbids unknown keys and bounds every list, so a body that passes validation cannot make
the service do unbounded work; the byte limit on the body (``service.max_body_bytes``) comes first.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, model_validator

from memory_recall.model.chat import MAX_MESSAGE_CHARS, ChatMessage
from memory_recall.model.graph import Edge, Node

__all__ = [
    "MAX_BATCH",
    "MAX_SYNC_MESSAGES",
    "ChatEvent",
    "ChatList",
    "ChatSummary",
    "DeleteResult",
    "EdgeBatch",
    "EmbeddingOutcome",
    "ErrorBody",
    "EventResult",
    "HealthBody",
    "IdBatch",
    "ImportResult",
    "MessageAdded",
    "MessageDeleted",
    "MessageEdited",
    "MessageSwiped",
    "NodeBatch",
    "RecordEdit",
    "RerecallBody",
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


class MessageAdded(BaseModel):
    """A new message (``message``), or a batch (``messages``, e.g. syncing a chat); an existing floor is
    re-ingested, so re-sending a chat is idempotent."""

    model_config = _Strict

    type: Literal["message_added"]
    message: ChatMessage | None = None
    messages: list[ChatMessage] | None = Field(default=None, max_length=MAX_BATCH)

    @model_validator(mode="after")
    def _one_of(self) -> MessageAdded:
        if (self.message is None) == (self.messages is None):
            raise ValueError("give exactly one of 'message' and 'messages'")
        return self

    @property
    def batch(self) -> list[ChatMessage]:
        return [self.message] if self.message is not None else list(self.messages or [])


class MessageEdited(BaseModel):
    """The message at ``message.floor`` was edited: node updated, the floor's recall record dropped."""

    model_config = _Strict

    type: Literal["message_edited"]
    message: ChatMessage


class MessageSwiped(BaseModel):
    """An assistant message was swiped to another alternative (``message`` holds the shown text)."""

    model_config = _Strict

    type: Literal["message_swiped"]
    message: ChatMessage


class MessageDeleted(BaseModel):
    """The message at ``floor`` was deleted. Without ``shift`` its node is archived and its edges invalidated
    (the last message of a chat, or a host that keeps floors); with ``shift: true`` the later messages moved
    down one floor (a message removed from the middle of a SillyTavern chat): their nodes, edges, vectors and
    recall records move with them, nothing is re-ingested."""

    model_config = _Strict

    type: Literal["message_deleted"]
    floor: int = Field(ge=0, le=10_000_000)
    shift: StrictBool = False


ChatEvent = Annotated[
    MessageAdded | MessageEdited | MessageSwiped | MessageDeleted, Field(discriminator="type")
]


class EmbeddingOutcome(BaseModel):
    """Embedding of new or changed nodes after a write (inline, after the write committed)."""

    status: Literal["ok", "failed", "disabled"]
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

    messages: list[ChatMessage] = Field(max_length=MAX_SYNC_MESSAGES)


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


class NodeBatch(BaseModel):
    """Nodes to insert or replace (by id)."""

    model_config = _Strict

    nodes: list[Node] = Field(min_length=1, max_length=MAX_BATCH)


class EdgeBatch(BaseModel):
    """Edges to insert or replace (by id); both ends must exist in the chat."""

    model_config = _Strict

    edges: list[Edge] = Field(min_length=1, max_length=MAX_BATCH)


class IdBatch(BaseModel):
    """Ids to delete (unknown ids are ignored and not counted)."""

    model_config = _Strict

    ids: list[Annotated[StrictStr, Field(min_length=1, max_length=128)]] = Field(min_length=1, max_length=MAX_BATCH)


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
    """Optional context of a forced re-recall (without ``messages`` the floor's text comes from its record)."""

    model_config = _Strict

    messages: list[ChatMessage] = Field(default_factory=list, max_length=1000)
    query_text: StrictStr = Field(default="", max_length=MAX_MESSAGE_CHARS)
    active_region: StrictStr = Field(default="", max_length=200)
    options: dict[str, dict[str, Any]] | None = None


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


class HealthBody(BaseModel):
    status: Literal["ok"]


class VersionBody(BaseModel):
    name: str
    version: str
    api: str
    schema_version: int
    embedding_model: str
