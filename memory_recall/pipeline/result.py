"""The result of one recall: :class:`RecallResult`, built from the last pipeline state (reference §3.19–§3.21).

:func:`build_result` reads the final :class:`~memory_recall.pipeline.state.RecallState` and the settings and
produces a pydantic model the HTTP service returns as is and the injector renders. :func:`json_dumps` gives
byte-identical JSON for identical inputs.

Contents
    * ``selected_node_ids`` — §3.19 final cap: ``unique(selection)[:max_recall_nodes]``.
    * ``selected`` — one :class:`SelectedMemory` per selected node: rank, origin (``llm`` / ``score`` /
      ``owner-pov`` / ``scene-reconstruction`` / ``probabilistic``), weighted score and its
      :class:`ExplanationModel`, whose parts add up to the score. A node with a scored row is explained by
      :func:`~memory_recall.pipeline.scoring.explain_row` (graph, vector, lexical and importance parts after every
      multiplier); a node added after ranking that the score map never held has score 0 and the single part
      ``added_by`` (value 0, weight 0, contribution 0) with the reason in its notes.
    * ``core_node_ids`` — §3.20: non-archived always-inject nodes (event, rule, thread, synopsis; synopsis only
      when there is no active summary entry), in recall order.
    * ``recall_node_ids`` / ``grouped_recall_node_ids`` — selected nodes that are not core nodes, in recall order,
      grouped ``state`` (character, location), ``episodic`` (event, thread), ``reflective`` (reflection,
      synopsis), ``rule``, ``other``.
    * ``summary_entries`` — active summary entries (§1.8), ``nodes`` — every referenced node as JSON.
    * ``scope_buckets`` — what the injector prints (§3.20), from selected + core nodes (selected first),
      classified with the **final** owners: ``characterPov`` (only nodes of a final owner; none when the owners
      are unresolved; ``characterPovByOwner``, ``characterPovOwnerOrder``, ``characterPovOwnerLabels``),
      ``userPov`` (when ``inject_user_pov_memory``), ``objectiveCurrentRegion``, ``objectiveGlobal``
      (adjacent + global, capped at ``objective_global_cap``; empty when ``inject_objective_global_memory`` is
      off); other POV dropped. Every list is in recall order.
    * ``omitted`` — nodes left out by a cap, with the reason (``core-cap``, ``objective-global-cap``,
      ``objective-global-disabled``), at most :data:`OMITTED_LIST_CAP` per reason in fill order; the counts are
      ``stats["coreOmittedCount"]`` and ``stats["objectiveGlobalOmittedCount"]``.
    * ``stats`` (§3.20 keys), ``meta.retrieval`` (every §3.21 key the stages wrote, ``skipReasons``, ``llm``,
      ``timings``), ``meta.scopeContext`` (§3.20), ``retrieval_status`` / ``semantic_search_used`` /
      ``failure_category`` (recall-spec departure 3), ``traces`` (one dict per stage) and ``timings`` (ms).
Recall order (§3.20)
    Temporal-bucket priority desc (computed without the cue mode) when the story timeline is on and an active
    segment exists, then recency (``seqRange[1]``) desc, importance desc, node id.
Departures (recall-spec)
    * 2 — core nodes go through the same verdict as everything else (:func:`~memory_recall.pipeline._admission.
      admissible` without the range requirement): hidden, gate-suppressed or temporally suppressed core nodes
      are not injected (§7 items 2, 3, 9). The knowledge gate is **not** recomputed for the scope buckets:
      every node here passed the scoring verdict (the reference recomputed it without scores and silently
      dropped rescued nodes, §7 item 3).
    * 5 — core nodes are capped at ``InjectorSettings.core_cap``, selected ones first, then by weighted score,
      then recency; the objective-global cap is filled the same way (selected first in selection order, then
      by score, then recency) instead of by recency alone (§7 item 15). Omitted nodes are reported.
    * ``json_dumps`` leaves timings and cache-hit notes out by default (``timings=True`` keeps them): they are
      the only parts of a result that differ between identical runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from memory_recall.model.graph import CORE_TYPES
from memory_recall.pipeline._admission import admissible, rows_of, with_owners
from memory_recall.pipeline._graph_cache import cached, cached_stats
from memory_recall.pipeline.owners import owner_base_key, resolve_pov_owner, scene_context
from memory_recall.pipeline.scoring import (
    TEMPORAL_PRIORITY,
    explain_row,
    node_label,
    scope_buckets,
    temporal_director,
)
from memory_recall.pipeline.state import ContextInfo, Explanation, ExplanationPart, RecallState, StageTrace
from memory_recall.settings import RecallSettings
from memory_recall.store.snapshot import TYPE_CODE, GraphSnapshot, StructureChange, inserted

__all__ = [
    "ExplanationModel",
    "ExplanationPartModel",
    "OmittedNode",
    "RecallResult",
    "ScopeBucketsModel",
    "SelectedMemory",
    "build_result",
    "is_plain_json",
    "json_dumps",
    "plain",
]

#: Meta keys that are internal arrays, never part of the result.
PRIVATE_META_KEYS = frozenset({"visibility_hidden_mask"})
#: Trace note keys that depend on the process, not on the inputs: per-snapshot cache hits (``adjacencyCached``
#: of diffusion / cross recall, ``indexCached`` of co-occurrence). :func:`json_dumps` drops them with the timings.
RUN_DEPENDENT_NOTE = re.compile(r"[cC]ached$")
#: At most this many omitted ids are listed per reason (a long chat has thousands of core events); the full
#: counts are in ``stats`` (``coreOmittedCount``, ``objectiveGlobalOmittedCount``).
OMITTED_LIST_CAP = 50

RECALL_GROUPS: dict[str, tuple[str, ...]] = {
    "state": ("character", "location"),
    "episodic": ("event", "thread"),
    "reflective": ("reflection", "synopsis"),
    "rule": ("rule",),
}
_GROUP_OF = {t: group for group, types in RECALL_GROUPS.items() for t in types}


class ExplanationPartModel(BaseModel):
    """One additive part of a score: ``contribution = value × weight``."""

    model_config = ConfigDict(frozen=True)

    name: str
    value: float
    weight: float
    contribution: float


class ExplanationModel(BaseModel):
    """Why a node was selected: parts whose contributions sum to ``score``, and the multipliers folded in."""

    model_config = ConfigDict(frozen=True)

    node_id: str
    score: float
    score_kind: str
    parts: list[ExplanationPartModel]
    multipliers: dict[str, float] = Field(default_factory=dict)
    notes: dict[str, Any] = Field(default_factory=dict)

    def total(self) -> float:
        return float(sum(p.contribution for p in self.parts))


class SelectedMemory(BaseModel):
    """One selected memory, in final order (``rank`` is 1-based)."""

    model_config = ConfigDict(frozen=True)

    rank: int
    node_id: str
    type: str
    label: str
    origin: str
    score: float
    explanation: ExplanationModel


class OmittedNode(BaseModel):
    """A node a cap left out of the result, and which cap."""

    model_config = ConfigDict(frozen=True)

    node_id: str
    reason: str


class ScopeBucketsModel(BaseModel):
    """The scoped sections the injector prints (reference §3.20). Field names are the reference's keys, so the
    injector port reads the same names as ST-BME's ``formatInjection``."""

    model_config = ConfigDict(frozen=True)

    characterPov: list[str] = Field(default_factory=list)
    characterPovByOwner: dict[str, list[str]] = Field(default_factory=dict)
    characterPovOwnerOrder: list[str] = Field(default_factory=list)
    characterPovOwnerLabels: dict[str, str] = Field(default_factory=dict)
    userPov: list[str] = Field(default_factory=list)
    objectiveCurrentRegion: list[str] = Field(default_factory=list)
    objectiveGlobal: list[str] = Field(default_factory=list)


class RecallResult(BaseModel):
    """Everything one recall returns (see the module docstring).

    Read-only, like the pipeline state it is built from: to avoid copying thousands of small containers per
    recall, ``nodes`` shares its node dumps with a per-snapshot cache and ``meta["retrieval"]`` shares the lists
    and dicts the stages wrote in ``state.meta``. Stages write their meta as plain JSON data (lists, dicts with
    ``str`` keys, ``str``/``int``/``bool``/``None``, finite floats: :func:`is_plain_json`); a top-level value of
    any other type is converted by :func:`plain`, and :func:`json_dumps` converts every field with :func:`plain`,
    so its text never depends on it."""

    model_config = ConfigDict(frozen=True)

    chat_id: str
    graph_version: int
    user_message: str
    user_floor: int | None = None
    selected_node_ids: list[str]
    selected: list[SelectedMemory]
    core_node_ids: list[str]
    recall_node_ids: list[str]
    grouped_recall_node_ids: dict[str, list[str]]
    summary_entries: list[dict[str, Any]]
    scope_buckets: ScopeBucketsModel
    nodes: dict[str, dict[str, Any]]
    omitted: list[OmittedNode]
    stats: dict[str, int]
    final_owner_keys: list[str]
    final_owner_scores: list[float]
    final_owner_mode: str
    reinforced_node_ids: list[str]
    probabilistic_node_ids: list[str]
    retrieval_status: str
    semantic_search_used: bool
    failure_category: str
    llm_status: str
    meta: dict[str, Any]
    traces: list[dict[str, Any]]
    timings: dict[str, float]


# --- JSON helpers -----------------------------------------------------------------------------------------------


K = TypeVar("K")
V = TypeVar("V")

_SCALARS = (str, int, bool, type(None))
_isfinite = math.isfinite


def plain(value: Any) -> Any:
    """``value`` as plain JSON data: numpy scalars/arrays, tuples, sets (sorted), dataclasses and pydantic models
    converted; non-finite floats become ``None``."""
    # Exact-type fast paths first: the result holds thousands of ids, numbers and small dicts.
    cls = type(value)
    if cls in _SCALARS:
        return value
    if cls is float:
        return value if math.isfinite(value) else None
    if cls is dict:
        # Lists of scalars (the per-node id and owner lists of the meta, hundreds per recall) are copied inline.
        return {
            k if type(k) is str else str(k): v if type(v) in _SCALARS or (type(v) is float and _isfinite(v))
            else [x if type(x) in _SCALARS or (type(x) is float and _isfinite(x)) else plain(x) for x in v]
            if type(v) is list else plain(v)
            for k, v in value.items()
        }
    if cls is list or cls is tuple:
        return [v if type(v) in _SCALARS or (type(v) is float and _isfinite(v)) else plain(v) for v in value]
    if isinstance(value, BaseModel):
        return plain(value.model_dump(mode="json"))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return plain(value.item())
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return [plain(v) for v in sorted(value, key=str)]
    if isinstance(value, Iterable):
        return [plain(v) for v in value]
    return str(value)


def is_plain_json(value: Any) -> bool:
    """Is ``value`` plain JSON data already, i.e. ``plain(value) == value`` with the same types: ``dict`` with
    ``str`` keys, ``list``, ``str``, ``int``, ``bool``, ``None`` and finite ``float``, at every depth?"""
    cls = type(value)
    if cls is dict:
        return all(type(k) is str and is_plain_json(v) for k, v in value.items())
    if cls is list:
        return all(is_plain_json(v) for v in value)
    return cls in _SCALARS or (cls is float and _isfinite(value))


def _shared(value: Any) -> Any:
    """``value`` itself when it is a JSON scalar or a ``list`` / ``dict`` (whose contents are trusted to be plain
    JSON, see :class:`RecallResult`), else ``plain(value)``: no copy of what the stages already built as JSON."""
    cls = type(value)
    if cls is dict or cls is list or cls in _SCALARS or (cls is float and _isfinite(value)):
        return value
    return plain(value)


def json_dumps(result: RecallResult, *, timings: bool = False) -> str:
    """Canonical JSON of ``result``: sorted keys, compact separators, UTF-8 text, floats as their shortest
    round-trip ``repr``. Byte-identical for identical inputs; ``timings=False`` (default) zeroes the elapsed
    times (``timings``, ``meta.retrieval.timings``, each trace's ``elapsed_ms``) and drops the cache-hit notes
    (:data:`RUN_DEPENDENT_NOTE`): the only parts that differ between two runs of the same recall in one process."""
    # Field by field: ``plain`` of what the result holds, so the text never depends on whether a shared meta
    # or trace value was plain already (see RecallResult); the same data as ``plain(result.model_dump())``.
    data = {name: plain(getattr(result, name)) for name in RecallResult.model_fields}
    if not timings:
        data["timings"] = {k: 0.0 for k in data.get("timings", {})}
        retrieval = data.get("meta", {}).get("retrieval", {})
        if isinstance(retrieval.get("timings"), dict):
            retrieval["timings"] = {k: 0.0 for k in retrieval["timings"]}
        for trace in data.get("traces", []):
            trace["elapsed_ms"] = 0.0
            notes = trace.get("notes")
            if isinstance(notes, dict):
                trace["notes"] = {k: v for k, v in notes.items() if not RUN_DEPENDENT_NOTE.search(k)}
    return json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


# --- building ---------------------------------------------------------------------------------------------------


_TRACE_FIELDS = tuple(f.name for f in dataclasses.fields(StageTrace))


def _trace_dicts(traces: Iterable[StageTrace]) -> list[dict[str, Any]]:
    """``[plain(t.to_dict()) for t in traces]`` without the deep copy of ``to_dict``. Converted, not shared: the
    controller hands the traces to the service's response, which must serialise whatever a stage noted."""
    return [plain({name: getattr(t, name) for name in _TRACE_FIELDS}) for t in traces]


# Selected memories are validated from plain data: the validator builds the models in one pass (one constructor
# call per model costs several times more); omitted nodes are kept per snapshot (_omitted). Every other field of
# RecallResult is built here with its exact type, so the result itself is assembled without validation (which
# would only copy the node dumps, the meta and the traces once more).
_SELECTED = TypeAdapter(list[SelectedMemory])
#: Node dumps (and omitted-node models) kept per snapshot (a long chat's core nodes are the same few dozen on every
#: turn); cleared when full, so at most this many (~1.5 KB per dump) per snapshot, whatever the graph size.
MAX_NODE_DUMPS = 4096


def _explanation_data(expl: Explanation) -> dict[str, Any]:
    """The fields of the :class:`ExplanationModel` of ``expl``."""
    return {
        "node_id": expl.node_id,
        "score": float(expl.score),
        "score_kind": expl.score_kind,
        "parts": [
            {"name": p.name, "value": p.value, "weight": p.weight, "contribution": p.contribution} for p in expl.parts
        ],
        "multipliers": {k: float(v) for k, v in expl.multipliers.items()},
        "notes": plain(expl.notes),
    }


@dataclasses.dataclass
class _Kept:
    """What the builder keeps per snapshot structure, in one graph-cache entry (the cache holds few entries per
    snapshot): omitted-node models (:func:`_omitted`: node id and reason), temporal priorities per story time
    (:func:`_temporal_priority`). The node dumps read the statistics overlay and are kept per snapshot
    (:func:`_dumps_memo`)."""

    omitted: dict[tuple[int, str], OmittedNode] = dataclasses.field(default_factory=dict)
    priority: dict[ContextInfo, np.ndarray] = dataclasses.field(default_factory=dict)


def _kept(snap: GraphSnapshot) -> _Kept:
    return cached(snap, ("result-kept",), _Kept, _updated_kept, recipe=_kept)[0]


def _kept_rows(change: StructureChange) -> bool:
    """Did the delta delete nothing? Then ``remap`` is the identity: the kept rows did not move and the new nodes
    come after them (``appended == n_old``), so a per-node memo carries over as one dict copy (C)."""
    return change.appended == change.n_old


def _remapped(old: dict[K, V], change: StructureChange, position: Callable[[K], int], moved: Callable[[K, int], K],
              *, rewritten: bool) -> dict[K, V]:
    """The entries of the per-node memo ``old`` of the parent structure at the new positions of their nodes after
    a delta that deleted nodes, without the deleted nodes' entries (and, unless ``rewritten``, the rewritten
    ones'). O(entries) Python: a memo holds at most :data:`MAX_NODE_DUMPS`."""
    items = list(old.items())  # a snapshot of the dict: a recall on the parent may still be adding entries
    if not items:
        return {}
    new = change.remap[np.fromiter((position(k) for k, _ in items), dtype=np.int64, count=len(items))]
    if not rewritten and change.rewritten.size:
        new[np.isin(new, change.rewritten)] = -1
    return {moved(k, j): v for j, (k, v) in zip(new.tolist(), items, strict=True) if j >= 0}


def _updated_kept(old: _Kept, change: StructureChange) -> _Kept:
    """The parent structure's :class:`_Kept` at the new positions after a delta: omitted-node models of the nodes
    the delta kept, and their temporal priorities when the chat state (the timeline) was not written (one O(n)
    numpy copy per story time, at most :data:`MAX_STORY_TIMES`). Nothing deleted: one dict copy (C)."""
    # A model holds only its node's id and the reason: a row rewritten in place keeps both (checked on use too).
    omitted = dict(old.omitted) if _kept_rows(change) else _remapped(
        old.omitted, change, lambda key: key[0], lambda key, j: (j, key[1]), rewritten=True)
    out = _Kept(omitted=omitted)
    if not change.state_changed:
        for story, table in list(old.priority.items()):
            fresh = np.full(change.n_new, _UNKNOWN_PRIORITY, dtype=np.int8)
            if _kept_rows(change):
                fresh[: change.n_old] = table
                fresh[change.rewritten] = _UNKNOWN_PRIORITY
            else:
                src, dst = change.carried()
                fresh[dst] = table[src]
            out.priority[story] = fresh
    return out


#: A node's dump and label, with the reinforcement statistics they were read with (:func:`_dump_table`).
_DumpEntry = tuple[tuple[int, float, int] | None, dict[str, Any], str]


def _dumps_memo(snap: GraphSnapshot) -> dict[int, tuple[dict[str, Any], str]]:
    """Node dumps and labels (:func:`_node_entry`) per snapshot object: a dump holds ``importance``,
    ``access_count`` and ``last_access_time``, which a reinforcement write changes."""
    return cached_stats(snap, ("result-node-dumps",), dict, recipe=_dumps_memo)[0]


def _dump_table(snap: GraphSnapshot) -> dict[int, _DumpEntry]:
    """Node dumps and labels per snapshot structure (:func:`_node_entry`), each with the node's reinforcement
    statistics (``snap.stats.reinforced.get(i)``) it was read with. A node's dump depends only on its JSON (the
    structure's) and those statistics (:meth:`GraphSnapshot.node`), so an entry serves every snapshot of the
    structure: as it is where the overlay holds the same statistics for the node, else as a copy with the overlay's
    three values (:func:`_node_entry`; re-dumped only when the overlay holds none and the entry does). The entries
    of the rows a delta left unchanged serve the child structure (:func:`_updated_dumps`): the first recall after
    a write dumps only the new and changed nodes it lists."""
    return cached(snap, ("result-node-dumps", "structure"), _no_dumps, _updated_dumps, recipe=_dump_table)[0]


def _no_dumps() -> dict[int, _DumpEntry]:
    return {}


def _updated_dumps(old: dict[int, _DumpEntry], change: StructureChange) -> dict[int, _DumpEntry]:
    """The parent structure's dump entries of the nodes the delta left unchanged, at their new positions (the
    overlay carries those rows' reinforcement statistics; each entry is checked against them on use). Nothing
    deleted: one dict copy and a set intersection (C) with the rewritten rows."""
    if not _kept_rows(change):
        return _remapped(old, change, int, lambda _key, j: j, rewritten=False)
    out = dict(old)  # one C copy: a recall on the parent may still be adding entries
    if change.rewritten.size:
        for i in set(change.rewritten.tolist()).intersection(out):
            del out[i]
    return out


def _omitted(snap: GraphSnapshot, nodes: Iterable[int], reason: str) -> list[OmittedNode]:
    """The :class:`OmittedNode` of each node of ``nodes``. The models are immutable and depend only on the node
    and the reason, so they are kept per snapshot (a long chat omits the same older core nodes on every turn)."""
    models = _kept(snap).omitted
    out = []
    for i in nodes:
        model = models.get((i, reason))
        if model is None or model.node_id != snap.ids[i]:  # (a model carried over a delta: its node's id)
            if len(models) >= MAX_NODE_DUMPS:
                models.clear()
            model = models[(i, reason)] = OmittedNode(node_id=snap.ids[i], reason=reason)
        out.append(model)
    return out


def added_by_explanation(node_id: str, origin: str) -> Explanation:
    """Explanation of a node added after ranking that has no scored row: score 0, one zero part."""
    return Explanation(
        node_id=node_id,
        score=0.0,
        score_kind="weighted_score",
        parts=(ExplanationPart("added_by", 0.0, 0.0, 0.0),),
        multipliers={},
        notes={"added_by": origin, "note": "not in the score map: added after ranking, so it has no score"},
    )


def _owners_ran(traces: Sequence[StageTrace]) -> bool:
    return any(t.name == "owners" and not t.skipped for t in traces)


def _node_entry(snap: GraphSnapshot, i: int) -> tuple[dict[str, Any], str]:
    """``(node.model_dump(mode="json"), node_label(node))`` of node ``i``, from a per-snapshot cache filled from
    the structure's (:func:`_dump_table`): both depend only on the (immutable) snapshot. The dumps are shared by
    every result of the snapshot, and of the later snapshots whose node is the same (read-only)."""
    entries = _dumps_memo(snap)
    entry = entries.get(i)
    if entry is not None:
        return entry
    if len(entries) >= MAX_NODE_DUMPS:
        entries.clear()
    table = _dump_table(snap)
    stat = snap.stats.reinforced.get(i)
    held = table.get(i)
    if held is None or (stat is None and held[0] is not None):
        node = snap.node(i)
        if len(table) >= MAX_NODE_DUMPS:
            table.clear()
        held = table[i] = (stat, node.model_dump(mode="json"), node_label(node))
    dump = held[1]
    if held[0] != stat:
        # Only the reinforcement statistics differ (the node's JSON is the structure's): the held dump with this
        # overlay's values, in the same key order, instead of a new parse and dump. The structure's entry stays,
        # so a node recalled again and again is not dumped anew for every recall (those dumps, replaced in a
        # long-lived table after each reinforcement, were most of the table's churn).
        assert stat is not None
        dump = dict(dump)
        dump["access_count"], dump["importance"], dump["last_access_time"] = stat
    entry = entries[i] = (dump, held[2])
    return entry


def _node_dumps(snap: GraphSnapshot, idx: Iterable[int]) -> dict[str, dict[str, Any]]:
    """``{id: node.model_dump(mode="json")}`` of the nodes ``idx``, in order (shared, see :func:`_node_entry`)."""
    return {snap.ids[i]: _node_entry(snap, i)[0] for i in idx}


#: Story times (active segments) whose temporal priorities are kept per snapshot (n bytes each).
MAX_STORY_TIMES = 4
_UNKNOWN_PRIORITY = -128


def _temporal_priority(snap: GraphSnapshot, story: ContextInfo, idx: np.ndarray) -> np.ndarray:
    """§3.20 temporal-bucket priority of each node of ``idx`` (float64): the director's bucket with cue mode
    ``none`` in the scene's story time ``story`` (a context holding only the story-time fields, so the verdict
    depends on nothing else). The director is element-wise, so each node's priority is computed once per
    snapshot and story time and kept (int8 per node, at most :data:`MAX_STORY_TIMES` story times)."""
    tables = _kept(snap).priority
    table = tables.get(story)
    if table is None:
        if len(tables) >= MAX_STORY_TIMES:
            tables.clear()
        table = tables[story] = np.full(snap.n, _UNKNOWN_PRIORITY, dtype=np.int8)
    priority = table[idx]
    todo = priority == _UNKNOWN_PRIORITY
    if todo.any():
        missing = idx[todo]
        tr = temporal_director(snap, missing, story, enabled=True)
        priority[todo] = [TEMPORAL_PRIORITY.get(str(b), 0) for b in tr.bucket]
        table[missing] = priority[todo]
    return priority.astype(np.float64)


@dataclasses.dataclass(frozen=True)
class _CoreOrder:
    """:func:`_core_order` of one snapshot of a structure, with the importance (overlay) it was ordered by."""

    importance: np.ndarray
    order: np.ndarray
    synopsis: np.ndarray


#: At most this many nodes are placed into a carried core order (:func:`_derived_core_order`); more: sort anew.
MAX_CORE_REPLACED = 256


def _core_order(snap: GraphSnapshot) -> tuple[np.ndarray, np.ndarray]:
    """Per snapshot (cached): the non-archived always-inject nodes ordered by recency desc, importance desc, node
    id — the cap order of nodes that are neither selected nor scored — and which of them are synopses.

    Ordered by importance, so kept per overlay; derived (:func:`_derived_core_order`) from the order the structure
    holds for its first snapshot (itself derived from the parent structure's after a delta), not sorted anew."""

    def build() -> tuple[np.ndarray, np.ndarray]:
        base = _structure_core_order(snap)
        if base.importance is snap.importance:
            return base.order, base.synopsis
        derived = _derived_core_order(snap, base, None)  # another overlay of the structure (reinforcement)
        value = derived if derived is not None else _sorted_core_order(snap)
        return value.order, value.synopsis

    return cached_stats(snap, ("result-core-order",), build, recipe=_core_order)[0]


def _structure_core_order(snap: GraphSnapshot) -> _CoreOrder:
    """The core order the structure of ``snap`` holds (for its first snapshot's overlay)."""
    return cached(snap, ("result-core-order", "structure"), lambda: _sorted_core_order(snap),
                  lambda old, change: _derived_core_order(snap, old, change), recipe=_structure_core_order)[0]


def _sorted_core_order(snap: GraphSnapshot) -> _CoreOrder:
    """:func:`_core_order` of ``snap`` built: one sort of the core nodes."""
    idx = np.flatnonzero(snap.core_mask)
    order = idx[np.lexsort((snap.id_rank[idx], -snap.importance[idx], -snap.recency(idx)))]
    return _CoreOrder(snap.importance, order, snap.type_code[order] == TYPE_CODE["synopsis"])


def _derived_core_order(snap: GraphSnapshot, base: _CoreOrder, change: StructureChange | None) -> _CoreOrder | None:
    """:func:`_core_order` of ``snap`` from ``base``, the order of a snapshot of the parent structure (``change``:
    how the delta made ``snap``'s structure from it) or of another overlay of ``snap``'s structure (``None``).

    The nodes whose row the delta left unchanged and whose importance is the same keep their relative order (their
    keys are the same; node-id ranks shift with new ids but keep their order), so only the others — new, rewritten
    and re-weighted nodes — are placed, by binary search on the keys of the kept order: O(core nodes) numpy and
    O(placed · log) Python. ``None`` (sort anew) when more nodes are placed than that is worth (at most
    :data:`MAX_CORE_REPLACED`) or a key is NaN (its place in a sort is not the comparisons')."""
    order, old_importance = base.order, base.importance[base.order]
    if change is not None:
        new = change.remap[order]
        if change.rewritten.size and new.size:
            new[np.isin(new, change.rewritten)] = -1
        stays = new >= 0
        order, old_importance = new[stays], old_importance[stays]
        placed = [change.rewritten, np.arange(change.appended, change.n_new, dtype=np.int64)]
    else:
        placed = []
    importance = snap.importance
    same = importance[order] == old_importance
    placed.append(order[~same])
    order = order[same]
    todo = np.concatenate(placed) if placed else np.zeros(0, dtype=np.int64)
    if todo.size:
        todo = todo[np.isin(snap.type_code[todo], [TYPE_CODE[t] for t in sorted(CORE_TYPES) if t in TYPE_CODE])
                    & ~snap.archived[todo]]
    # Each placed node costs a few binary searches (~10 µs): beyond a small share of the order, one sort is cheaper.
    if todo.size > min(MAX_CORE_REPLACED, max(16, order.size // 64)):
        return None
    if todo.size:
        primary, secondary = -snap.recency(order), -importance[order]
        todo_primary, todo_secondary, todo_rank = -snap.recency(todo), -importance[todo], snap.id_rank[todo]
        if any(np.isnan(a).any() for a in (primary, secondary, todo_primary, todo_secondary)):
            return None
        by_key = np.lexsort((todo_rank, todo_secondary, todo_primary))
        rank = snap.id_rank[order]
        at = []
        for p, q, r in zip(todo_primary[by_key].tolist(), todo_secondary[by_key].tolist(), todo_rank[by_key].tolist(),
                           strict=True):
            # Its place in the kept order: the run of its first key, within it the run of its second, then its rank.
            lo, hi = int(np.searchsorted(primary, p, "left")), int(np.searchsorted(primary, p, "right"))
            lo, hi = lo + int(np.searchsorted(secondary[lo:hi], q, "left")), lo + int(
                np.searchsorted(secondary[lo:hi], q, "right"))
            at.append(lo + int(np.searchsorted(rank[lo:hi], r, "left")))
        order = inserted(order, np.asarray(at, dtype=np.int64), todo[by_key])
    return _CoreOrder(importance, order, snap.type_code[order] == TYPE_CODE["synopsis"])


class _Builder:
    def __init__(self, state: RecallState, settings: RecallSettings) -> None:
        self.state = state
        self.settings = settings
        self.snap = state.snapshot
        ctx = state.context
        if _owners_ran(state.traces) or "ownerPovAugmented" in state.meta:
            self.owner_keys = tuple(state.final_owner_keys)
            self.owner_scores = tuple(float(s) for s in state.final_owner_scores)
            self.owner_mode = state.final_owner_mode
        else:
            self.owner_keys = tuple(ctx.owner_keys)
            self.owner_scores = tuple(float(s) for s in ctx.owner_scores)
            self.owner_mode = ctx.owner_mode
        self.owner_ctx = with_owners(ctx, self.owner_keys, self.owner_mode)
        self.omitted_counts: dict[str, int] = {}
        # Recall order uses the temporal bucket (without the cue mode) when a story segment is active.
        self._timeline = bool(settings.context.enable_story_timeline and ctx.story_segment_id)
        # The scene's story time alone (cue mode none): all the recall order's temporal priority reads.
        self._story = ContextInfo(
            story_segment_id=ctx.story_segment_id, story_segment_label=ctx.story_segment_label,
            story_segment_order=ctx.story_segment_order, story_source=ctx.story_source,
        )
        self._position: dict[int, int] = {}  # node → place in the recall order (see rank)

    # -- ordering ---------------------------------------------------------------------------------------------

    def recency(self, idx: np.ndarray) -> np.ndarray:
        return self.snap.recency(idx)

    def temporal_priority(self, idx: np.ndarray) -> np.ndarray:
        """§3.20 temporal-bucket priority (cue mode ``none``) of each node of ``idx``: :func:`_temporal_priority`
        with the story time of the scene."""
        return _temporal_priority(self.snap, self._story, idx)

    def rank(self, idx: Iterable[int]) -> None:
        """Place the nodes of ``idx`` (with those already placed) in one §3.20 recall order, so that
        :meth:`recall_order` of any subset is a plain sort by position (the order is total: it ends with the node
        id). One call for every node the result lists: the selected and the kept core nodes."""
        nodes = list(dict.fromkeys([*self._position, *idx]))
        arr = np.array(nodes, dtype=np.int64)
        snap = self.snap
        keys = [snap.id_rank[arr], -snap.importance[arr], -self.recency(arr)]
        if self._timeline and arr.size:
            keys.append(-self.temporal_priority(arr))
        order = np.lexsort(tuple(keys)).tolist() if arr.size else []
        self._position = {nodes[k]: pos for pos, k in enumerate(order)}

    def recall_order(self, idx: Sequence[int]) -> list[int]:
        """§3.20 recall order of ``idx``."""
        position = self._position
        if any(i not in position for i in idx):
            self.rank(idx)
            position = self._position
        return sorted(idx, key=position.__getitem__)

    def cap_order(self, idx: Sequence[int] | np.ndarray, selected: Sequence[int]) -> list[int]:
        """Fill order of a cap (departure 5): selected nodes in selection order, then by weighted score, then
        recency, importance, node id."""
        arr = np.asarray(idx, dtype=np.int64)
        if arr.size == 0:
            return []
        snap = self.snap
        # Position in the selection (first occurrence), after every selected node for the others: a dict read per
        # candidate costs less than a vectorised lookup's sort and search on these few hundred nodes.
        first = {i: p for p, i in enumerate(dict.fromkeys(selected))}
        unselected = len(first)
        sel_pos = np.array([first.get(i, unselected) for i in arr.tolist()], dtype=np.int64)
        rows = rows_of(self.state, arr)
        score = np.where(rows >= 0, self.state.scored.weighted_score[np.maximum(rows, 0)], -np.inf) \
            if len(self.state.scored) else np.full(arr.size, -np.inf)
        order = np.lexsort((snap.id_rank[arr], -snap.importance[arr], -self.recency(arr), -score, sel_pos))
        return arr[order].tolist()

    # -- parts ------------------------------------------------------------------------------------------------

    def selected(self) -> list[int]:
        limit = int(self.settings.selection.max_recall_nodes)
        snap = self.snap
        out = [i for i in dict.fromkeys(int(i) for i in self.state.selection) if not snap.archived[i]]
        return out[:limit]

    def core(self, selected: list[int], omitted: list[OmittedNode]) -> list[int]:
        """Admissible core nodes in cap order, capped; the rest counted and (the first ones) listed as omitted.

        Only the first ``cap + OMITTED_LIST_CAP`` of the cap order are ever used. Unselected, unscored core nodes
        all share the first two cap keys, which rank them after every selected or scored one, so their order is
        the snapshot's static core order (:func:`_core_order`) and only its first ``cap + OMITTED_LIST_CAP``
        admissible ones can reach that prefix: only the selected and scored core nodes are sorted."""
        snap = self.snap
        order, synopsis = _core_order(snap)
        if snap.summaries.active_entries():
            order = order[~synopsis]
        if order.size == 0:
            return []
        # A node visible only by a rescue is never always-injected (departure 4): unless it was selected on its
        # evidence, it stays out of the core rows (and so of the fallback layout, which prints them).
        allowed = admissible(self.state, order, context=self.settings.context, scoring=self.settings.scoring,
                             require_active=False, owner_context=scene_context(self.state.context), rescued=False)
        back = ~allowed & np.isin(order, np.asarray(selected, dtype=np.int64)) if selected else None
        if back is not None and back.any():  # selected rescued nodes keep their row: judge just those again
            allowed[back] = admissible(self.state, order[back], context=self.settings.context,
                                       scoring=self.settings.scoring, require_active=False,
                                       owner_context=scene_context(self.state.context))
        order = order[allowed]
        cap = int(self.settings.injector.core_cap)
        keep = cap + OMITTED_LIST_CAP
        # Selected or scored: a node mask gathers faster than a search over the ~2,000 core nodes of a long chat.
        chosen = np.zeros(snap.n, dtype=bool)
        chosen[self.state.scored.index] = True
        chosen[np.asarray(selected, dtype=np.int64)] = True
        special = chosen[order]
        if np.isfinite(self.state.scored.weighted_score).all():
            # The others all sort after them (no selection position, no score), in the static order.
            ranked = [*self.cap_order(order[special], selected), *order[~special][:keep].tolist()][:keep]
        else:  # a non-finite score sorts among the unscored nodes: sort them together
            ranked = self.cap_order(np.concatenate([order[special], order[~special][:keep]]), selected)[:keep]
        self.omitted_counts["core-cap"] = max(0, int(order.size) - cap)
        omitted.extend(_omitted(snap, ranked[cap:cap + OMITTED_LIST_CAP], "core-cap"))
        self.rank([*selected, *ranked[:cap]])
        return self.recall_order(ranked[:cap])

    def scope(self, selected: list[int], core: list[int], omitted: list[OmittedNode]) -> ScopeBucketsModel:
        snap = self.snap
        inj = self.settings.injector
        members = list(dict.fromkeys([*selected, *core]))
        if not members:
            return ScopeBucketsModel()
        buckets = scope_buckets(snap, np.array(members, dtype=np.int64), self.owner_ctx,
                                settings=self.settings.context).tolist()
        final_bases = {owner_base_key(k): k for k in self.owner_keys}
        char: list[int] = []
        by_owner: dict[str, list[int]] = {}
        first_seen: list[str] = []
        user: list[int] = []
        current: list[int] = []
        pooled: list[int] = []
        for i, bucket in zip(members, buckets, strict=True):
            if bucket == "characterPov":
                if self.owner_mode == "unresolved":
                    continue
                node_key = resolve_pov_owner(snap, i)[0]
                key = final_bases.get(owner_base_key(node_key)) if node_key else None
                if self.owner_keys and key is None:
                    continue
                key = key or node_key
                char.append(i)
                by_owner.setdefault(key, []).append(i)
                if key not in first_seen:
                    first_seen.append(key)
            elif bucket == "userPov":
                if inj.inject_user_pov_memory:
                    user.append(i)
            elif bucket == "objectiveCurrentRegion":
                current.append(i)
            elif bucket in ("objectiveAdjacentRegion", "objectiveGlobal"):
                pooled.append(i)
        if inj.inject_objective_global_memory:
            ranked = self.cap_order(pooled, selected)
            cap = int(inj.objective_global_cap)
            self.omitted_counts["objective-global-cap"] = max(0, len(ranked) - cap)
            omitted.extend(_omitted(snap, ranked[cap:cap + OMITTED_LIST_CAP], "objective-global-cap"))
            global_nodes = ranked[:cap]
        else:
            self.omitted_counts["objective-global-disabled"] = len(pooled)
            omitted.extend(_omitted(snap, self.cap_order(pooled, selected)[:OMITTED_LIST_CAP],
                                    "objective-global-disabled"))
            global_nodes = []
        order = [k for k in self.owner_keys if k in by_owner] + [k for k in first_seen if k not in self.owner_keys]
        names = {c.get("ownerKey"): c.get("ownerName") for c in self.state.meta.get("sceneOwnerCandidates") or ()
                 if isinstance(c, dict)}
        labels = {}
        for key in order:
            first = by_owner[key][0]
            labels[key] = names.get(key) or snap.scope_owner_name[first] or key or "未命名角色"

        def out(idx: list[int]) -> list[str]:
            return [snap.ids[i] for i in self.recall_order(idx)]

        return ScopeBucketsModel(
            characterPov=out(char),
            characterPovByOwner={k: out(by_owner[k]) for k in order},
            characterPovOwnerOrder=order,
            characterPovOwnerLabels=labels,
            userPov=out(user),
            objectiveCurrentRegion=out(current),
            objectiveGlobal=out(global_nodes),
        )

    def explanations(self, selected: list[int]) -> list[dict[str, Any]]:
        """The fields of the :class:`SelectedMemory` of each selected node."""
        snap = self.snap
        rows = rows_of(self.state, np.array(selected, dtype=np.int64))
        origins = self.state.meta.get("selectionOrigins") or {}
        default_origin = "llm" if (self.state.llm or {}).get("status") == "llm" else "score"
        rescue_reasons = self.state.meta.get("knowledgeRescueReasons") or {}
        out = []
        for rank, (i, r) in enumerate(zip(selected, rows.tolist(), strict=True), start=1):
            nid = snap.ids[i]
            origin = str(origins.get(nid, default_origin))
            if r >= 0:
                expl = explain_row(snap, self.state.scored, r, self.settings.scoring, self.settings.lexical)
            else:
                expl = added_by_explanation(nid, origin)
            data = _explanation_data(expl)
            if nid in rescue_reasons:  # departure 4: a rescued node's explanation says so, and why
                data["notes"] = {**data.get("notes", {}), "rescue": str(rescue_reasons[nid])}
            out.append({
                "rank": rank, "node_id": nid, "type": snap.type_of(i), "label": _node_entry(snap, i)[1],
                "origin": origin, "score": float(expl.score), "explanation": data,
            })
        return out

    def scope_context(self) -> dict[str, Any]:
        s = self.settings
        meta = self.state.meta
        ctx = self.state.context
        names = [
            (next((c.get("ownerName") for c in meta.get("sceneOwnerCandidates") or ()
                   if isinstance(c, dict) and c.get("ownerKey") == k), None)
             or k.split(":", 1)[-1].split("#", 1)[0])
            for k in self.owner_keys if k.startswith("character:")
        ]
        # The two meta values are shared like the rest of the meta (see RecallResult); the rest is built here.
        out = plain({
            "flags": {
                "enableScopedMemory": s.context.enable_scoped_memory,
                "enablePovMemory": s.context.enable_pov_memory,
                "enableRegionScopedObjective": s.context.enable_region_scoped_objective,
                "enableCognitiveMemory": s.context.enable_cognitive_memory,
                "enableSpatialAdjacency": s.context.enable_spatial_adjacency,
                "enableStoryTimeline": s.context.enable_story_timeline,
                "storyTimeSoftDirecting": s.context.story_time_soft_directing,
                "injectUserPovMemory": s.injector.inject_user_pov_memory,
                "injectObjectiveGlobalMemory": s.injector.inject_objective_global_memory,
            },
            "activeRegion": ctx.active_region,
            "activeRegionSource": ctx.active_region_source,
            "activeStorySegmentId": ctx.story_segment_id,
            "activeStoryTimeLabel": ctx.story_segment_label,
            "activeStoryTimeSource": ctx.story_source,
            "injectStoryTimeLabel": s.injector.inject_story_time_label,
            "activeCharacterPovOwner": ctx.active_character_pov_owner,
            "activeCharacterPovOwners": names,
            "activeUserPovOwner": ctx.active_user_pov_owner,
            "activeRecallOwnerKey": self.owner_keys[0] if self.owner_keys else "",
            "activeRecallOwnerKeys": list(self.owner_keys),
            "activeRecallOwnerScores": dict(zip(self.owner_keys, self.owner_scores, strict=False)),
            "sceneOwnerResolutionMode": self.owner_mode,
            "sceneOwnerCandidates": None,  # set below (keeps the key order)
            "adjacentRegions": list(ctx.adjacent_regions),
            "injectLowConfidenceObjectiveMemory": s.scoring.inject_low_confidence_objective_memory,
            "graph": {"chatId": self.snap.chat_id, "version": self.snap.version, "nodeCount": self.snap.n},
            "bucketWeights": None,
        })
        out["sceneOwnerCandidates"] = _shared(meta.get("sceneOwnerCandidates", []))
        out["bucketWeights"] = _shared(meta.get("bucketWeights", {}))
        return out


def build_result(
    state: RecallState, settings: RecallSettings, *, timings: Mapping[str, float] | None = None
) -> RecallResult:
    """The :class:`RecallResult` of the final pipeline state (see the module docstring)."""
    b = _Builder(state, settings)
    snap = state.snapshot
    omitted: list[OmittedNode] = []
    selected = b.selected()
    core = b.core(selected, omitted)
    core_set = set(core)
    recall = b.recall_order([i for i in selected if i not in core_set])
    grouped: dict[str, list[str]] = {name: [] for name in (*RECALL_GROUPS, "other")}
    for i in recall:
        grouped[_GROUP_OF.get(snap.type_of(i), "other")].append(snap.ids[i])
    scope = b.scope(selected, core, omitted)
    summaries = [e.model_dump(mode="json") for e in snap.summaries.active_entries()]
    nodes = _node_dumps(snap, dict.fromkeys([*selected, *core]))
    total_active = state.meta.get("activeNodeCount")
    if total_active is None:
        total_active = int(state.active.sum()) if state.active.shape == (snap.n,) else 0
    stats = {
        "totalActive": int(total_active),
        "summaryCount": len(summaries),
        "coreCount": len(core),
        "recallCount": len(recall),
        "characterPovCount": len(scope.characterPov),
        "userPovCount": len(scope.userPov),
        "objectiveCurrentRegionCount": len(scope.objectiveCurrentRegion),
        "objectiveGlobalCount": len(scope.objectiveGlobal),
        "episodicCount": len(grouped["episodic"]),
        "stateCount": len(grouped["state"]),
        "reflectiveCount": len(grouped["reflective"]),
        "ruleCount": len(grouped["rule"]),
        "coreOmittedCount": b.omitted_counts.get("core-cap", 0),
        "objectiveGlobalOmittedCount": b.omitted_counts.get("objective-global-cap", 0)
        + b.omitted_counts.get("objective-global-disabled", 0),
    }
    timing_map = {k: round(float(v), 1) for k, v in (timings or {}).items()}
    retrieval = {
        k: v for k, v in state.meta.items() if k not in PRIVATE_META_KEYS and not isinstance(v, np.ndarray)
    }
    retrieval["skipReasons"] = list(state.skip_reasons)
    retrieval["llm"] = dict(state.llm)
    retrieval["timings"] = dict(timing_map)
    # The stages build their meta per recall as JSON lists and dicts (thousands of ids and owner lists at 10k
    # nodes): shared, not copied (see RecallResult).
    retrieval = {k if type(k) is str else str(k): _shared(v) for k, v in retrieval.items()}
    vs = state.vector_status
    selected_set = set(selected)
    user_floor = state.query.user_floor
    # Assembled without validation (see _SELECTED): every value below already has its field's type.
    return RecallResult.model_construct(
        chat_id=snap.chat_id,
        graph_version=int(snap.version),
        user_message=state.query.user_message,
        user_floor=None if user_floor is None else int(user_floor),
        selected_node_ids=[snap.ids[i] for i in selected],
        selected=_SELECTED.validate_python(b.explanations(selected)),
        core_node_ids=[snap.ids[i] for i in core],
        recall_node_ids=[snap.ids[i] for i in recall],
        grouped_recall_node_ids=grouped,
        summary_entries=summaries,
        scope_buckets=scope,
        nodes=nodes,
        omitted=omitted,
        stats=stats,
        final_owner_keys=list(b.owner_keys),
        final_owner_scores=list(b.owner_scores),
        final_owner_mode=b.owner_mode,
        reinforced_node_ids=[snap.ids[i] for i in state.reinforced if i in selected_set],
        probabilistic_node_ids=[snap.ids[i] for i in state.probabilistic if i in selected_set],
        retrieval_status=vs.retrieval_status,
        semantic_search_used=bool(vs.semantic_search_used),
        failure_category=vs.failure_category,
        llm_status=str((state.llm or {}).get("status", "")),
        meta={"retrieval": retrieval, "scopeContext": b.scope_context()},
        traces=_trace_dicts(state.traces),
        timings=timing_map,
    )
