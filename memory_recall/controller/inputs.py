"""The recall request and input resolution (reference §2.1–§2.2, recall-spec departure 1).

:class:`RecallRequest` is what a host sends for one generation: the recent chat messages, the generation type,
the **explicit** target user floor and query text (the service never guesses a previous floor, which fixes
reference §7 item 1), the scene, and per-request setting overrides.

:func:`resolve_input` picks the recall text, first non-empty wins:

==========================  ==========================  ==========================================
source                      text                        when
==========================  ==========================  ==========================================
``override`` (or given)     ``override_text``           any generation type
``query-text``              ``query_text``              any generation type
``send-intent``             ``send_intent``             ``normal`` only (reference: history types
                                                        never read the send intent)
``target-user-floor``       the target floor's text     a target floor is known and in ``messages``
``chat-tail-user``          last non-system message     it is a user message
``chat-last-user``          latest user message         anywhere in ``messages``
==========================  ==========================  ==========================================

Recent-context lines follow ``buildRecallRecentMessagesController``: up to ``limit`` non-system messages from
the end, ``"[user]: …"`` / ``"[assistant]: …"``, user text without ``<plot>``/``<note>``/``<plot-log>``/
``<state>`` blocks, plus a synthetic ``"[user]: <text>"`` line when the recall text is not a chat message
(send intent, override, query text) and differs from the last line; the oldest lines are dropped to keep the
limit. Hidden messages count as normal (the reference treats its own hide engine's messages so).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError, field_validator

from memory_recall.errors import InputError
from memory_recall.model.chat import (
    MAX_MESSAGE_CHARS,
    ChatMessage,
    GenerationType,
    NulFreeStr,
    reject_nul,
    reject_nul_items,
)
from memory_recall.model.graph import first_validation_error
from memory_recall.settings import RecallSettings
from memory_recall.store.sqlite import MAX_CHAT_ID_LENGTH, chat_id_pattern, validate_chat_id
from memory_recall.text.normalize import normalize_recall_input

__all__ = [
    "ACTIVE_SOURCES",
    "HISTORY_TYPES",
    "OPTION_SECTIONS",
    "RecallRequest",
    "ResolvedInput",
    "build_recent_lines",
    "chat_id_json_schema",
    "latest_user_floor",
    "options_json_schema",
    "parse_request",
    "resolve_input",
    "strip_plot_blocks",
]

#: Generation types that add no new user message (reference §2.1 "no-new-user" types).
HISTORY_TYPES = frozenset({GenerationType.CONTINUE, GenerationType.REGENERATE, GenerationType.SWIPE})
#: Reference §2.3: sources holding text typed *now*, not read from a chat floor.
ACTIVE_SOURCES = frozenset(
    {
        "send-intent",
        "generation-started-send-intent",
        "generation-started-textarea",
        "host-generation-lifecycle",
        "textarea-live",
        "planner-handoff",
    }
)
_MAX_MESSAGES = 1000
_HOST_NAME_MAX = 200
# BCP-47's shape (RFC 5646 §2.1, loosely): a 2–8 letter primary subtag, then hyphen-separated 1–8 letter/digit
# subtags; 35 characters is the length RFC 5646 §4.4.1 asks implementations to keep at least.
_LOCALE_MAX = 35
_LOCALE = re.compile(r"[A-Za-z]{2,8}(?:-[A-Za-z0-9]{1,8})*", re.ASCII)
# Reference §2.2: user text loses these blocks before it becomes a context line.
_PLOT_BLOCKS = re.compile(r"<(plot|note|plot-log|state)\b[^>]*>[\s\S]*?</\1\s*>", re.IGNORECASE)
#: Settings sections a request may override in ``options``: the recall's stages, the injector and the controller.
#: The store, the providers and the service are fixed when they start (an override of them would be ignored).
OPTION_SECTIONS: tuple[str, ...] = tuple(
    name
    for name, field in RecallSettings.model_fields.items()
    if isinstance(field.annotation, type)
    and issubclass(field.annotation, BaseModel)
    and name not in ("store", "embedding", "llm", "service")
)


def chat_id_json_schema(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of a chat id field: the rules of :func:`validate_chat_id` as length and pattern."""
    schema.update(minLength=1, maxLength=MAX_CHAT_ID_LENGTH, pattern=chat_id_pattern())


def _partial(schema: Any, defs: dict[str, Any]) -> Any:
    """A section's JSON schema as an override reads it: ``$defs`` inlined, nothing required (a deep merge)."""
    if isinstance(schema, list):
        return [_partial(item, defs) for item in schema]
    if not isinstance(schema, dict):
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return _partial(defs[ref.removeprefix("#/$defs/")], defs)
    return {k: _partial(v, defs) for k, v in schema.items() if k not in ("required", "$defs", "title")}


def options_json_schema(schema: dict[str, Any]) -> None:
    """``options`` exactly as :meth:`RecallSettings.with_overrides` (strict) takes it: the sections of
    :data:`OPTION_SECTIONS`, each with its own keys and value types, any subset of them."""
    sections: dict[str, Any] = {}
    for name in OPTION_SECTIONS:
        model = RecallSettings.model_fields[name].annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        section = model.model_json_schema()
        sections[name] = _partial(section, section.get("$defs", {}))
    schema["anyOf"] = [
        {"type": "object", "properties": sections, "additionalProperties": False},
        {"type": "null"},
    ]


class RecallRequest(BaseModel):
    """One recall request (see the module docstring). Unknown keys are rejected; errors name the field.

    >>> RecallRequest(chat_id="c1", messages=[ChatMessage(floor=0, role="user", text="Hi")],
    ...               target_user_floor=0).generation_type
    <GenerationType.NORMAL: 'normal'>
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    chat_id: StrictStr = Field(json_schema_extra=chat_id_json_schema)
    messages: list[ChatMessage] = Field(
        default_factory=list,
        max_length=_MAX_MESSAGES,
        description="The recent messages in floor order, each floor once.",
    )
    generation_type: GenerationType = GenerationType.NORMAL
    #: The user floor this generation answers (departure 1: explicit; history types fall back to the latest
    #: user message in ``messages``, normal sends never guess one).
    target_user_floor: StrictInt | None = Field(
        default=None, ge=0, le=10_000_000, description="A user floor: when it is in messages, a user message."
    )
    query_text: NulFreeStr = Field(default="", max_length=MAX_MESSAGE_CHARS)
    override_text: NulFreeStr = Field(default="", max_length=MAX_MESSAGE_CHARS)
    override_source: NulFreeStr = Field(default="", max_length=100)
    send_intent: NulFreeStr = Field(default="", max_length=MAX_MESSAGE_CHARS)
    dry_run: StrictBool = False
    #: ``False``: a what-if/evaluation run — always a fresh retrieval, no record read or written and no access
    #: reinforcement, so the chat's graph and records are exactly as before (offline evaluation asks many
    #: questions at one floor; persisting would let question order change later answers).
    persist: StrictBool = True
    #: Explicit re-recall of the target floor: always a fresh retrieval (departure 7, fixes §7 item 11).
    rerecall: StrictBool = False
    active_region: NulFreeStr = Field(default="", max_length=200)
    active_owner_keys: list[NulFreeStr] | None = Field(default=None, max_length=100)
    active_character_pov_owner: NulFreeStr = Field(default="", max_length=200)
    active_user_pov_owner: NulFreeStr = Field(default="", max_length=200)
    visibility_filter: NulFreeStr = Field(default="", max_length=200)
    host_character_name: NulFreeStr = Field(default="", max_length=_HOST_NAME_MAX)
    host_user_name: NulFreeStr = Field(default="", max_length=_HOST_NAME_MAX)
    #: Per-request settings overrides ``{"section": {"key": value}}`` of the sections in
    #: :data:`OPTION_SECTIONS` (``RecallSettings.with_overrides``, strict: values are not converted).
    options: dict[str, dict[str, Any]] | None = Field(default=None, json_schema_extra=options_json_schema)
    now_ms: StrictInt | None = Field(default=None, ge=0, le=253_402_300_799_999)
    #: Strict mode: a provider failure aborts the recall instead of degrading (``None``: the settings decide).
    strict: StrictBool | None = None
    #: Language of the response's ``reason_text``: a BCP-47-like tag (``en``, ``en-US``, ``zh-CN``; at most 35
    #: characters). A ``zh`` primary subtag gives the reference's Chinese messages, anything else or ``None``
    #: English (:func:`memory_recall.controller.gates.reason_text`). Nothing else depends on it.
    locale: StrictStr | None = Field(
        default=None,
        max_length=_LOCALE_MAX,
        description="Language of reason_text (BCP-47 tag): zh… gives the reference's Chinese texts, else English.",
        examples=["en", "en-US", "zh-CN"],
        # Shown to clients; checked by _locale (with a message naming the expected form).
        json_schema_extra={"pattern": f"^{_LOCALE.pattern}$"},
    )

    @field_validator("chat_id")
    @classmethod
    def _chat_id(cls, value: str) -> str:
        try:
            return validate_chat_id(value)
        except InputError as exc:
            raise ValueError(exc.reason) from None

    # The recall text and scene fields can be written into the floor's record, and the store refuses to read a
    # NUL back (the chat would stop answering): refused here, with the field named, like message text.
    @field_validator(
        "query_text", "override_text", "override_source", "send_intent", "active_region",
        "active_character_pov_owner", "active_user_pov_owner", "visibility_filter", "host_character_name",
        "host_user_name",
    )
    @classmethod
    def _no_nul(cls, value: str) -> str:
        return reject_nul(value)

    @field_validator("locale")
    @classmethod
    def _locale(cls, value: str | None) -> str | None:
        if value is not None and not _LOCALE.fullmatch(value):
            raise ValueError(f"must be a language tag such as 'en', 'en-US' or 'zh-CN', got {value!r}")
        return value

    @field_validator("active_owner_keys")
    @classmethod
    def _no_nul_keys(cls, value: list[str] | None) -> list[str] | None:
        return reject_nul_items(value)

    @field_validator("options")
    @classmethod
    def _option_sections(cls, value: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]] | None:
        for name in value or {}:
            if name not in OPTION_SECTIONS:
                raise ValueError(f"{name!r} is not a section a request can override; expected one of "
                                 f"{', '.join(OPTION_SECTIONS)}")
        return value

    @field_validator("messages")
    @classmethod
    def _floors(cls, value: list[ChatMessage]) -> list[ChatMessage]:
        seen: set[int] = set()
        prev = -1
        for i, m in enumerate(value):
            if m.floor in seen:
                raise ValueError(f"floor {m.floor} appears twice (messages[{i}])")
            if m.floor < prev:
                raise ValueError(f"messages must be in floor order (messages[{i}] has floor {m.floor} < {prev})")
            seen.add(m.floor)
            prev = m.floor
        return value

    def message_at(self, floor: int | None) -> ChatMessage | None:
        """The message of ``floor`` in ``messages``, or ``None``."""
        if floor is None:
            return None
        for m in self.messages:
            if m.floor == floor:
                return m
        return None


def parse_request(data: RecallRequest | dict[str, Any]) -> RecallRequest:
    """Validate ``data`` as a :class:`RecallRequest`; raises :class:`InputError` naming the first bad field."""
    if isinstance(data, RecallRequest):
        request = data
    elif not isinstance(data, dict):
        raise InputError("request", f"must be an object, got {type(data).__name__}")
    else:
        try:
            request = RecallRequest.model_validate(data)
        except ValidationError as exc:
            raise first_validation_error(exc) from None
    # Reference §2.4: records live on user floors only (writePersisted… refuses other messages).
    target = request.message_at(request.target_user_floor)
    if target is not None and target.role != "user":
        raise InputError("target_user_floor", f"floor {target.floor} is a {target.role} message, not a user floor")
    return request


@dataclass(frozen=True)
class ResolvedInput:
    """The recall text chosen for one request and where it came from.

    ``target_user_floor`` is the floor a record is read from and written to (``None``: not persisted);
    ``floor_text`` is ``NR`` of that floor's message (``""`` when the floor is not in the request);
    ``synthetic`` says whether ``recent_lines`` ends with a synthetic ``[user]:`` line; ``candidates`` lists
    every non-empty source in priority order (reference ``sourceCandidates``).
    """

    text: str
    source: str
    reason: str
    target_user_floor: int | None
    floor_text: str
    recent_lines: tuple[str, ...]
    synthetic: bool
    candidates: tuple[tuple[str, str], ...]

    @property
    def active(self) -> bool:
        return self.source in ACTIVE_SOURCES

    @property
    def authoritative(self) -> bool:
        """The recall text differs from the target floor's text (reference ``authoritativeInputUsed``)."""
        return bool(self.floor_text) and bool(self.text) and self.text != self.floor_text


def strip_plot_blocks(text: str) -> str:
    """User text without ``<plot>``, ``<note>``, ``<plot-log>`` and ``<state>`` blocks, trimmed."""
    return _PLOT_BLOCKS.sub("", text).strip()


def _is_context_message(m: ChatMessage) -> bool:
    return m.role != "system"


def latest_user_floor(messages: list[ChatMessage]) -> int | None:
    """Floor of the latest user message (system messages are never user floors; hidden ones are)."""
    for m in reversed(messages):
        if m.role == "user":
            return m.floor
    return None


def _tail_user(messages: list[ChatMessage]) -> ChatMessage | None:
    for m in reversed(messages):
        if _is_context_message(m):
            return m if m.role == "user" else None
    return None


def build_recent_lines(messages: list[ChatMessage], limit: int, synthetic: str = "") -> list[str]:
    """Recent-context lines (``buildRecallRecentMessagesController``, see the module docstring)."""
    if limit <= 0:
        return []
    lines: list[str] = []
    for m in reversed(messages):
        if len(lines) >= limit:
            break
        if not _is_context_message(m):
            continue
        text = strip_plot_blocks(m.text) if m.role == "user" else normalize_recall_input(m.text)
        if text:
            lines.append(f"[{m.role}]: {text}")
    lines.reverse()
    if synthetic:
        line = f"[user]: {synthetic}"
        if not lines or lines[-1] != line:
            lines.append(line)
            lines = lines[-limit:]
    return lines


def resolve_input(request: RecallRequest, limit: int) -> ResolvedInput:
    """Choose the recall text and target floor of ``request`` (see the module docstring)."""
    messages = request.messages
    history = request.generation_type in HISTORY_TYPES
    target = request.target_user_floor
    if target is None and history:
        target = latest_user_floor(messages)
    target_msg = request.message_at(target)
    floor_text = normalize_recall_input(target_msg.text) if target_msg is not None else ""
    tail = _tail_user(messages)
    latest = request.message_at(latest_user_floor(messages))

    candidates: list[tuple[str, str, bool]] = []  # (source, text, chat message?)
    override = normalize_recall_input(request.override_text)
    if override:
        candidates.append((request.override_source or "override", override, False))
    query = normalize_recall_input(request.query_text)
    if query:
        candidates.append(("query-text", query, False))
    intent = normalize_recall_input(request.send_intent)
    if intent and not history:
        candidates.append(("send-intent", intent, False))
    if floor_text:
        candidates.append(("chat-last-user" if history else "target-user-floor", floor_text, True))
    if tail is not None and normalize_recall_input(tail.text):
        candidates.append(("chat-tail-user", normalize_recall_input(tail.text), True))
    if latest is not None and normalize_recall_input(latest.text):
        candidates.append(("chat-last-user", normalize_recall_input(latest.text), True))

    if not candidates:
        return ResolvedInput(
            text="", source="none", reason="no-recall-input", target_user_floor=target, floor_text=floor_text,
            recent_lines=tuple(build_recent_lines(messages, limit)), synthetic=False, candidates=(),
        )
    source, text, from_chat = candidates[0]
    # A synthetic line only when the text is not already a chat message (reference includeSyntheticUserMessage).
    synthetic = "" if from_chat else text
    lines = build_recent_lines(messages, limit, synthetic)
    return ResolvedInput(
        text=text,
        source=source,
        reason=f"{source}-selected",
        target_user_floor=target,
        floor_text=floor_text,
        recent_lines=tuple(lines),
        synthetic=bool(synthetic) and bool(lines) and lines[-1] == f"[user]: {synthetic}",
        candidates=tuple((s, t) for s, t, _ in candidates),
    )
