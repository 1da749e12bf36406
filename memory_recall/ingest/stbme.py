"""ST-BME graph export ⇄ :class:`~memory_recall.model.MemoryGraph` (stbme-reference §1).

Usage::

    graph = import_stbme(Path("graph.json"), now_ms=1_767_225_600_000)
    report = import_stbme_report(raw_json_text, now_ms=now)   # graph + what was skipped or repaired
    data = export_stbme(graph)                                  # camelCase dict, GRAPH_VERSION 9

**Input.** A dict, JSON text (``str``/``bytes``, UTF-8 with or without BOM) or a ``Path`` to a JSON file
holding the reference's graph object (``nodes``, ``edges``, ``historyState``, ``knowledgeState``,
``regionState``, ``timelineState``, ``summaryState``, ``batchJournal``, ``lastProcessedSeq``, …). A wrapper
object holding the graph under a key (``{"graph": {...}}``, ``{"data": {...}}``, …, also as a JSON string,
up to three levels deep) is detected: the graph is the one object below it that has a ``nodes`` key.

**Import rules** (reference normalisation; recall-spec departure 10 for ids):

* Node ids are kept (a number becomes its decimal string). A node, edge or summary entry without an id gets
  ``imp:<16 hex of sha1(canonical JSON of the raw object minus id and embedding)>``; the n-th identical copy
  hashes with a ``#n`` suffix. Never random: importing the same file twice gives the same ids.
* ``importance`` is clamped to [0, 10] (not a finite number → 5); edge ``strength`` to [0, 1] (→ 0.8).
* ``seqRange`` missing → ``[seq, seq]``; present but not two finite numbers (``null``, ``NaN``, strings) →
  ``seq_range=None`` (never a recall candidate, as in the reference); a reversed range is swapped.
* Missing time stamps become ``now_ms`` (unreadable ones too, with a warning); ISO-8601 strings are read.
  Edge ``validAt`` / ``invalidAt`` / ``expiredAt`` stay ``None`` when missing.
* **Embeddings in the export are dropped**: vectors are re-embedded by the project's own embedder, whose
  model and dimension generally differ from the reference's. The export writes ``embedding: null``.
* Unknown keys of nodes, edges and ``timelineState.segments`` entries (ST-BME writes ``confidence``,
  ``matcherKey``, ``source``, ``updatedAt`` there) go to ``extra`` and are written back by :func:`export_stbme`;
  so do unknown keys inside a node's ``scope``/``storyTime``/``storyTimeSpan`` and an edge's ``scope`` (kept in
  ``extra`` under that object's key, merged back into it on export); out-of-vocabulary values of
  ``tense``, ``relation``, ``confidence``, ``source``, ``kind`` and ``status`` fall back to the defaults.
* Scope normalisation (layer, owner, region tokens) is done by :class:`~memory_recall.model.MemoryScope`.
* Node types are validated against the project's schema: an unknown type raises :class:`InputError` naming
  ``nodes[i].type``; so does any other node or edge value the model rejects (``nodes[i].<camelCaseKey>``).
* Duplicate node ids raise :class:`InputError`. Edges with a missing endpoint, self-loops and duplicate edge
  ids are skipped with a warning. Knowledge ids of missing nodes are pruned with a warning (the reference's
  normalisation prunes them too); each owner id list is capped at 512 ids by the model.
* ``historyState`` keeps the fields recall reads; ``lastProcessedSeq`` fills ``lastProcessedAssistantFloor``
  when that is missing. ``lastRecallResult``, ``vectorIndexState`` and ``maintenanceJournal`` are not
  imported (recall records and vectors live in the project's store).

:func:`import_stbme` raises :class:`InputError` for structurally broken input (not JSON, no graph object,
``nodes`` not a list, a node that is not an object, invalid node data); :func:`import_stbme_report` also
returns the warnings. ``import_stbme(export_stbme(g)) == g`` for every graph ``g`` this module imported (and
for any graph whose knowledge ids exist and whose ``extra`` dicts use no export key), and a second export is
identical to the first.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from memory_recall.errors import InputError
from memory_recall.model.graph import (
    Edge,
    MemoryScope,
    Node,
    StoryTime,
    StoryTimeSpan,
)
from memory_recall.model.state import (
    HistoryState,
    JournalEntry,
    KnowledgeOwner,
    KnowledgeState,
    MemoryGraph,
    RegionAdjacency,
    RegionState,
    StorySegment,
    SummaryEntry,
    SummaryState,
    TimelineState,
)

__all__ = [
    "GRAPH_VERSION",
    "ImportReport",
    "export_stbme",
    "import_stbme",
    "import_stbme_report",
]

#: Graph format version of the reference (stbme-reference §1.1).
GRAPH_VERSION = 9

_MAX_MILLIS = 253_402_300_799_999
_WRAPPER_KEYS = (
    "graph", "data", "memoryGraph", "stBmeGraph", "st_bme_graph", "bmeGraph", "payload", "export",
)
_WRAPPER_DEPTH = 3
_TENSES = ("past", "ongoing", "future", "flashback", "hypothetical", "unknown")
_RELATIONS = ("same", "after", "before", "parallel", "unknown")
_CONFIDENCES = ("high", "medium", "low")
_SOURCES = ("extract", "derived", "manual")
_SUMMARY_KINDS = ("small", "rollup", "legacy-import")
_SUMMARY_STATUSES = ("active", "folded")

#: Nested objects of a node whose unknown keys are kept (in ``Node.extra`` under the same key).
_NESTED_KEYS = ("scope", "storyTime", "storyTimeSpan")

#: The keys of a ``timelineState.segments`` entry the model maps (any other key is kept in ``StorySegment.extra``).
_SEGMENT_KEYS = frozenset(
    ("id", "label", "normalizedKey", "order", "aliases", "parentId", "relationToParent", "anchorLabel")
)

# camelCase export key → model field, for the keys a node maps explicitly (everything else goes to ``extra``).
_NODE_KEYS: dict[str, str] = {
    "id": "id",
    "type": "type",
    "level": "level",
    "parentId": "parent_id",
    "childIds": "child_ids",
    "seq": "seq",
    "seqRange": "seq_range",
    "archived": "archived",
    "fields": "fields",
    "importance": "importance",
    "accessCount": "access_count",
    "lastAccessTime": "last_access_time",
    "createdTime": "created_time",
    "updatedAt": "updated_at",
    "prevId": "prev_id",
    "nextId": "next_id",
    "scope": "scope",
    "storyTime": "story_time",
    "storyTimeSpan": "story_time_span",
    "evidence": "evidence",
}
_NODE_DROPPED = frozenset({"embedding"})
# ``clusters`` is unused by recall: kept in ``extra`` only when non-empty, exported as ``[]`` otherwise.
_CLUSTERS = "clusters"
_EDGE_KEYS: dict[str, str] = {
    "id": "id",
    "fromId": "from_id",
    "toId": "to_id",
    "relation": "relation",
    "strength": "strength",
    "edgeType": "edge_type",
    "validAt": "valid_at",
    "invalidAt": "invalid_at",
    "expiredAt": "expired_at",
    "createdTime": "created_time",
    "updatedAt": "updated_at",
    "scope": "scope",
}
_SCOPE_KEYS: dict[str, str] = {
    "layer": "layer",
    "ownerType": "owner_type",
    "ownerId": "owner_id",
    "ownerName": "owner_name",
    "regionPrimary": "region_primary",
    "regionPath": "region_path",
    "regionSecondary": "region_secondary",
}
_HISTORY_KEYS: dict[str, str] = {
    "activeRegion": "active_region",
    "lastExtractedRegion": "last_extracted_region",
    "activeRegionSource": "active_region_source",
    "activeCharacterPovOwner": "active_character_pov_owner",
    "activeUserPovOwner": "active_user_pov_owner",
    "activeStorySegmentId": "active_story_segment_id",
    "activeStoryTimeLabel": "active_story_time_label",
    "activeStoryTimeSource": "active_story_time_source",
    "lastExtractedStorySegmentId": "last_extracted_story_segment_id",
}
_SNAKE_TO_CAMEL: dict[str, str] = {v: k for k, v in {**_NODE_KEYS, **_EDGE_KEYS}.items()}


@dataclass(frozen=True)
class ImportReport:
    """Result of :func:`import_stbme_report`: the graph plus one message per skipped or repaired item."""

    graph: MemoryGraph
    warnings: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------------------------


def import_stbme(data: dict[str, Any] | str | bytes | Path, *, now_ms: int) -> MemoryGraph:
    """Import an ST-BME graph export (see the module docstring for the rules); warnings are discarded.

    Raises :class:`InputError` for structurally broken input and for node data the model rejects.
    """
    return import_stbme_report(data, now_ms=now_ms).graph


def import_stbme_report(data: dict[str, Any] | str | bytes | Path, *, now_ms: int) -> ImportReport:
    """Import an ST-BME graph export and report what was skipped or repaired.

    ``now_ms`` (ms since the epoch) replaces missing time stamps. Raises :class:`InputError` like
    :func:`import_stbme`; everything recoverable (dangling edges, pruned knowledge ids, unreadable time
    stamps, dropped nested keys) becomes a warning instead.
    """
    if isinstance(now_ms, bool) or not isinstance(now_ms, int) or not 0 <= now_ms <= _MAX_MILLIS:
        raise InputError("now_ms", f"must be an int in the range [0, {_MAX_MILLIS}]. Got {now_ms!r} instead.")
    raw = _find_graph(_load(data), "graph", 0)
    return _Importer(now_ms).run(raw)


def export_stbme(graph: MemoryGraph) -> dict[str, Any]:
    """Export ``graph`` as the reference's graph object (GRAPH_VERSION 9, camelCase, ``embedding: null``).

    ``lastRecallResult`` is ``null`` (recall records are kept apart), ``maintenanceJournal`` is empty and
    ``vectorIndexState`` is marked dirty so a reference install rebuilds vectors. ``lastProcessedSeq`` is
    ``historyState.lastProcessedAssistantFloor``. The result is a fresh JSON-serialisable dict (no aliasing
    of the graph's data) that imports back to an equal graph.
    """
    last_floor = graph.history.last_processed_assistant_floor
    return {
        "version": GRAPH_VERSION,
        "nodes": [_export_node(n) for n in graph.nodes],
        "edges": [_export_edge(e) for e in graph.edges],
        "historyState": _export_history(graph.history),
        "knowledgeState": {"owners": {k: _export_owner(o) for k, o in graph.knowledge.owners.items()}},
        "regionState": {
            "adjacencyMap": {
                name: {
                    "adjacent": list(entry.adjacent),
                    "aliases": list(entry.aliases),
                    "source": entry.source,
                    "updatedAt": entry.updated_at,
                }
                for name, entry in graph.regions.adjacency_map.items()
            },
            "manualActiveRegion": graph.regions.manual_active_region,
            "recentRegions": list(graph.regions.recent_regions),
        },
        "timelineState": {
            "segments": [
                {
                    "id": s.id,
                    "label": s.label,
                    "normalizedKey": s.normalized_key,
                    "order": s.order,
                    "aliases": list(s.aliases),
                    "parentId": s.parent_id,
                    "relationToParent": s.relation_to_parent,
                    "anchorLabel": s.anchor_label,
                    **{k: copy.deepcopy(v) for k, v in s.extra.items() if k not in _SEGMENT_KEYS},
                }
                for s in graph.timeline.segments
            ],
            "nextOrder": graph.timeline.next_order,
            "manualActiveSegmentId": graph.timeline.manual_active_segment_id,
            "lastExtractedSegmentId": graph.timeline.last_extracted_segment_id,
            "recentSegmentIds": list(graph.timeline.recent_segment_ids),
        },
        "summaryState": {
            "entries": [
                {
                    "id": e.id,
                    "level": e.level,
                    "kind": e.kind,
                    "status": e.status,
                    "text": e.text,
                    "messageRange": list(e.message_range) if e.message_range is not None else None,
                    "storyTimeSpan": _export_span(e.story_time_span),
                    "createdAt": e.created_at,
                }
                for e in graph.summaries.entries
            ],
            "activeEntryIds": list(graph.summaries.active_entry_ids),
        },
        "batchJournal": [{"processedRange": list(j.processed_range)} for j in graph.batch_journal],
        "lastProcessedSeq": last_floor,
        "lastRecallResult": None,
        "vectorIndexState": {"dirty": True},
        "maintenanceJournal": [],
    }


# ------------------------------------------------------------------------------------------------------------
# Loading and wrapper detection
# ------------------------------------------------------------------------------------------------------------


def _load(data: Any) -> Any:
    if isinstance(data, Mapping):
        return data
    if isinstance(data, Path):
        try:
            data = data.read_bytes()
        except OSError as exc:
            raise InputError("path", f"cannot read {str(data)!r}: {exc.strerror or exc}") from None
    if isinstance(data, bytes | bytearray):
        try:
            data = bytes(data).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise InputError("data", f"is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    if isinstance(data, str):
        return _parse_json(data, "data")
    raise InputError("data", f"must be a dict, JSON text or a Path, got {type(data).__name__}")


def _parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text.lstrip("\ufeff"))
    except json.JSONDecodeError as exc:
        reason = f"is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        raise InputError(where, reason) from None
    except RecursionError:
        raise InputError(where, "is nested too deeply") from None


def _find_graph(obj: Any, where: str, depth: int) -> dict[str, Any]:
    """The object holding ``nodes``: ``obj`` itself, or a wrapped graph found under one key (depth ≤ 3)."""
    if not isinstance(obj, Mapping):
        raise InputError(where, f"must be a JSON object, got {_json_type(obj)}")
    if "nodes" in obj:
        return dict(obj)
    if depth < _WRAPPER_DEPTH:
        keys = [k for k in _WRAPPER_KEYS if k in obj] + sorted(k for k in obj if k not in _WRAPPER_KEYS)
        found: list[tuple[str, dict[str, Any]]] = []
        for key in keys:
            value = obj[key]
            if isinstance(value, str) and value.lstrip().startswith("{"):
                try:
                    value = json.loads(value)
                except (json.JSONDecodeError, RecursionError):
                    continue
            if isinstance(value, Mapping):
                try:
                    found.append((key, _find_graph(value, f"{where}.{key}", depth + 1)))
                except InputError:
                    continue
        if len(found) == 1:
            return found[0][1]
        if len(found) > 1:
            names = ", ".join(repr(k) for k, _ in found)
            raise InputError(where, f"holds several graph objects (under {names}); pass one of them")
    raise InputError(where, "has no 'nodes' list (not an ST-BME graph export, nor a wrapper holding one)")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


# ------------------------------------------------------------------------------------------------------------
# Value coercion
# ------------------------------------------------------------------------------------------------------------


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return ""


def _opt_id(value: Any) -> str | None:
    if isinstance(value, str):
        return value if value.strip() else None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _str_list(value: Any) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple):
        return []
    out: list[str] = []
    for item in value:
        s = _opt_id(item)
        if s is not None and s not in out:
            out.append(s)
    return out


def _truthy(value: Any) -> bool:
    """JS truthiness of a JSON value."""
    if isinstance(value, float) and math.isnan(value):
        return False
    return value not in (None, False, 0, "")


def _choice(value: Any, allowed: tuple[str, ...], default: str) -> str:
    return value if isinstance(value, str) and value in allowed else default


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


# ------------------------------------------------------------------------------------------------------------
# The importer
# ------------------------------------------------------------------------------------------------------------


class _Importer:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms
        self.warnings: list[str] = []
        self._derived: dict[str, int] = {}

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    # -- helpers ---------------------------------------------------------------------------------------------

    def millis(self, value: Any, where: str) -> int:
        """A time stamp in ms; missing → ``now_ms``; unreadable → ``now_ms`` with a warning."""
        if value is None:
            return self.now_ms
        parsed = self._parse_millis(value)
        if parsed is None:
            self.warn(f"{where}: unreadable time stamp {value!r} replaced by now")
            return self.now_ms
        return parsed

    def opt_millis(self, value: Any, where: str) -> int | None:
        if value is None or value == "":
            return None
        parsed = self._parse_millis(value)
        if parsed is None:
            self.warn(f"{where}: unreadable time stamp {value!r} dropped")
        return parsed

    @staticmethod
    def _parse_millis(value: Any) -> int | None:
        f = _finite(value)
        if f is None and isinstance(value, str) and value.strip():
            s = value.strip()
            try:
                f = float(s)
            except ValueError:
                try:
                    dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
                except ValueError:
                    return None
                if dt.tzinfo is None:
                    dt = dt.replace(tzinfo=UTC)
                f = dt.timestamp() * 1000
            if not math.isfinite(f):
                return None
        if f is None or not 0 <= f <= _MAX_MILLIS:
            return None
        return int(f)

    def derive_id(self, raw: Mapping[str, Any]) -> str:
        content = _canonical({k: v for k, v in raw.items() if k not in ("id", "embedding")})
        n = self._derived.get(content, 0)
        self._derived[content] = n + 1
        salt = content if n == 0 else f"{content}#{n}"
        return "imp:" + hashlib.sha1(salt.encode("utf-8")).hexdigest()[:16]

    def sub_object(
        self, value: Any, keys: Mapping[str, str] | tuple[str, ...], where: str,
        keep: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Known keys of a nested object (camelCase → model name); unknown keys are copied into ``keep`` when it
        is given (written back on export), else dropped with a warning."""
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.warn(f"{where}: expected an object, got {_json_type(value)}; ignored")
            return {}
        mapping = keys if isinstance(keys, Mapping) else {k: k for k in keys}
        out: dict[str, Any] = {}
        unknown = sorted(str(k) for k in value if k not in mapping)
        if unknown and keep is not None:
            keep.update(copy.deepcopy({k: v for k, v in value.items() if k not in mapping}))
        elif unknown:
            self.warn(f"{where}: unknown keys {', '.join(unknown)} dropped")
        for key, target in mapping.items():
            if key in value:
                out[target] = value[key]
        return out

    def scope(self, value: Any, where: str, keep: dict[str, Any] | None = None) -> MemoryScope:
        d = self.sub_object(value, _SCOPE_KEYS, where, keep)
        for key in ("owner_id", "owner_name", "owner_type", "layer"):
            if key in d:
                d[key] = _text(d[key])
        return MemoryScope.model_validate(d)

    def story_time(self, value: Any, where: str, keep: dict[str, Any] | None = None) -> StoryTime:
        d = self.sub_object(
            value,
            {"segmentId": "segment_id", "label": "label", "tense": "tense", "relation": "relation",
             "anchorLabel": "anchor_label", "confidence": "confidence", "source": "source"},
            where,
            keep,
        )
        return StoryTime(
            segment_id=_text(d.get("segment_id")),
            label=_text(d.get("label")),
            tense=_choice(d.get("tense"), _TENSES, "unknown"),  # type: ignore[arg-type]
            relation=_choice(d.get("relation"), _RELATIONS, "unknown"),  # type: ignore[arg-type]
            anchor_label=_text(d.get("anchor_label")),
            confidence=_choice(d.get("confidence"), _CONFIDENCES, "medium"),  # type: ignore[arg-type]
            source=_choice(d.get("source"), _SOURCES, "derived"),  # type: ignore[arg-type]
        )

    def story_span(self, value: Any, where: str, keep: dict[str, Any] | None = None) -> StoryTimeSpan:
        d = self.sub_object(
            value,
            {"startSegmentId": "start_segment_id", "endSegmentId": "end_segment_id",
             "startLabel": "start_label", "endLabel": "end_label", "mixed": "mixed", "source": "source"},
            where,
            keep,
        )
        return StoryTimeSpan(
            start_segment_id=_text(d.get("start_segment_id")),
            end_segment_id=_text(d.get("end_segment_id")),
            start_label=_text(d.get("start_label")),
            end_label=_text(d.get("end_label")),
            mixed=_truthy(d.get("mixed")),
            source=_choice(d.get("source"), _SOURCES, "derived"),  # type: ignore[arg-type]
        )

    @staticmethod
    def int_range(value: Any) -> tuple[int, int] | None:
        """Two finite numbers → ``(lo, hi)`` floored and ordered; anything else → ``None``."""
        if not isinstance(value, list | tuple) or len(value) < 2:
            return None
        a, b = _finite(value[0]), _finite(value[1])
        if a is None or b is None:
            return None
        lo, hi = math.floor(a), math.floor(b)
        return (lo, hi) if lo <= hi else (hi, lo)

    # -- graph -----------------------------------------------------------------------------------------------

    def run(self, raw: dict[str, Any]) -> ImportReport:
        version = _finite(raw.get("version"))
        if version is not None and version > GRAPH_VERSION:
            self.warn(f"version: {raw.get('version')} is newer than {GRAPH_VERSION}; unknown data is lost")
        raw_nodes = raw.get("nodes")
        if not isinstance(raw_nodes, list):
            raise InputError("nodes", f"must be an array, got {_json_type(raw_nodes)}")
        raw_edges = raw.get("edges", [])
        if raw_edges is None:
            raw_edges = []
        if not isinstance(raw_edges, list):
            raise InputError("edges", f"must be an array, got {_json_type(raw_edges)}")

        nodes: list[Node] = []
        node_ids: set[str] = set()
        for i, item in enumerate(raw_nodes):
            node = self.node(item, i)
            if node.id in node_ids:
                raise InputError(f"nodes[{i}].id", f"{node.id!r} is duplicated")
            node_ids.add(node.id)
            nodes.append(node)
        for i, node in enumerate(nodes):
            for name, ref in (("prevId", node.prev_id), ("nextId", node.next_id)):
                if ref is not None and ref not in node_ids:
                    self.warn(f"nodes[{i}].{name}: points at missing node {ref!r} (kept; recall ignores it)")

        edges: list[Edge] = []
        edge_ids: set[str] = set()
        for i, item in enumerate(raw_edges):
            edge = self.edge(item, i, node_ids)
            if edge is None:
                continue
            if edge.id in edge_ids:
                self.warn(f"edges[{i}]: duplicate edge id {edge.id!r} skipped")
                continue
            edge_ids.add(edge.id)
            edges.append(edge)

        history = self.history(raw.get("historyState"), raw.get("lastProcessedSeq"))
        graph = MemoryGraph(
            nodes=tuple(nodes),
            edges=tuple(edges),
            knowledge=self.knowledge(raw.get("knowledgeState"), node_ids),
            regions=self.regions(raw.get("regionState")),
            timeline=self.timeline(raw.get("timelineState")),
            summaries=self.summaries(raw.get("summaryState")),
            history=history,
            batch_journal=self.journal(raw.get("batchJournal")),
        )
        return ImportReport(graph=graph, warnings=list(self.warnings))

    # -- nodes and edges -------------------------------------------------------------------------------------

    def node(self, item: Any, i: int) -> Node:
        where = f"nodes[{i}]"
        if not isinstance(item, Mapping):
            raise InputError(where, f"must be an object, got {_json_type(item)}")
        node_id = _opt_id(item.get("id"))
        if node_id is None:
            if item.get("id") not in (None, ""):
                raise InputError(f"{where}.id", f"must be a string, got {_json_type(item.get('id'))}")
            node_id = self.derive_id(item)
        fields = item.get("fields")
        if fields is None:
            fields = {}
        if not isinstance(fields, Mapping):
            raise InputError(f"{where}.fields", f"must be an object, got {_json_type(fields)}")

        seq_value = item.get("seq")
        seq_f = _finite(seq_value)
        if seq_f is None and seq_value is not None:
            self.warn(f"{where}.seq: {seq_value!r} is not a number; 0 used")
        seq = math.floor(seq_f) if seq_f is not None else 0
        importance = _finite(item.get("importance"))
        if importance is None and item.get("importance") is not None:
            self.warn(f"{where}.importance: {item.get('importance')!r} is not a finite number; 5 used")
        level = _finite(item.get("level"))
        access = _finite(item.get("accessCount"))
        created = self.millis(item.get("createdTime"), f"{where}.createdTime")
        # Unknown keys inside the nested objects: kept in ``extra`` under the object's own key (an export key, so
        # never written out as a key of its own) and merged back into the object on export.
        nested: dict[str, dict[str, Any]] = {key: {} for key in _NESTED_KEYS}

        data: dict[str, Any] = {
            "id": node_id,
            "type": _text(item.get("type")),
            "fields": copy.deepcopy(dict(fields)),
            "seq": seq,
            "archived": _truthy(item.get("archived")),
            "importance": 5.0 if importance is None else min(10.0, max(0.0, importance)),
            "access_count": max(0, math.floor(access)) if access is not None else 0,
            "last_access_time": self.millis(item.get("lastAccessTime"), f"{where}.lastAccessTime"),
            "created_time": created,
            "updated_at": self.millis(item.get("updatedAt"), f"{where}.updatedAt"),
            "level": max(0, math.floor(level)) if level is not None else 0,
            "parent_id": _opt_id(item.get("parentId")),
            "child_ids": tuple(_str_list(item.get("childIds"))),
            "prev_id": _opt_id(item.get("prevId")),
            "next_id": _opt_id(item.get("nextId")),
            "scope": self.scope(item.get("scope"), f"{where}.scope", nested["scope"]),
            "story_time": self.story_time(item.get("storyTime"), f"{where}.storyTime", nested["storyTime"]),
            "story_time_span": self.story_span(item.get("storyTimeSpan"), f"{where}.storyTimeSpan",
                                               nested["storyTimeSpan"]),
            "evidence": tuple(_str_list(item.get("evidence"))),
            "extra": copy.deepcopy(
                {
                    k: v
                    for k, v in item.items()
                    if k not in _NODE_KEYS and k not in _NODE_DROPPED and not (k == _CLUSTERS and not v)
                }
            ),
        }
        data["extra"].update({key: kept for key, kept in nested.items() if kept})
        if "seqRange" in item:
            data["seq_range"] = self.int_range(item["seqRange"])
        return _validated(Node.model_validate, data, where)

    def edge(self, item: Any, i: int, node_ids: set[str]) -> Edge | None:
        where = f"edges[{i}]"
        if not isinstance(item, Mapping):
            raise InputError(where, f"must be an object, got {_json_type(item)}")
        from_id, to_id = _opt_id(item.get("fromId")), _opt_id(item.get("toId"))
        if from_id is None or to_id is None:
            self.warn(f"{where}: missing fromId/toId; skipped")
            return None
        missing = [end for end in (from_id, to_id) if end not in node_ids]
        if missing:
            self.warn(f"{where}: points at missing node {missing[0]!r}; skipped")
            return None
        if from_id == to_id:
            self.warn(f"{where}: fromId equals toId ({from_id!r}); skipped")
            return None
        edge_id = _opt_id(item.get("id")) or self.derive_id(item)
        relation = _text(item.get("relation")).strip() or "related"
        if len(relation) > 64:
            self.warn(f"{where}.relation: longer than 64 characters; cut")
            relation = relation[:64]
        strength = _finite(item.get("strength"))
        if strength is None and item.get("strength") is not None:
            self.warn(f"{where}.strength: {item.get('strength')!r} is not a finite number; 0.8 used")
        edge_type_f = _finite(item.get("edgeType"))
        edge_type = 0
        if edge_type_f is not None and edge_type_f == math.floor(edge_type_f) and 0 <= edge_type_f <= 255:
            edge_type = int(edge_type_f)
        elif item.get("edgeType") is not None:
            self.warn(f"{where}.edgeType: {item.get('edgeType')!r} is not an int in [0, 255]; 0 used")
        edge_scope: dict[str, Any] = {}  # unknown scope keys, kept like a node's (_NESTED_KEYS)
        data: dict[str, Any] = {
            "id": edge_id,
            "from_id": from_id,
            "to_id": to_id,
            "relation": relation,
            "strength": 0.8 if strength is None else min(1.0, max(0.0, strength)),
            "edge_type": edge_type,
            "valid_at": self.opt_millis(item.get("validAt"), f"{where}.validAt"),
            "invalid_at": self.opt_millis(item.get("invalidAt"), f"{where}.invalidAt"),
            "expired_at": self.opt_millis(item.get("expiredAt"), f"{where}.expiredAt"),
            "created_time": self.millis(item.get("createdTime"), f"{where}.createdTime"),
            "updated_at": self.millis(item.get("updatedAt"), f"{where}.updatedAt"),
            "scope": self.scope(item.get("scope"), f"{where}.scope", edge_scope),
            "extra": copy.deepcopy({k: v for k, v in item.items() if k not in _EDGE_KEYS}),
        }
        if edge_scope:
            data["extra"]["scope"] = edge_scope
        return _validated(Edge.model_validate, data, where)

    # -- state -----------------------------------------------------------------------------------------------

    def history(self, value: Any, last_processed_seq: Any) -> HistoryState:
        d: dict[str, Any] = {}
        if isinstance(value, Mapping):
            for key, target in _HISTORY_KEYS.items():
                d[target] = _text(value.get(key))
            floor = _finite(value.get("lastProcessedAssistantFloor"))
        else:
            if value is not None:
                self.warn(f"historyState: expected an object, got {_json_type(value)}; ignored")
            floor = None
        if floor is None:
            floor = _finite(last_processed_seq)
        d["last_processed_assistant_floor"] = max(-1, math.floor(floor)) if floor is not None else -1
        return HistoryState(**d)

    def knowledge(self, value: Any, node_ids: set[str]) -> KnowledgeState:
        if value is None:
            return KnowledgeState()
        if not isinstance(value, Mapping):
            self.warn(f"knowledgeState: expected an object, got {_json_type(value)}; ignored")
            return KnowledgeState()
        owners_raw = value.get("owners")
        if owners_raw is None:
            return KnowledgeState()
        if isinstance(owners_raw, list):
            items = [(None, entry) for entry in owners_raw]
        elif isinstance(owners_raw, Mapping):
            items = list(owners_raw.items())
        else:
            self.warn(f"knowledgeState.owners: expected an object, got {_json_type(owners_raw)}; ignored")
            return KnowledgeState()
        owners: dict[str, KnowledgeOwner] = {}
        for i, (dict_key, entry) in enumerate(items):
            where = "knowledgeState.owners" + (f"[{dict_key!r}]" if dict_key is not None else f"[{i}]")
            owner = self.owner(dict_key, entry, node_ids, where)
            if owner is None:
                continue
            if owner.owner_key in owners:
                self.warn(f"{where}: duplicate owner key {owner.owner_key!r}; skipped")
                continue
            owners[owner.owner_key] = owner
        return KnowledgeState(owners=owners)

    def owner(self, dict_key: Any, entry: Any, node_ids: set[str], where: str) -> KnowledgeOwner | None:
        if not isinstance(entry, Mapping):
            self.warn(f"{where}: expected an object, got {_json_type(entry)}; skipped")
            return None
        key = _text(entry.get("ownerKey")).strip() or _text(dict_key).strip()
        owner_type = _text(entry.get("ownerType"))
        if owner_type not in ("character", "user"):
            owner_type = key.split(":", 1)[0] if ":" in key else ""
        if owner_type not in ("character", "user") or not key.startswith(f"{owner_type}:"):
            self.warn(f"{where}: owner without a valid ownerType/ownerKey ({key!r}); skipped")
            return None
        if dict_key is not None and _text(dict_key) != key:
            self.warn(f"{where}: entry is keyed {key!r}; re-keyed")

        pruned = 0

        def ids(name: str) -> list[str]:
            nonlocal pruned
            values = _str_list(entry.get(name))
            kept = [v for v in values if v in node_ids]
            pruned += len(values) - len(kept)
            return kept

        scores: dict[str, float] = {}
        raw_scores = entry.get("visibilityScores")
        if isinstance(raw_scores, Mapping):
            for node_id, score in raw_scores.items():
                f = _finite(score)
                if f is None:
                    continue
                if node_id not in node_ids:
                    pruned += 1
                    continue
                scores[str(node_id)] = min(1.0, max(0.0, f))
        data = {
            "owner_type": owner_type,
            "owner_key": key,
            "owner_name": _text(entry.get("ownerName")),
            "node_id": _text(entry.get("nodeId")),
            "aliases": tuple(_str_list(entry.get("aliases"))),
            "known_node_ids": ids("knownNodeIds"),
            "mistaken_node_ids": ids("mistakenNodeIds"),
            "visibility_scores": scores,
            "manual_known_node_ids": ids("manualKnownNodeIds"),
            "manual_hidden_node_ids": ids("manualHiddenNodeIds"),
            "updated_at": self.millis(entry.get("updatedAt"), f"{where}.updatedAt"),
            "last_source": _text(entry.get("lastSource")),
        }
        if pruned:
            self.warn(f"{where}: {pruned} reference(s) to missing nodes pruned")
        try:
            return KnowledgeOwner.model_validate(data)
        except ValidationError as exc:
            self.warn(f"{where}: {_first_error(exc)}; skipped")
            return None

    def regions(self, value: Any) -> RegionState:
        if value is None:
            return RegionState()
        if not isinstance(value, Mapping):
            self.warn(f"regionState: expected an object, got {_json_type(value)}; ignored")
            return RegionState()
        from memory_recall.model.graph import split_region_tokens

        adjacency: dict[str, RegionAdjacency] = {}
        raw_map = value.get("adjacencyMap")
        if isinstance(raw_map, Mapping):
            for name, entry in raw_map.items():
                region = _text(name).strip()
                if not region:
                    continue
                if isinstance(entry, list | str):
                    entry = {"adjacent": entry}
                if not isinstance(entry, Mapping):
                    self.warn(f"regionState.adjacencyMap[{region!r}]: expected an object; skipped")
                    continue
                adjacency[region] = RegionAdjacency(
                    adjacent=tuple(split_region_tokens(entry.get("adjacent"))),
                    aliases=tuple(split_region_tokens(entry.get("aliases"))),
                    source=_text(entry.get("source")),
                    updated_at=self.millis(
                        entry.get("updatedAt"), f"regionState.adjacencyMap[{region!r}].updatedAt"
                    ),
                )
        recent = split_region_tokens(value.get("recentRegions"))
        if len(recent) > 8:
            self.warn("regionState.recentRegions: more than 8 regions; cut to 8")
        return RegionState(
            adjacency_map=adjacency,
            manual_active_region=_text(value.get("manualActiveRegion")).strip(),
            recent_regions=tuple(recent[:8]),
        )

    def timeline(self, value: Any) -> TimelineState:
        if value is None:
            return TimelineState()
        if not isinstance(value, Mapping):
            self.warn(f"timelineState: expected an object, got {_json_type(value)}; ignored")
            return TimelineState()
        raw_segments = value.get("segments") or []
        segments: list[StorySegment] = []
        seen: set[str] = set()
        pending: list[tuple[int, dict[str, Any]]] = []
        max_order = 0
        for i, seg in enumerate(raw_segments if isinstance(raw_segments, list) else []):
            where = f"timelineState.segments[{i}]"
            seg_extra: dict[str, Any] = {}
            d = self.sub_object(
                seg,
                {"id": "id", "label": "label", "normalizedKey": "normalized_key", "order": "order",
                 "aliases": "aliases", "parentId": "parent_id", "relationToParent": "relation_to_parent",
                 "anchorLabel": "anchor_label"},
                where,
                keep=seg_extra,
            )
            seg_id = _opt_id(d.get("id"))
            if seg_id is None or len(seg_id) > 128:
                self.warn(f"{where}: segment without a usable id; skipped")
                continue
            if seg_id in seen:
                self.warn(f"{where}: duplicate segment id {seg_id!r}; skipped")
                continue
            seen.add(seg_id)
            order = _finite(d.get("order"))
            data: dict[str, Any] = {
                "id": seg_id,
                "label": _text(d.get("label")),
                "normalized_key": _text(d.get("normalized_key")),
                "aliases": tuple(_str_list(d.get("aliases"))),
                "parent_id": _text(d.get("parent_id")),
                "relation_to_parent": _text(d.get("relation_to_parent")),
                "anchor_label": _text(d.get("anchor_label")),
                "extra": seg_extra,
            }
            if order is not None and order >= 1:
                data["order"] = math.floor(order)
                max_order = max(max_order, data["order"])
            else:
                self.warn(f"{where}.order: {d.get('order')!r} is not a number ≥ 1; appended after the others")
            pending.append((i, data))
        for _i, data in pending:
            if "order" not in data:
                max_order += 1
                data["order"] = max_order
            segments.append(StorySegment(**data))
        next_order = _finite(value.get("nextOrder"))
        recent = _str_list(value.get("recentSegmentIds"))
        if len(recent) > 12:
            self.warn("timelineState.recentSegmentIds: more than 12 ids; cut to 12")
        return TimelineState(
            segments=tuple(segments),
            next_order=max(max_order + 1, math.floor(next_order) if next_order is not None else 1),
            manual_active_segment_id=_text(value.get("manualActiveSegmentId")),
            last_extracted_segment_id=_text(value.get("lastExtractedSegmentId")),
            recent_segment_ids=tuple(recent[:12]),
        )

    def summaries(self, value: Any) -> SummaryState:
        if value is None:
            return SummaryState()
        if not isinstance(value, Mapping):
            self.warn(f"summaryState: expected an object, got {_json_type(value)}; ignored")
            return SummaryState()
        entries: list[SummaryEntry] = []
        seen: set[str] = set()
        raw_entries = value.get("entries") or []
        for i, entry in enumerate(raw_entries if isinstance(raw_entries, list) else []):
            where = f"summaryState.entries[{i}]"
            if not isinstance(entry, Mapping):
                self.warn(f"{where}: expected an object; skipped")
                continue
            entry_id = (_opt_id(entry.get("id")) or self.derive_id(entry))[:128]
            if entry_id in seen:
                self.warn(f"{where}: duplicate entry id {entry_id!r}; skipped")
                continue
            seen.add(entry_id)
            level = _finite(entry.get("level"))
            entries.append(
                SummaryEntry(
                    id=entry_id,
                    level=max(0, math.floor(level)) if level is not None else 0,
                    kind=_choice(entry.get("kind"), _SUMMARY_KINDS, "small"),  # type: ignore[arg-type]
                    status=_choice(entry.get("status"), _SUMMARY_STATUSES, "active"),  # type: ignore[arg-type]
                    text=_text(entry.get("text")),
                    message_range=self.int_range(entry.get("messageRange")),
                    story_time_span=self.story_span(entry.get("storyTimeSpan"), f"{where}.storyTimeSpan"),
                    created_at=self.millis(entry.get("createdAt"), f"{where}.createdAt"),
                )
            )
        active = tuple(_str_list(value.get("activeEntryIds")))
        return SummaryState(entries=tuple(entries), active_entry_ids=active)

    def journal(self, value: Any) -> tuple[JournalEntry, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            self.warn(f"batchJournal: expected an array, got {_json_type(value)}; ignored")
            return ()
        out: list[JournalEntry] = []
        for i, entry in enumerate(value):
            rng = self.int_range(entry.get("processedRange")) if isinstance(entry, Mapping) else None
            if rng is None:
                self.warn(f"batchJournal[{i}]: no finite processedRange; skipped")
                continue
            out.append(JournalEntry(processed_range=rng))
        return tuple(out)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def _validated(build: Callable[[Any], Any], data: dict[str, Any], where: str) -> Any:
    """Run a model constructor; a rejection becomes an :class:`InputError` naming the camelCase export key."""
    try:
        return build(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err.get("loc", ())]
        if loc:
            loc[0] = _SNAKE_TO_CAMEL.get(loc[0], loc[0])
        path = ".".join([where, *loc])
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        raise InputError(path, msg) from None


# ------------------------------------------------------------------------------------------------------------
# Export helpers
# ------------------------------------------------------------------------------------------------------------


def _export_scope(scope: MemoryScope) -> dict[str, Any]:
    return {
        "layer": scope.layer,
        "ownerType": scope.owner_type,
        "ownerId": scope.owner_id,
        "ownerName": scope.owner_name,
        "regionPrimary": scope.region_primary,
        "regionPath": list(scope.region_path),
        "regionSecondary": list(scope.region_secondary),
    }


def _export_span(span: StoryTimeSpan) -> dict[str, Any]:
    return {
        "startSegmentId": span.start_segment_id,
        "endSegmentId": span.end_segment_id,
        "startLabel": span.start_label,
        "endLabel": span.end_label,
        "mixed": span.mixed,
        "source": span.source,
    }


def _export_node(node: Node) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": node.id,
        "type": node.type,
        "level": node.level,
        "parentId": node.parent_id,
        "childIds": list(node.child_ids),
        "seq": node.seq,
        "seqRange": list(node.seq_range) if node.seq_range is not None else None,
        "archived": node.archived,
        "fields": copy.deepcopy(node.fields),
        "embedding": None,
        "importance": node.importance,
        "accessCount": node.access_count,
        "lastAccessTime": node.last_access_time,
        "createdTime": node.created_time,
        "updatedAt": node.updated_at,
        "prevId": node.prev_id,
        "nextId": node.next_id,
        "clusters": copy.deepcopy(node.extra.get(_CLUSTERS, [])),
        "scope": _export_scope(node.scope),
        "storyTime": {
            "segmentId": node.story_time.segment_id,
            "label": node.story_time.label,
            "tense": node.story_time.tense,
            "relation": node.story_time.relation,
            "anchorLabel": node.story_time.anchor_label,
            "confidence": node.story_time.confidence,
            "source": node.story_time.source,
        },
        "storyTimeSpan": _export_span(node.story_time_span),
    }
    if node.evidence:
        out["evidence"] = list(node.evidence)
    _merge_nested(out, node.extra, _NESTED_KEYS)
    for key, value in node.extra.items():
        if key not in out:
            out[key] = copy.deepcopy(value)
    return out


def _merge_nested(out: dict[str, Any], extra: Mapping[str, Any], keys: tuple[str, ...]) -> None:
    """Write the kept unknown keys of each nested object (``extra[key]``) back into ``out[key]``; a key the
    object already has wins (it is the model's value)."""
    for key in keys:
        kept = extra.get(key)
        if isinstance(kept, Mapping) and isinstance(out.get(key), dict):
            for k, v in kept.items():
                out[key].setdefault(k, copy.deepcopy(v))


def _export_edge(edge: Edge) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": edge.id,
        "fromId": edge.from_id,
        "toId": edge.to_id,
        "relation": edge.relation,
        "strength": edge.strength,
        "edgeType": edge.edge_type,
        "validAt": edge.valid_at,
        "invalidAt": edge.invalid_at,
        "expiredAt": edge.expired_at,
        "createdTime": edge.created_time,
        "updatedAt": edge.updated_at,
        "scope": _export_scope(edge.scope),
    }
    _merge_nested(out, edge.extra, ("scope",))
    for key, value in edge.extra.items():
        if key not in out:
            out[key] = copy.deepcopy(value)
    return out


def _export_owner(owner: KnowledgeOwner) -> dict[str, Any]:
    return {
        "ownerType": owner.owner_type,
        "ownerKey": owner.owner_key,
        "ownerName": owner.owner_name,
        "nodeId": owner.node_id,
        "aliases": list(owner.aliases),
        "knownNodeIds": list(owner.known_node_ids),
        "mistakenNodeIds": list(owner.mistaken_node_ids),
        "visibilityScores": dict(owner.visibility_scores),
        "manualKnownNodeIds": list(owner.manual_known_node_ids),
        "manualHiddenNodeIds": list(owner.manual_hidden_node_ids),
        "updatedAt": owner.updated_at,
        "lastSource": owner.last_source,
    }


def _export_history(history: HistoryState) -> dict[str, Any]:
    out: dict[str, Any] = {key: getattr(history, target) for key, target in _HISTORY_KEYS.items()}
    out["lastProcessedAssistantFloor"] = history.last_processed_assistant_floor
    return out
