"""Controller gates, reason codes and the response model (reference §2.2, adapted to a backend).

Gates run in this order; the first that fires ends the run with its status and stable reason code:

====  ===============================================  =========  ==========================================
#     condition                                        status     reason code (Chinese ``reason_text``)
====  ===============================================  =========  ==========================================
1     ``controller.enabled`` is false                  skipped    ``recall-disabled`` (召回功能未启用)
2     ``dry_run`` (prompt preview)                     skipped    ``dry-run``
3     generation type ``quiet`` / ``impersonate``      skipped    ``generation-type-skipped:<type>``
4     no messages and no query or override text        skipped    ``empty-chat`` (当前聊天为空)
5     history type and no user floor                   skipped    ``no-user-floor``
6     no recall text resolved                          skipped    ``no-user-input``
                                                                  (当前没有可用于召回的用户输入)
7     the recall text is trivial (reference §2.5)      skipped    ``trivial-input:<empty|slash-command>``
8     a reusable persisted record (``replay``)         completed  ``persisted-record-reused``
                                                                  (复用已持久化召回)
9     fresh retrieve + render (+ persist)              completed  ``recall-completed`` (召回完成)
—     a provider failed in strict mode                 aborted    ``strict-mode-violation``
—     a stage failed in a way that cannot degrade      failed     ``stage-failed``
====  ===============================================  =========  ==========================================

Gate 4 departs from the reference (``chat.length === 0``): a request without messages that carries a
``query_text`` or an ``override_text`` (not blank) recalls for that text, since the chat's graph is there to recall
from; only a request with nothing to recall for is an empty chat (``docs/reference-differences.md``).

``reason_text`` is English unless the request's ``locale`` is Chinese (``zh``, ``zh-CN`` …), which gives the
reference's message shown above where it has one (:func:`reason_text`; English texts: :data:`REASON_TEXT_EN`).

Reference gates that do not exist in a backend: restore lock (0), a running recall (1: requests are independent
and each recall reads one snapshot), no graph (2: to the controller an unknown chat is an empty graph and recalls
nothing; the HTTP service answers 404 for it, since the host has not sent the chat), graph
still loading (4) and history recovery (5). The planner handoff (8) is not part of this API.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from memory_recall.controller.inputs import HISTORY_TYPES, RecallRequest, ResolvedInput
from memory_recall.model.chat import GenerationType
from memory_recall.model.records import PersistedRecall
from memory_recall.settings import RecallSettings
from memory_recall.text.normalize import is_trivial_input, normalize_recall_input

__all__ = [
    "REASON_TEXT",
    "REASON_TEXT_EN",
    "Reason",
    "RecallResponse",
    "RecallStatus",
    "check_input_gates",
    "check_request_gates",
    "is_chinese",
    "reason_text",
]

RecallStatus = Literal["completed", "skipped", "aborted", "failed"]
RecallSource = Literal["fresh", "persisted", "none"]


class Reason:
    """Stable reason codes (English kebab-case; ``REASON_TEXT`` has the reference's message where it has one)."""

    DISABLED = "recall-disabled"
    DRY_RUN = "dry-run"
    GENERATION_TYPE_SKIPPED = "generation-type-skipped"  # + ":<type>"
    EMPTY_CHAT = "empty-chat"
    NO_USER_FLOOR = "no-user-floor"
    NO_USER_INPUT = "no-user-input"
    TRIVIAL_INPUT = "trivial-input"  # + ":<reason>"
    REUSED = "persisted-record-reused"
    COMPLETED = "recall-completed"
    STRICT = "strict-mode-violation"
    STAGE_FAILED = "stage-failed"


#: The reference's Chinese messages (conformance text, reference §2.2), for the codes it has one for.
REASON_TEXT: dict[str, str] = {
    Reason.DISABLED: "召回功能未启用",
    Reason.EMPTY_CHAT: "当前聊天为空",
    Reason.NO_USER_FLOOR: "没有可用于历史生成的用户楼层",
    Reason.NO_USER_INPUT: "当前没有可用于召回的用户输入",
    Reason.REUSED: "复用已持久化召回",
    Reason.COMPLETED: "召回完成",
}

#: English text of every reason code (the default language of ``reason_text``).
REASON_TEXT_EN: dict[str, str] = {
    Reason.DISABLED: "Recall is disabled",
    Reason.DRY_RUN: "Dry run: no recall",
    Reason.GENERATION_TYPE_SKIPPED: "No recall for this generation type",
    Reason.EMPTY_CHAT: "The chat is empty",
    Reason.NO_USER_FLOOR: "No user floor is available for a history generation",
    Reason.NO_USER_INPUT: "No user input is available for recall",
    Reason.TRIVIAL_INPUT: "The input is too trivial to recall for",
    Reason.REUSED: "Reused the persisted recall",
    Reason.COMPLETED: "Recall completed",
    Reason.STRICT: "A provider failed in strict mode",
    Reason.STAGE_FAILED: "A pipeline stage failed",
}


def is_chinese(locale: str | None) -> bool:
    """Whether ``locale`` (a BCP-47-like tag, or ``None``) asks for Chinese: its primary subtag is ``zh``."""
    return locale is not None and locale.split("-", 1)[0].lower() == "zh"


def reason_text(code: str, locale: str | None = None) -> str:
    """The human text of a reason code (``"<code>"`` or ``"<code>:<detail>"``) in ``locale``.

    ``zh…`` locales get the reference's Chinese message (:data:`REASON_TEXT`); codes it has none for, and every
    other locale or ``None``, get :data:`REASON_TEXT_EN`. A detail is appended in parentheses to a text without
    a Chinese message (``"No recall for this generation type (quiet)"``); an unknown code is returned as is.

    >>> reason_text("recall-completed"), reason_text("recall-completed", "zh-CN")
    ('Recall completed', '召回完成')
    """
    base, sep, detail = code.partition(":")
    if is_chinese(locale) and base in REASON_TEXT:
        return REASON_TEXT[base]
    text = REASON_TEXT_EN.get(base)
    if text is None:
        return code
    return f"{text} ({detail})" if sep else text


class RecallResponse(BaseModel):
    """The outcome of one ``run_recall``.

    ``source``: ``fresh`` (retrieved now), ``persisted`` (a record replayed byte for byte) or ``none``.
    ``input_source`` names where ``recall_input`` came from (see :mod:`memory_recall.controller.inputs`;
    ``persisted-user-floor`` on a replay). ``record`` is the record written or replayed; ``stale`` says whether
    that record's graph version is behind the chat's current version.
    """

    model_config = ConfigDict(frozen=True)

    status: RecallStatus
    reason: str
    reason_text: str = ""
    source: RecallSource = "none"
    chat_id: str
    generation_type: GenerationType
    target_user_floor: int | None = None
    input_source: str = "none"
    input_reason: str = ""
    input_candidates: list[tuple[str, str]] = Field(default_factory=list)
    recall_input: str = ""
    recent_lines: list[str] = Field(default_factory=list)
    authoritative_input_used: bool = False
    injection_text: str = ""
    blocks: list[dict[str, Any]] = Field(default_factory=list)
    omitted: list[dict[str, Any]] = Field(default_factory=list)
    token_estimate: int = 0
    selected_node_ids: list[str] = Field(default_factory=list)
    selected: list[dict[str, Any]] = Field(default_factory=list)
    retrieval_status: str = ""
    semantic_search_used: bool = False
    #: Active nodes of the chat still without a vector of the embedding model (a sync or a model switch is
    #: embedding them in the background): recall found those by lexical and graph evidence only.
    vectors_missing: int = 0
    failure_category: str = ""
    llm_status: str = ""
    graph_version: int = 0
    traces: list[dict[str, Any]] = Field(default_factory=list)
    timings: dict[str, float] = Field(default_factory=dict)
    record: PersistedRecall | None = None
    record_persisted: bool = False
    stale: bool = False
    notes: dict[str, Any] = Field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "completed"


def _outcome(request: RecallRequest, status: RecallStatus, code: str, **extra: Any) -> RecallResponse:
    return RecallResponse(
        status=status,
        reason=code,
        reason_text=reason_text(code, request.locale),
        chat_id=request.chat_id,
        generation_type=request.generation_type,
        target_user_floor=request.target_user_floor,
        **extra,
    )


def check_request_gates(request: RecallRequest, settings: RecallSettings) -> RecallResponse | None:
    """Gates 1–4 (before any input is resolved); ``None`` when all pass. Gate 4 fires only when the request has
    neither messages nor a query or override text."""
    if not settings.controller.enabled:
        return _outcome(request, "skipped", Reason.DISABLED)
    if request.dry_run:
        return _outcome(request, "skipped", Reason.DRY_RUN)
    if request.generation_type in (GenerationType.QUIET, GenerationType.IMPERSONATE):
        return _outcome(request, "skipped", f"{Reason.GENERATION_TYPE_SKIPPED}:{request.generation_type.value}")
    explicit = normalize_recall_input(request.query_text) or normalize_recall_input(request.override_text)
    if not request.messages and not explicit:
        return _outcome(request, "skipped", Reason.EMPTY_CHAT)
    return None


def check_input_gates(request: RecallRequest, resolved: ResolvedInput) -> RecallResponse | None:
    """Gates 5–7 (after input resolution); ``None`` when all pass."""
    extra: dict[str, Any] = {
        "input_source": resolved.source,
        "input_reason": resolved.reason,
        "input_candidates": list(resolved.candidates),
        "recall_input": resolved.text,
        "recent_lines": list(resolved.recent_lines),
    }
    if request.generation_type in HISTORY_TYPES and resolved.target_user_floor is None:
        return _outcome(request, "skipped", Reason.NO_USER_FLOOR, **extra)
    if not resolved.text:
        return _outcome(request, "skipped", Reason.NO_USER_INPUT, **extra)
    trivial = is_trivial_input(resolved.text)
    if trivial.trivial:
        return _outcome(request, "skipped", f"{Reason.TRIVIAL_INPUT}:{trivial.reason}", **extra)
    return None
