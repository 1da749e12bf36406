"""Rerank stage: the optional LLM rerank of the candidate pool (reference §3.15).

Runs after diversity (which builds the pool) and before the owner stage.

Reads
    ``state.pool`` (candidate node indices in pool order), ``state.scored`` (weighted score, scope and temporal
    bucket, knowledge mode and visibility of each pool node), ``state.context`` and ``state.scored`` through
    :func:`~memory_recall.pipeline.owners.scene_owner_candidates` (the scene-owner candidates the LLM may
    choose from), ``state.query`` (user message, recent lines), the pool nodes' fields; ``providers.llm``
    (:class:`~memory_recall.providers.llm.ChatLLM`) and ``providers.strict``.
Writes
    ``state.selection`` and ``state.llm`` (the reference's ``meta.retrieval.llm``): ``enabled``, ``status``
    (``llm`` / ``fallback`` / ``disabled`` / ``skipped``), ``reason``, ``selectionProtocol``
    (``candidate-keys-v1`` / ``legacy-selected-ids`` / ``""``), ``rawSelectedKeys``, ``resolvedSelectedKeys``,
    ``resolvedSelectedNodeIds``, ``fallbackReason``, ``fallbackType``, ``emptySelectionAccepted`` (always
    false), ``candidateKeyMapPreview`` (key → nodeId, type, label, scopeBucket, temporalBucket, score),
    ``legacySelectionUsed``, ``candidatePool``, ``selectedSeedCount``, ``activeOwnerKeys`` and
    ``activeOwnerScores`` (the LLM's owners resolved against the scene-owner candidates; empty on fallback),
    plus this project's ``failureCategory``, ``failureDetail``, ``deadlineS`` and ``attempts``.
Outcomes
    * Rerank disabled (``RerankSettings.enabled`` false): selection = the pool, status ``disabled``, reason
      ``LLM 精排已关闭，直接采用评分排序`` (trace skip ``rerank-disabled``, trace only).
    * No LLM configured (``providers.llm`` is None): selection = the pool, status ``skipped``, reason code
      ``no-llm-configured`` (also in ``skip_reasons``).
    * Empty pool: nothing to rerank, selection empty, status ``skipped``, ``empty-candidate-pool``.
    * Otherwise one call: candidates get keys ``R1…Rn`` in pool order; each candidate line is
      ``[Rk] 类型=<schema label>, 作用域=<describeMemoryScope>, 时间=<story label or 未标注>, 时间桶=<temporal
      bucket>, 召回桶=<角色 POV | 用户 POV | 当前地区客观 | 邻近地区客观 | 全局客观 | 其他 POV>, 认知=<knowledge
      mode>, 可见性=<visibility, 3 dp>, <field>: <value>, … (评分=<weighted score, 3 dp>)`` — the model never
      sees a node id. The answer is parsed by :func:`~memory_recall.providers.llm.parse_rerank_answer`.
Selection rules (§3.15 "Parsing" and "Outcome")
    Lists are trimmed, de-duplicated and capped at ``4 × maxRecallNodes``. ``selected_keys`` present: not a
    list → ``invalid-candidate``; empty → ``empty-selection``; else the keys of the key map (``[R3]``/``r3``
    accepted as ``R3``), first ``maxRecallNodes``, mapped to node ids; none valid → ``invalid-candidate``.
    Else ``selected_ids`` present (legacy): same checks, ids must be in the pool. Neither → ``invalid-candidate``.
    At least one resolved id → status ``llm`` and the selection is those ids in the LLM's order; otherwise
    status ``fallback`` and the selection is the first ``maxRecallNodes`` of the pool, owner keys discarded.
Failure policy (recall-spec departure 3)
    One attempt within ``LLMSettings.timeout_s`` (the reference makes up to 3 attempts of up to 300 s each:
    §7 item 20). An :class:`~memory_recall.errors.LLMUnavailable` falls back with ``fallbackType`` = its
    category (``timeout``, ``connect``, ``http_status``, ``bad_payload``, ``refusal``) — except
    ``unknown_keys`` (valid JSON without any answer key), which the reference calls ``invalid-candidate``.
    Reference types map as: ``invalid-json``/``truncated-json`` → ``bad_payload`` (same reason text
    ``LLM 精排未返回有效 JSON，已回退到评分排序``), ``empty-response`` → ``refusal``, ``provider-error`` →
    ``http_status``/``connect``. With ``providers.strict`` (or ``LLMSettings.strict``) the failure raises
    :class:`~memory_recall.errors.StrictModeViolation` instead.
Settings
    ``RerankSettings.enabled``; ``SelectionSettings.max_recall_nodes`` (``maxNodes``) and
    ``llm_candidate_pool`` (scene-owner scan size); ``LLMSettings.timeout_s`` and ``strict``. The
    reference's ``maxCompletionTokens = max(512, 160 × maxRecallNodes)`` belongs to whoever builds the client
    (:func:`~memory_recall.providers.llm.make_llm` ``max_tokens``).
Departures
    * 3 — one attempt, then fallback (above).
    * Values that are JSON objects are shown as compact JSON in candidate lines (JS string conversion prints
      ``[object Object]``, which tells the model nothing); everything else follows JS ``String()``.
    * Keys are matched leniently (``[R3]``, ``r3``) and owner keys with or without ``#nodeId`` (departure 2).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from memory_recall.errors import LLMUnavailable, StrictModeViolation
from memory_recall.model.graph import DEFAULT_SCHEMA, Node, describe_memory_scope
from memory_recall.pipeline._admission import rows_of
from memory_recall.pipeline.owners import owner_base_key, scene_owner_candidates
from memory_recall.pipeline.state import (
    OwnerCandidate,
    Providers,
    RecallState,
    TimedStage,
)
from memory_recall.providers.llm import RerankAnswer, build_rerank_messages, parse_rerank_answer
from memory_recall.settings import LLMSettings, RerankSettings, SelectionSettings
from memory_recall.text.mentions import fold
from memory_recall.text.normalize import cut_js, js_len

__all__ = [
    "BUCKET_DESCRIPTIONS",
    "DISABLED_REASON",
    "FALLBACK_REASONS",
    "RerankStage",
    "candidate_line",
    "js_string",
]

DISABLED_REASON = "LLM 精排已关闭，直接采用评分排序"
NO_LLM_REASON = "未配置 LLM，直接采用评分排序"
EMPTY_POOL_REASON = "没有可供精排的候选，跳过 LLM 精排"
KEY_PREFIX = "R"
LABEL_LIMIT = 80  # reference §5.3 "label length 80"
MAX_OWNER_KEYS = 4

#: ``召回桶`` descriptions of the candidate line (reference §3.15).
BUCKET_DESCRIPTIONS: dict[str, str] = {
    "characterPov": "角色 POV",
    "userPov": "用户 POV",
    "objectiveCurrentRegion": "当前地区客观",
    "objectiveAdjacentRegion": "邻近地区客观",
    "objectiveGlobal": "全局客观",
    "otherPov": "其他 POV",
}

#: Human-readable fallback reasons by fallback type (the reference's wording where it has one).
FALLBACK_REASONS: dict[str, str] = {
    "empty-selection": "LLM 精排未选择任何候选，已回退到评分排序",
    "invalid-candidate": "LLM 精排返回的候选无效，已回退到评分排序",
    "bad_payload": "LLM 精排未返回有效 JSON，已回退到评分排序",
    "timeout": "LLM 精排超时，已回退到评分排序",
    "connect": "LLM 精排连接失败，已回退到评分排序",
    "http_status": "LLM 精排请求失败，已回退到评分排序",
    "refusal": "LLM 精排返回空响应或拒绝回答，已回退到评分排序",
    "not_configured": "LLM 未配置，已回退到评分排序",
}
_GENERIC_FALLBACK = "LLM 精排失败，已回退到评分排序"

_SCHEMA_LABELS = {spec.id: spec.label for spec in DEFAULT_SCHEMA}
_KEY_RE = re.compile(r"^\[?\s*[Rr](\d+)\s*\]?$")


def js_string(value: Any) -> str:
    """JavaScript ``String(value)`` of a JSON value (``null``, ``true``, ``1``, ``a,b``); objects as compact
    JSON (see the module docstring).

    >>> js_string([1, "b", None, True]), js_string(2.0), js_string(0.5), js_string({"a": 1})
    ('1,b,,true', '2', '0.5', '{"a":1}')
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        return ",".join("" if v is None else js_string(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return str(value)


def _story_label(node: Node) -> str:
    return node.story_time.describe() or node.story_time_span.describe()


def candidate_line(
    key: str,
    node: Node,
    *,
    scope_bucket: str,
    temporal_bucket: str,
    knowledge_mode: str,
    visibility: float,
    weighted_score: float,
) -> str:
    """One candidate line of the rerank prompt (reference §3.15), keyed ``[Rk]``; never contains the node id
    (unless a field value does)."""
    parts = [
        f"类型={_SCHEMA_LABELS.get(node.type, node.type)}",
        f"作用域={describe_memory_scope(node.scope)}",
        f"时间={_story_label(node) or '未标注'}",
        f"时间桶={temporal_bucket}",
        f"召回桶={BUCKET_DESCRIPTIONS.get(scope_bucket, scope_bucket)}",
        f"认知={knowledge_mode}",
        f"可见性={visibility:.3f}",
    ]
    parts.extend(f"{name}: {js_string(value)}" for name, value in node.fields.items())
    return f"[{key}] " + ", ".join(parts) + f" (评分={weighted_score:.3f})"


def _key_label(node: Node) -> str:
    """title/name/summary/insight/belief, else the id prefix; at most 80 JS units with "…"."""
    for field_name in ("title", "name", "summary", "insight", "belief"):
        texts = node.field_text(field_name)
        if texts:
            text = texts[0].strip()
            return text if js_len(text) <= LABEL_LIMIT else cut_js(text, LABEL_LIMIT - 1) + "…"
    return node.id[:8]


def _clean_list(values: Sequence[Any], cap: int) -> list[str]:
    """Trimmed, non-empty, de-duplicated strings, at most ``cap`` (reference: ``4 × maxNodes``)."""
    out: list[str] = []
    seen: set[str] = set()
    for value in values:
        if value is None or isinstance(value, dict | list):
            continue
        text = js_string(value).strip()
        if text and text not in seen:
            seen.add(text)
            out.append(text)
            if len(out) >= cap:
                break
    return out


def _normalise_key(text: str) -> str:
    match = _KEY_RE.match(text.strip())
    return f"{KEY_PREFIX}{int(match.group(1))}" if match else text.strip()


def _resolve_owner(value: Any, candidates: Sequence[OwnerCandidate], aliases: dict[str, list[str]]) -> str:
    """The scene-owner candidate key ``value`` names: exact key, key with/without ``#nodeId``, or a
    case-insensitive name/alias; ``""`` when none (reference §3.15)."""
    if not isinstance(value, str) or not value.strip():
        return ""
    text = value.strip()
    for c in candidates:
        if c.owner_key == text:
            return c.owner_key
    base = owner_base_key(text)
    for c in candidates:
        if owner_base_key(c.owner_key) == base:
            return c.owner_key
    folded = fold(text)
    for c in candidates:
        names = [c.owner_name, *aliases.get(c.owner_key, [])]
        if any(n and fold(n.strip()) == folded for n in names):
            return c.owner_key
    return ""


class RerankStage(TimedStage):
    """One LLM call that picks the memories from the candidate pool (see the module docstring).

    Usage: ``RerankStage(settings.rerank, settings.selection, providers, settings.llm).run(state)``.
    """

    name = "rerank"

    def __init__(
        self,
        settings: RerankSettings,
        selection: SelectionSettings,
        providers: Providers | None = None,
        llm_settings: LLMSettings | None = None,
    ) -> None:
        self.settings = settings
        self.selection = selection
        self.providers = providers
        self.llm_settings = llm_settings

    # -- meta ------------------------------------------------------------------------------------------------

    def _base_meta(self, status: str, reason: str, pool_size: int) -> dict[str, Any]:
        return {
            "enabled": bool(self.settings.enabled),
            "status": status,
            "reason": reason,
            "selectionProtocol": "",
            "rawSelectedKeys": [],
            "resolvedSelectedKeys": [],
            "resolvedSelectedNodeIds": [],
            "fallbackReason": "",
            "fallbackType": "",
            "emptySelectionAccepted": False,
            "candidateKeyMapPreview": {},
            "legacySelectionUsed": False,
            "candidatePool": pool_size,
            "selectedSeedCount": 0,
            "activeOwnerKeys": [],
            "activeOwnerScores": [],
            "failureCategory": "",
            "failureDetail": "",
            "deadlineS": float(self.llm_settings.timeout_s) if self.llm_settings is not None else None,
            "attempts": 0,
        }

    # -- run -------------------------------------------------------------------------------------------------

    def _run(self, state: RecallState) -> tuple[RecallState, dict[str, Any]]:
        base_fields: dict[str, Any] = {"score_kind": "selection_rank", "score_direction": "lower_is_better"}
        pool = list(dict.fromkeys(map(int, state.pool)))  # duplicate ids skipped (reference)
        llm = self.providers.llm if self.providers is not None else None
        if not self.settings.enabled:
            meta = self._base_meta("disabled", DISABLED_REASON, len(pool))
            return state.evolve(selection=tuple(pool), llm=meta), {
                **base_fields, "count_in": len(pool), "count_out": len(pool), "skipped": True,
                "skip_reason": "rerank-disabled",
            }
        if not pool:
            meta = self._base_meta("skipped", EMPTY_POOL_REASON, 0)
            meta["skipReason"] = "empty-candidate-pool"
            return state.evolve(selection=(), llm=meta, skip_reasons=state.with_skip("empty-candidate-pool")), {
                **base_fields, "skipped": True, "skip_reason": "empty-candidate-pool",
            }
        if llm is None:
            meta = self._base_meta("skipped", NO_LLM_REASON, len(pool))
            meta["skipReason"] = "no-llm-configured"
            return state.evolve(
                selection=tuple(pool), llm=meta, skip_reasons=state.with_skip("no-llm-configured")
            ), {
                **base_fields, "count_in": len(pool), "count_out": len(pool), "skipped": True,
                "skip_reason": "no-llm-configured",
            }
        return self._rerank(state, pool, llm, base_fields)

    def _rerank(
        self, state: RecallState, pool: list[int], llm: Any, base_fields: dict[str, Any]
    ) -> tuple[RecallState, dict[str, Any]]:
        snap = state.snapshot
        max_nodes = int(self.selection.max_recall_nodes)
        idx = np.array(pool, dtype=np.int64)
        rows = rows_of(state, idx)
        table = state.scored
        keys = [f"{KEY_PREFIX}{k + 1}" for k in range(len(pool))]
        key_to_node = dict(zip(keys, pool, strict=True))
        lines: list[str] = []
        preview: dict[str, dict[str, Any]] = {}
        for key, i, r in zip(keys, pool, rows.tolist(), strict=True):
            node = snap.node(i)
            bucket = table.scope_bucket[r] if r >= 0 else "objectiveGlobal"
            temporal = table.temporal_bucket[r] if r >= 0 else "undated"
            mode = table.knowledge_mode[r] if r >= 0 else "no-owner-state"
            vis = float(table.knowledge_visibility[r]) if r >= 0 else 0.0
            score = float(table.weighted_score[r]) if r >= 0 else 0.0
            lines.append(candidate_line(key, node, scope_bucket=bucket, temporal_bucket=temporal,
                                        knowledge_mode=mode, visibility=vis, weighted_score=score))
            preview[key] = {
                "nodeId": node.id, "type": node.type, "label": _key_label(node), "scopeBucket": bucket,
                "temporalBucket": temporal, "score": round(score, 3),
            }

        owners = scene_owner_candidates(state, self.selection)
        owner_lines = [
            f"- ownerKey={c.owner_key}; ownerName={c.owner_name}; score={c.score:.3f}; reasons={','.join(c.reasons)}"
            for c in owners
        ]
        meta = self._base_meta("pending", "", len(pool))
        meta["candidateKeyMapPreview"] = preview
        meta["attempts"] = 1
        deadline = float(self.llm_settings.timeout_s) if self.llm_settings is not None else 20.0
        strict = bool((self.providers is not None and self.providers.strict)
                      or (self.llm_settings is not None and self.llm_settings.strict))
        messages = build_rerank_messages(
            context_lines=list(state.query.recent_lines),
            user_message=state.query.user_message,
            candidate_lines=lines,
            owner_lines=owner_lines,
            max_nodes=max_nodes,
        )
        try:
            answer = parse_rerank_answer(llm.complete(messages, deadline_s=deadline))
        except LLMUnavailable as exc:
            if strict:
                raise StrictModeViolation(exc) from exc
            meta["failureCategory"] = exc.category
            meta["failureDetail"] = exc.detail
            kind = "invalid-candidate" if exc.category == "unknown_keys" else exc.category
            return self._fallback(state, pool, meta, kind, base_fields, notes={"failure": exc.category})

        node_ids = {i: snap.ids[i] for i in pool}
        selected, fallback_kind, partial = self._select(answer, key_to_node, node_ids, meta, max_nodes)
        if fallback_kind:
            return self._fallback(state, pool, meta, fallback_kind, base_fields, notes={})
        aliases: dict[str, list[str]] = {}
        for c in owners:
            row = snap.knowledge.row(c.owner_key) if snap.knowledge.owner_keys else -1
            if row >= 0:
                aliases[c.owner_key] = list(snap.knowledge.aliases[row])
        owner_keys: list[str] = []
        if isinstance(answer.active_owner_keys, list):
            for value in answer.active_owner_keys:
                key = _resolve_owner(value, owners, aliases)
                if key and key not in owner_keys:
                    owner_keys.append(key)
                if len(owner_keys) >= MAX_OWNER_KEYS:
                    break
        given: dict[str, tuple[float, str]] = {}
        for entry in answer.active_owner_scores:
            key = _resolve_owner(entry.owner_key, owners, aliases)
            if key and key not in given:
                given[key] = (round(float(entry.score), 3), entry.reason)
        by_key = {c.owner_key: c for c in owners}
        meta["activeOwnerKeys"] = owner_keys
        meta["activeOwnerScores"] = [
            {
                "ownerKey": k,
                "score": given[k][0] if k in given else round(min(1.0, by_key[k].score), 3),
                "reason": given[k][1] if k in given else "",
            }
            for k in owner_keys
        ]
        meta["status"] = "llm"
        reason = answer.reason.strip() or "LLM 精排完成"
        if partial:
            reason += f"（忽略了 {partial} 个无效候选）"
        meta["reason"] = reason
        meta["selectedSeedCount"] = len(selected)
        new_state = state.evolve(selection=tuple(selected), llm=meta)
        notes = {"protocol": meta["selectionProtocol"], "ignored": partial, "owner_keys": owner_keys}
        return new_state, {**base_fields, "count_in": len(pool), "count_out": len(selected), "notes": notes}

    def _select(
        self,
        answer: RerankAnswer,
        key_to_node: dict[str, int],
        ids_by_node: dict[int, str],
        meta: dict[str, Any],
        max_nodes: int,
    ) -> tuple[list[int], str, int]:
        """``(selected node indices, fallback type or "", number of ignored entries)`` (§3.15 "Parsing")."""
        cap = 4 * max_nodes
        raw = answer.raw
        node_to_key = {i: k for k, i in key_to_node.items()}
        if "selected_keys" in raw:
            meta["selectionProtocol"] = "candidate-keys-v1"
            value = raw["selected_keys"]
            if not isinstance(value, list):
                return [], "invalid-candidate", 0
            cleaned = _clean_list(value, cap)
            meta["rawSelectedKeys"] = cleaned
            if not cleaned:
                return [], "empty-selection", 0
            normalised = list(dict.fromkeys(_normalise_key(k) for k in cleaned))
            valid = [k for k in normalised if k in key_to_node][:max_nodes]
            selected = list(dict.fromkeys(key_to_node[k] for k in valid))[:max_nodes]
            partial = len([k for k in normalised if k not in key_to_node])
        elif "selected_ids" in raw:
            meta["selectionProtocol"] = "legacy-selected-ids"
            meta["legacySelectionUsed"] = True
            value = raw["selected_ids"]
            if not isinstance(value, list):
                return [], "invalid-candidate", 0
            cleaned = _clean_list(value, cap)
            meta["rawSelectedKeys"] = cleaned
            if not cleaned:
                return [], "empty-selection", 0
            node_of_id = {nid: i for i, nid in ids_by_node.items()}
            selected = list(dict.fromkeys(node_of_id[x] for x in cleaned if x in node_of_id))[:max_nodes]
            partial = len([x for x in cleaned if x not in node_of_id])
        else:
            return [], "invalid-candidate", 0
        if not selected:
            return [], "invalid-candidate", partial
        meta["resolvedSelectedKeys"] = [node_to_key[i] for i in selected]
        meta["resolvedSelectedNodeIds"] = [ids_by_node[i] for i in selected]
        return selected, "", partial

    def _fallback(
        self,
        state: RecallState,
        pool: list[int],
        meta: dict[str, Any],
        kind: str,
        base_fields: dict[str, Any],
        *,
        notes: dict[str, Any],
    ) -> tuple[RecallState, dict[str, Any]]:
        selected = pool[: int(self.selection.max_recall_nodes)]
        reason = FALLBACK_REASONS.get(kind, _GENERIC_FALLBACK)
        meta.update(
            status="fallback",
            reason=reason,
            fallbackType=kind,
            fallbackReason=reason,
            activeOwnerKeys=[],
            activeOwnerScores=[],
            resolvedSelectedKeys=[],
            resolvedSelectedNodeIds=[],
            selectedSeedCount=len(selected),
        )
        new_state = state.evolve(selection=tuple(selected), llm=meta)
        return new_state, {
            **base_fields, "count_in": len(pool), "count_out": len(selected),
            "notes": {"fallback_type": kind, **notes},
        }
