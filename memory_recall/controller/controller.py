"""``RecallController.run_recall``: the one recall entry used by the CLI, the Python API and the HTTP service.

Usage::

    controller = RecallController(store, settings)
    response = controller.run_recall(RecallRequest(chat_id="c1", messages=msgs, target_user_floor=4))
    response.injection_text          # the memory block, fresh or replayed byte for byte

Flow (gates: :mod:`memory_recall.controller.gates`; input: :mod:`~memory_recall.controller.inputs`; reuse:
:mod:`~memory_recall.controller.replay`):

1. validate the request and its setting overrides; request gates; resolve the input; input gates;
2. the target floor's record is replayed when :func:`reuse_decision` allows it — no pipeline, no reinforcement,
   ``generation_count + 1`` written without a version bump;
3. otherwise ``retrieve`` on the chat's snapshot (cached per version), ``render`` with the injector, and in
   **one** ``store.write`` transaction: access reinforcement of ``result.reinforced_node_ids`` and the new
   record with ``graph_version = w.version`` (the version that transaction commits as). The snapshot cache is
   carried over that write (:meth:`SnapshotCache.apply_reinforcement`) instead of being rebuilt.

Versions (recall-spec departure 7). ``record.graph_version`` is compared with ``store.chat_version``: the record
is *stale* once anything changed the graph after it was computed (ingested or edited messages, imports, and
the access reinforcement of later recalls, which changes node importance). Record-only writes — a replay's
``generation_count``, a manual edit, a record deletion — go through :meth:`Store.set_record_unversioned` and
never bump the version, so they neither make other records look stale nor invalidate the snapshot. A fresh
recall that reinforces nothing writes its record the same way, with the snapshot's version.

Chat events (reference §2.1 "other host events"): an edited message is re-ingested and **its floor's record
deleted** (``MESSAGE_EDITED``); a deleted message is retired and only the record of that very floor is
deleted; a swiped assistant message is re-ingested and records are kept. An edit or a deletion names a message
the store holds: an unknown chat or floor raises :class:`NotFound` (the host's chat and the store differ, and the
host should send the chat again; nothing is created or changed).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from memory_recall.controller.gates import (
    Reason,
    RecallResponse,
    check_input_gates,
    check_request_gates,
    reason_text,
)
from memory_recall.controller.inputs import RecallRequest, ResolvedInput, parse_request, resolve_input
from memory_recall.controller.replay import is_stale, reuse_decision
from memory_recall.errors import ConfigError, InputError, NotFound, StageFailed, StrictModeViolation
from memory_recall.ingest.messages import (
    IngestReport,
    delete_message,
    edit_message,
    ingest_messages,
    message_id,
    remove_message,
    swipe_message,
)
from memory_recall.model.chat import ChatMessage, GenerationType
from memory_recall.model.graph import first_validation_error
from memory_recall.model.records import PersistedRecall, estimate_tokens
from memory_recall.pipeline.probabilistic import recall_seed
from memory_recall.pipeline.result import RecallResult
from memory_recall.pipeline.retrieve import prepare_snapshot, retrieve
from memory_recall.pipeline.state import Providers, RecallQuery
from memory_recall.providers.embedding import EngineGate
from memory_recall.settings import RecallSettings
from memory_recall.store.snapshot import GraphSnapshot, SnapshotCache
from memory_recall.store.sqlite import Store, validate_chat_id

__all__ = ["ChatEventReport", "RecallController", "RecordStatus", "run_recall"]

Pipeline = Callable[..., RecallResult]
Renderer = Callable[[RecallResult, Any], Any]


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _default_renderer(result: RecallResult, settings: Any) -> Any:
    from injector.render import render  # the injector package sits beside memory_recall (architecture "Layout")

    return render(result, settings)


class RecordStatus(BaseModel):
    """A persisted record and whether it is stale (its graph version is not the chat's current version)."""

    model_config = ConfigDict(frozen=True)

    record: PersistedRecall
    stale: bool
    current_version: int


@dataclass(frozen=True)
class ChatEventReport:
    """What a chat event changed: the ingest report (``None`` when nothing was ingested) and the record."""

    chat_id: str
    floor: int
    ingest: IngestReport | None
    record_deleted: bool


class RecallController:
    """Gates, input resolution, persisted replay and fresh recall over one store (see the module docstring).

    ``pipeline`` is ``retrieve`` or a callable with its signature (tests wrap it to count runs);
    ``renderer(result, settings.injector) -> Injection`` defaults to ``injector.render``; ``clock`` gives
    ``now`` in milliseconds when a request has no ``now_ms``.
    """

    def __init__(
        self,
        store: Store,
        settings: RecallSettings | None = None,
        *,
        embedder: Any = None,
        llm: Any = None,
        snapshot_cache: SnapshotCache | None = None,
        pipeline: Pipeline = retrieve,
        renderer: Renderer | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.store = store
        self.settings = settings if settings is not None else RecallSettings()
        self.embedder = embedder
        self.llm = llm
        self.snapshot_cache = (
            snapshot_cache if snapshot_cache is not None else SnapshotCache(on_update=prepare_snapshot)
        )
        self.pipeline = pipeline
        self.renderer = renderer if renderer is not None else _default_renderer
        self.clock = clock if clock is not None else _wall_clock_ms

    # -- recall --------------------------------------------------------------------------------------------

    def run_recall(self, request: RecallRequest | dict[str, Any]) -> RecallResponse:
        """Run one recall request; raises :class:`InputError` (naming the field) on a bad request."""
        start = time.perf_counter()
        req = parse_request(request)
        settings = self._settings_for(req)
        now = req.now_ms if req.now_ms is not None else self.clock()
        gated = check_request_gates(req, settings)
        if gated is not None:
            return gated
        resolved = resolve_input(req, settings.controller.recent_context_messages)
        gated = check_input_gates(req, resolved)
        if gated is not None:
            return gated
        chat = req.chat_id
        current_version = self.store.chat_version(chat)
        target = resolved.target_user_floor
        record = self.store.get_record(chat, target) if target is not None and req.persist else None
        decision = reuse_decision(
            req, resolved, record, current_version=current_version,
            replay_stale=settings.controller.replay_stale_records,
        )
        if decision.reuse and decision.record is not None and req.persist:
            return self._replay(req, resolved, decision.record, current_version, decision.why, now, start)
        # Passage embedding (a write's background vectors) holds back while the recall runs: none of those
        # vectors could reach this recall's snapshot, and the engine would slow it (EngineGate.recalling).
        gate = getattr(self.embedder, "gate", None)
        with gate.recalling() if isinstance(gate, EngineGate) else contextlib.nullcontext():
            return self._fresh(req, resolved, settings, now, start, reuse_why=decision.why, previous=record)

    def _settings_for(self, req: RecallRequest) -> RecallSettings:
        try:
            return self.settings.with_overrides(req.options, strict=True)
        except ConfigError as exc:
            raise InputError("options", exc.message) from None

    def _base(self, req: RecallRequest, resolved: ResolvedInput) -> dict[str, Any]:
        return {
            "chat_id": req.chat_id,
            "generation_type": req.generation_type,
            "target_user_floor": resolved.target_user_floor,
            "input_candidates": list(resolved.candidates),
            "recent_lines": list(resolved.recent_lines),
        }

    def _replay(
        self,
        req: RecallRequest,
        resolved: ResolvedInput,
        record: PersistedRecall,
        current_version: int,
        why: str,
        now: int,
        start: float,
    ) -> RecallResponse:
        bumped = record.model_copy(update={"generation_count": record.generation_count + 1})
        self.store.set_record_unversioned(req.chat_id, record.user_floor, bumped)
        return RecallResponse(
            status="completed",
            reason=Reason.REUSED,
            reason_text=reason_text(Reason.REUSED, req.locale),
            source="persisted",
            input_source="persisted-user-floor",
            input_reason="persisted-user-floor-reuse",
            recall_input=record.recall_input,
            authoritative_input_used=record.authoritative_input_used or resolved.authoritative,
            injection_text=record.injection_text,
            blocks=list(record.blocks),
            token_estimate=record.token_estimate,
            selected_node_ids=list(record.selected_node_ids),
            retrieval_status="persisted",
            llm_status="persisted",
            graph_version=current_version,
            timings={"total": (time.perf_counter() - start) * 1000.0},
            record=bumped,
            stale=is_stale(record, current_version),
            notes={"reuse": why, "resolved_input": resolved.text, "resolved_source": resolved.source},
            **self._base(req, resolved),
        )

    def _fresh(
        self,
        req: RecallRequest,
        resolved: ResolvedInput,
        settings: RecallSettings,
        now: int,
        start: float,
        *,
        reuse_why: str,
        previous: PersistedRecall | None,
    ) -> RecallResponse:
        chat = req.chat_id
        target = resolved.target_user_floor
        model_id = str(getattr(self.embedder, "model_id", "") or "") if self.embedder is not None else ""
        snapshot = self.snapshot_cache.get(self.store, chat, model_id, now_ms=now)
        owner_keys, user_owner = check_owner_keys(req, snapshot)
        query = RecallQuery(
            user_message=resolved.text,
            recent_lines=resolved.recent_lines,
            now_ms=now,
            seed=recall_seed(chat, target, snapshot.version),
            chat_id=chat,
            user_floor=target,
            active_region=req.active_region,
            active_owner_keys=owner_keys,
            active_character_pov_owner=req.active_character_pov_owner,
            active_user_pov_owner=user_owner,
            visibility_filter=req.visibility_filter,
            host_character_name=req.host_character_name,
            host_user_name=req.host_user_name,
        )
        strict = req.strict if req.strict is not None else settings.embedding.strict
        providers = Providers(
            embedder=self.embedder,
            llm=self.llm,
            lexical_index=lambda terms, limit, **kw: self.store.bm25(chat, terms, limit, **kw),
            strict=strict,
        )
        base = self._base(req, resolved)
        input_fields: dict[str, Any] = {
            "input_source": resolved.source,
            "input_reason": resolved.reason,
            "recall_input": resolved.text,
            "authoritative_input_used": resolved.authoritative,
        }
        try:
            result = self.pipeline(snapshot, query, settings, providers)
        except StrictModeViolation as exc:
            return RecallResponse(
                status="aborted", reason=Reason.STRICT, reason_text=str(exc), failure_category=exc.cause.category,
                graph_version=snapshot.version, **input_fields, **base,
            )
        except StageFailed as exc:
            return RecallResponse(
                status="failed", reason=Reason.STAGE_FAILED, reason_text=str(exc), graph_version=snapshot.version,
                notes={"stage": exc.stage}, **input_fields, **base,
            )
        injection = self.renderer(result, settings.injector)
        text = str(injection.text).strip()
        blocks = [b.model_dump(mode="json") if hasattr(b, "model_dump") else dict(b) for b in injection.blocks]
        omitted = [o.model_dump(mode="json") if hasattr(o, "model_dump") else dict(o) for o in injection.omitted]
        reinforce_ids = list(result.reinforced_node_ids)
        record: PersistedRecall | None = None
        if text and target is not None:
            record = PersistedRecall(
                chat_id=chat,
                user_floor=target,
                injection_text=text,
                blocks=blocks,
                selected_node_ids=tuple(result.selected_node_ids),
                recall_input=resolved.text,
                recall_source=resolved.source,
                hook_name=req.generation_type.value,
                token_estimate=estimate_tokens(text),
                bound_user_floor_text=resolved.floor_text or resolved.text,
                authoritative_input_used=resolved.authoritative,
                graph_version=snapshot.version,
                created_at=previous.created_at if previous is not None and previous.created_at else now,
                updated_at=now,
            )
        step = settings.reinforcement.importance_step if settings.reinforcement.enabled else 0.0
        if req.persist:
            record, version = self._persist(chat, model_id, record, reinforce_ids, snapshot.version, now, step)
        else:  # evaluation / what-if run: nothing is written (see RecallRequest.persist)
            record, version, reinforce_ids = None, snapshot.version, []
        timings = dict(result.timings)
        timings["total"] = (time.perf_counter() - start) * 1000.0
        return RecallResponse(
            status="completed",
            reason=Reason.COMPLETED,
            reason_text=reason_text(Reason.COMPLETED, req.locale),
            # Reference resolveFinalRecallInjectionSource: an empty fresh block injects nothing. Departure: the
            # floor's older record is not substituted (reuse already declined it: edited floor, re-recall …).
            source="fresh" if text else "none",
            injection_text=text,
            blocks=blocks,
            omitted=omitted,
            token_estimate=estimate_tokens(text),
            selected_node_ids=list(result.selected_node_ids),
            selected=[m.model_dump(mode="json") for m in result.selected],
            retrieval_status=result.retrieval_status,
            semantic_search_used=result.semantic_search_used,
            vectors_missing=_vectors_missing(snapshot) if model_id else 0,
            failure_category=result.failure_category,
            llm_status=result.llm_status,
            graph_version=version,
            traces=list(result.traces),
            timings=timings,
            record=record,
            record_persisted=record is not None,
            stale=record is not None and is_stale(record, version),
            notes={"reuse": reuse_why, "reinforced": len(reinforce_ids)},
            **input_fields,
            **base,
        )

    def _persist(
        self,
        chat: str,
        model_id: str,
        record: PersistedRecall | None,
        reinforce_ids: list[str],
        snapshot_version: int,
        now: int,
        step: float = 0.1,
    ) -> tuple[PersistedRecall | None, int]:
        """Reinforcement + record in one transaction; returns the record as written and the chat's version."""
        if not reinforce_ids:
            if record is None:
                return None, snapshot_version
            if snapshot_version > 0:
                try:
                    self.store.set_record_unversioned(chat, record.user_floor, record)
                    return record, self.store.chat_version(chat)
                except NotFound:
                    pass  # the chat vanished meanwhile: a versioned batch creates it again
        with self.store.write(chat) as w:
            base_version = w.chat_version(chat)
            if reinforce_ids:
                w.reinforce(reinforce_ids, now, step)
            if record is not None:
                # Computed on the graph the batch starts from → it is current as of this batch's version.
                graph_version = w.version if base_version == snapshot_version else snapshot_version
                record = record.model_copy(update={"graph_version": graph_version})
                w.put_record(record)
            new_version = w.version
        self.snapshot_cache.apply_reinforcement(
            chat, model_id, reinforce_ids, step, new_version,
            base_version=base_version, now_ms=now,
        )
        return record, new_version

    # -- records -------------------------------------------------------------------------------------------

    def get_record(self, chat_id: str, user_floor: int) -> RecordStatus | None:
        """The record of one user floor with its staleness, or ``None``."""
        with self.store.read() as r:
            record = r.get_record(chat_id, user_floor)
            version = r.chat_version(chat_id)
        if record is None:
            return None
        return RecordStatus(record=record, stale=is_stale(record, version), current_version=version)

    def list_records(self, chat_id: str) -> list[RecordStatus]:
        """Every record of the chat by floor, with staleness."""
        with self.store.read() as r:
            records = r.list_records(chat_id)
            version = r.chat_version(chat_id)
        return [RecordStatus(record=x, stale=is_stale(x, version), current_version=version) for x in records]

    def edit_record(self, chat_id: str, user_floor: int, text: str, *, now_ms: int | None = None) -> RecordStatus:
        """Replace the injection text of a record (a manual edit: replays return it byte for byte).

        ``manually_edited`` is set, ``blocks`` are dropped (they describe the unedited text) and the version is not
        bumped, so the record's staleness does not change.
        """
        current = self.get_record(chat_id, user_floor)
        if current is None:
            raise NotFound("user_floor", f"chat {chat_id!r} has no recall record at floor {user_floor}")
        if not isinstance(text, str):
            raise InputError("text", f"must be a string, got {type(text).__name__}")
        now = now_ms if now_ms is not None else self.clock()
        data = current.record.model_dump()
        data.update(
            injection_text=text, manually_edited=True, token_estimate=estimate_tokens(text.strip()), updated_at=now,
            blocks=[],
        )
        try:
            edited = PersistedRecall.model_validate(data)
        except ValidationError as exc:
            err = first_validation_error(exc)
            raise InputError("text" if err.field == "injection_text" else err.field, err.reason) from None
        self.store.set_record_unversioned(chat_id, user_floor, edited)
        return RecordStatus(record=edited, stale=current.stale, current_version=current.current_version)

    def delete_record(self, chat_id: str, user_floor: int) -> bool:
        """Delete the record of one user floor (no version bump); ``False`` when there was none."""
        validate_chat_id(chat_id)
        if self.store.chat_version(chat_id) == 0:
            return False
        return self.store.set_record_unversioned(chat_id, user_floor, None)

    def rerecall(
        self,
        chat_id: str,
        user_floor: int,
        *,
        messages: Sequence[ChatMessage] = (),
        query_text: str = "",
        now_ms: int | None = None,
        **scene: Any,
    ) -> RecallResponse:
        """Explicit re-recall of one user floor: always a fresh retrieval (departure 7, fixes §7 item 11).

        Without ``messages`` the floor's text is taken from its record (bound text, else recall input).
        ``scene`` takes the other :class:`RecallRequest` fields (``active_region``, ``options`` …).
        """
        msgs = list(messages)
        if not msgs:
            status = self.get_record(chat_id, user_floor)
            if status is not None:
                text = status.record.bound_user_floor_text or status.record.recall_input
                msgs = [ChatMessage(floor=user_floor, role="user", text=text)]
        data: dict[str, Any] = {
            "chat_id": chat_id,
            "messages": msgs,
            "generation_type": GenerationType.NORMAL,
            "target_user_floor": user_floor,
            "query_text": query_text,
            "rerecall": True,
            "now_ms": now_ms,
            **scene,
        }
        return self.run_recall(data)

    # -- chat events ---------------------------------------------------------------------------------------

    def _known(self, chat_id: str, floor: int) -> bool:
        node = self.store.get_node(chat_id, message_id(floor))
        return node is not None and not node.archived

    def _require_message(self, chat_id: str, floor: int, field: str) -> None:
        """:class:`NotFound` naming the chat, or ``field`` and the floor, unless the chat holds an active message
        at ``floor``."""
        if self.store.chat_version(chat_id) == 0:
            raise NotFound("chat_id", f"unknown chat {chat_id!r}")
        if not self._known(chat_id, floor):
            raise NotFound(field, f"chat {chat_id!r} has no message at floor {floor}")

    def refresh(self, chat_id: str, *, now_ms: int | None = None) -> list[str]:
        """Bring what the next recall of ``chat_id`` reads up to date right after a write: the cached snapshots by
        the store's delta (:meth:`SnapshotCache.refresh`), the per-structure values of the pipeline derived from
        the previous structure's (:func:`~memory_recall.pipeline.retrieve.prepare_snapshot`) and the cached BM25
        indexes (:meth:`Store.refresh_bm25`) — the work the first recall after the write would do, in time
        proportional to what changed; nothing is built from scratch. Every chat event calls it. Returns the
        names of what was updated (figures, tests): ``snapshot`` per snapshot, the keys of the values derived here
        (none when the cache derives them itself, :attr:`SnapshotCache.on_update`) and the BM25 stems."""
        now = now_ms if now_ms is not None else self.clock()
        done: list[str] = []
        derive = self.snapshot_cache.on_update is None
        for snapshot in self.snapshot_cache.refresh(self.store, chat_id, now_ms=now):
            done.append("snapshot")
            if derive:
                done.extend(str(key) for key in prepare_snapshot(snapshot))
        refresh_bm25 = getattr(self.store, "refresh_bm25", None)
        if refresh_bm25 is not None:
            done.extend(f"bm25:{stem}" for stem in refresh_bm25(chat_id))
        return done

    def on_message_added(self, chat_id: str, message: ChatMessage, *, now_ms: int | None = None) -> ChatEventReport:
        """A new message: ingest it (then :meth:`refresh`)."""
        now = now_ms if now_ms is not None else self.clock()
        report = ingest_messages(self.store, chat_id, [message], now_ms=now)
        self.refresh(chat_id, now_ms=now)
        return ChatEventReport(chat_id, message.floor, report, False)

    def on_message_edited(self, chat_id: str, message: ChatMessage, *, now_ms: int | None = None) -> ChatEventReport:
        """``MESSAGE_EDITED``: re-ingest the message and delete the record of its floor, so the next recall for
        that floor is fresh. :class:`NotFound` (nothing written) when the chat or the floor is unknown."""
        now = now_ms if now_ms is not None else self.clock()
        self._require_message(chat_id, message.floor, "message.floor")
        report = edit_message(self.store, chat_id, message, now_ms=now)
        deleted = self.delete_record(chat_id, message.floor)
        self.refresh(chat_id, now_ms=now)
        return ChatEventReport(chat_id, message.floor, report, deleted)

    def on_message_deleted(self, chat_id: str, floor: int, *, now_ms: int | None = None) -> ChatEventReport:
        """``MESSAGE_DELETED``: retire the message; records are kept (reference) except the deleted floor's own.
        :class:`NotFound` (nothing written) when the chat or the floor is unknown."""
        now = now_ms if now_ms is not None else self.clock()
        self._require_message(chat_id, floor, "floor")
        report = delete_message(self.store, chat_id, floor, now_ms=now)
        deleted = self.delete_record(chat_id, floor)
        self.refresh(chat_id, now_ms=now)
        return ChatEventReport(chat_id, floor, report, deleted)

    def on_message_removed(self, chat_id: str, floor: int, *, now_ms: int | None = None) -> ChatEventReport:
        """A message was removed from the middle of the chat and later messages moved down a floor (what
        SillyTavern does on a deletion): :func:`~memory_recall.ingest.messages.remove_message` moves their nodes,
        vectors and records with them; the removed floor's record is dropped. :class:`NotFound` (nothing written)
        when the chat or the floor is unknown."""
        now = now_ms if now_ms is not None else self.clock()
        validate_chat_id(chat_id)
        self._require_message(chat_id, floor, "floor")
        had_record = self.store.get_record(chat_id, floor) is not None
        report = remove_message(self.store, chat_id, floor, now_ms=now)
        self.refresh(chat_id, now_ms=now)
        return ChatEventReport(chat_id, floor, report, had_record)

    def on_message_swiped(self, chat_id: str, message: ChatMessage, *, now_ms: int | None = None) -> ChatEventReport:
        """``MESSAGE_SWIPED`` (a new assistant alternative): re-ingest it; records are kept (reference §2.1)."""
        now = now_ms if now_ms is not None else self.clock()
        if self._known(chat_id, message.floor):
            report = swipe_message(self.store, chat_id, message, now_ms=now)
        else:
            if message.role != "assistant":
                raise InputError("message.role", f"a swipe replaces an assistant message; got {message.role!r}")
            report = ingest_messages(self.store, chat_id, [message], now_ms=now)
        self.refresh(chat_id, now_ms=now)
        return ChatEventReport(chat_id, message.floor, report, False)


def check_owner_keys(req: RecallRequest, snapshot: GraphSnapshot) -> tuple[tuple[str, ...] | None, str]:
    """The request's scene owners checked against the chat's knowledge state (recall-spec departure 4): every
    ``active_owner_keys`` entry must be a key the state holds (with or without ``#nodeId``), and an
    ``active_user_pov_owner`` written as a key (``user:…``) must be a user entry's; it is returned as that
    entry's name (the form the context stage reads; a plain name passes unchanged). An unknown key is an
    :class:`InputError` naming the field, the key and the known keys — never an owner without an entry, who
    would see every memory. Returns ``(owner keys or None, user POV owner)``. O(keys × owners)."""
    know = snapshot.knowledge
    known = ", ".join(know.owner_keys) if know.owner_keys else "none (the chat has no knowledge state)"
    keys = req.active_owner_keys
    for i, key in enumerate(keys or ()):
        if know.row(key) < 0:
            # A bare name, or a name under the wrong kind (``character:wren`` for ``user:wren``): name its key.
            wanted = {key.strip().lower(), key.strip().lower().split(":", 1)[-1].split("#", 1)[0]}
            hint = next((f" (did you mean {k!r}?)" for k, names in zip(know.owner_keys, know.aliases, strict=True)
                         if wanted & {x.lower() for x in names}), "")
            raise InputError(f"active_owner_keys[{i}]", f"unknown owner key {key!r}{hint}; known keys: {known}")
    user = req.active_user_pov_owner
    if user.strip().lower().startswith("user:"):
        row = know.row(user.strip())
        if row < 0 or know.owner_types[row] != "user":
            users = ", ".join(k for k, t in zip(know.owner_keys, know.owner_types, strict=True) if t == "user")
            raise InputError("active_user_pov_owner", f"unknown user owner key {user!r}; known user keys: "
                             f"{users or 'none'}")
        user = know.owner_names[row] or user.strip().split(":", 1)[1]
    return (tuple(keys) if keys is not None else None), user


def _vectors_missing(snapshot: Any) -> int:
    """Active nodes of the snapshot without a vector."""
    return int(np.count_nonzero(~snapshot.has_vector & ~snapshot.archived))


def run_recall(
    request: RecallRequest | dict[str, Any],
    *,
    store: Store,
    settings: RecallSettings | None = None,
    embedder: Any = None,
    llm: Any = None,
    snapshot_cache: SnapshotCache | None = None,
    pipeline: Pipeline = retrieve,
    renderer: Renderer | None = None,
) -> RecallResponse:
    """One-shot :meth:`RecallController.run_recall` (a throw-away controller; pass ``snapshot_cache`` to share)."""
    controller = RecallController(
        store, settings, embedder=embedder, llm=llm, snapshot_cache=snapshot_cache, pipeline=pipeline,
        renderer=renderer,
    )
    return controller.run_recall(request)
