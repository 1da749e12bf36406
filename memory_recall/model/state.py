"""Per-chat state beside the nodes and edges (stbme-reference §1.1, §1.5–§1.8).

* :class:`KnowledgeState` — who knows what (owners with known/mistaken/hidden ids and visibility scores).
* :class:`RegionState` — region adjacency, manual active region, recent regions.
* :class:`TimelineState` — story segments with their order.
* :class:`SummaryState` — summary entries and the active frontier.
* :class:`HistoryState` — the active region/owners/story segment the host last reported.
* :class:`MemoryGraph` — everything of one chat together (used by importers, exporters and tests; the store
  keeps the parts in their own tables).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from memory_recall.model.graph import Edge, Node, StoryTimeSpan

__all__ = [
    "HistoryState",
    "JournalEntry",
    "KnowledgeOwner",
    "KnowledgeState",
    "MemoryGraph",
    "RegionAdjacency",
    "RegionState",
    "StorySegment",
    "SummaryEntry",
    "SummaryState",
    "TimelineState",
]

#: Each id list of a knowledge owner is capped at this many unique ids (reference §1.5).
OWNER_ID_LIST_CAP = 512

_Frozen = ConfigDict(frozen=True, extra="forbid")


def _unique_capped(values: Any) -> tuple[str, ...]:
    seen: set[str] = set()
    out: list[str] = []
    for v in values or ():
        if isinstance(v, str) and v and v not in seen:
            seen.add(v)
            out.append(v)
    return tuple(out[:OWNER_ID_LIST_CAP])


class KnowledgeOwner(BaseModel):
    """One knowledge owner entry (reference §1.5)."""

    model_config = _Frozen

    owner_type: Literal["character", "user"]
    owner_key: str = Field(min_length=3, max_length=300)
    owner_name: str = ""
    node_id: str = ""
    aliases: tuple[str, ...] = ()
    known_node_ids: tuple[str, ...] = ()
    mistaken_node_ids: tuple[str, ...] = ()
    visibility_scores: dict[str, Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]] = Field(
        default_factory=dict
    )
    manual_known_node_ids: tuple[str, ...] = ()
    manual_hidden_node_ids: tuple[str, ...] = ()
    updated_at: int = Field(default=0, ge=0)
    last_source: str = ""

    @field_validator("known_node_ids", "mistaken_node_ids", "manual_known_node_ids", "manual_hidden_node_ids",
                     mode="before")
    @classmethod
    def _cap(cls, value: Any) -> tuple[str, ...]:
        return _unique_capped(value)

    @model_validator(mode="after")
    def _key_matches_type(self) -> KnowledgeOwner:
        if not self.owner_key.startswith(f"{self.owner_type}:"):
            raise ValueError(f"owner_key {self.owner_key!r} must start with {self.owner_type + ':'!r}")
        return self


class KnowledgeState(BaseModel):
    """``knowledgeState.owners``: owner key → entry."""

    model_config = _Frozen

    owners: dict[str, KnowledgeOwner] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _keys_agree(self) -> KnowledgeState:
        for key, entry in self.owners.items():
            if key != entry.owner_key:
                raise ValueError(f"owners[{key!r}] holds an entry keyed {entry.owner_key!r}")
        return self


class RegionAdjacency(BaseModel):
    """Adjacency and aliases of one region."""

    model_config = _Frozen

    adjacent: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    source: str = ""
    updated_at: int = Field(default=0, ge=0)


class RegionState(BaseModel):
    """``regionState`` (reference §1.6)."""

    model_config = _Frozen

    adjacency_map: dict[str, RegionAdjacency] = Field(default_factory=dict)
    manual_active_region: str = ""
    recent_regions: tuple[str, ...] = Field(default=(), max_length=8)

    def canonical(self, region: str) -> str:
        """Exact or alias lookup (case-insensitive) in the adjacency map, else the input."""
        r = region.strip()
        if not r:
            return ""
        low = r.lower()
        for name, entry in self.adjacency_map.items():
            if name.lower() == low or any(a.lower() == low for a in entry.aliases):
                return name
        return r


class StorySegment(BaseModel):
    """One segment of the story timeline; only ``order`` is used for comparisons."""

    model_config = _Frozen

    id: str = Field(min_length=1, max_length=128)
    label: str = ""
    normalized_key: str = ""
    order: int = Field(ge=1)
    aliases: tuple[str, ...] = ()
    parent_id: str = ""
    relation_to_parent: str = ""
    anchor_label: str = ""
    #: Keys of an imported segment the model does not read (ST-BME's ``confidence``, ``matcherKey``, ``source``,
    #: ``updatedAt`` …), kept so that an export writes them back.
    extra: dict[str, Any] = Field(default_factory=dict)


class TimelineState(BaseModel):
    """``timelineState`` (reference §1.7)."""

    model_config = _Frozen

    segments: tuple[StorySegment, ...] = ()
    next_order: int = Field(default=1, ge=1)
    manual_active_segment_id: str = ""
    last_extracted_segment_id: str = ""
    recent_segment_ids: tuple[str, ...] = Field(default=(), max_length=12)

    @model_validator(mode="after")
    def _unique_ids(self) -> TimelineState:
        ids = [s.id for s in self.segments]
        if len(ids) != len(set(ids)):
            raise ValueError("segment ids must be unique")
        return self


class SummaryEntry(BaseModel):
    """One summary entry (reference §1.8)."""

    model_config = _Frozen

    id: str = Field(min_length=1, max_length=128)
    level: int = Field(default=0, ge=0)
    kind: Literal["small", "rollup", "legacy-import"] = "small"
    status: Literal["active", "folded"] = "active"
    text: str = ""
    message_range: tuple[int, int] | None = None
    story_time_span: StoryTimeSpan = Field(default_factory=StoryTimeSpan)
    created_at: int = Field(default=0, ge=0)


class SummaryState(BaseModel):
    """``summaryState``: entries plus the ids of the active frontier."""

    model_config = _Frozen

    entries: tuple[SummaryEntry, ...] = ()
    active_entry_ids: tuple[str, ...] = ()

    def active_entries(self) -> list[SummaryEntry]:
        """Active entries listed in ``active_entry_ids``, sorted by range start, end, level, createdAt, id."""
        active = set(self.active_entry_ids)
        chosen = [e for e in self.entries if e.status == "active" and e.id in active]

        def key(e: SummaryEntry) -> tuple[float, float, int, int, str]:
            a, b = e.message_range if e.message_range is not None else (math.inf, math.inf)
            return (a, b, e.level, e.created_at, e.id)

        return sorted(chosen, key=key)


class HistoryState(BaseModel):
    """The parts of ``historyState`` recall reads (reference §1.1)."""

    model_config = _Frozen

    active_region: str = ""
    last_extracted_region: str = ""
    active_region_source: str = ""
    active_character_pov_owner: str = ""
    active_user_pov_owner: str = ""
    active_story_segment_id: str = ""
    active_story_time_label: str = ""
    active_story_time_source: str = ""
    last_extracted_story_segment_id: str = ""
    last_processed_assistant_floor: int = -1


class JournalEntry(BaseModel):
    """An extraction batch's processed floor range (only co-occurrence reads it)."""

    model_config = _Frozen

    processed_range: tuple[int, int]


class MemoryGraph(BaseModel):
    """All memory of one chat: nodes, edges and the state beside them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nodes: tuple[Node, ...] = ()
    edges: tuple[Edge, ...] = ()
    knowledge: KnowledgeState = Field(default_factory=KnowledgeState)
    regions: RegionState = Field(default_factory=RegionState)
    timeline: TimelineState = Field(default_factory=TimelineState)
    summaries: SummaryState = Field(default_factory=SummaryState)
    history: HistoryState = Field(default_factory=HistoryState)
    batch_journal: tuple[JournalEntry, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> MemoryGraph:
        ids: set[str] = set()
        for i, node in enumerate(self.nodes):
            if node.id in ids:
                raise ValueError(f"nodes[{i}].id {node.id!r} is duplicated")
            ids.add(node.id)
        edge_ids: set[str] = set()
        for i, edge in enumerate(self.edges):
            if edge.id in edge_ids:
                raise ValueError(f"edges[{i}].id {edge.id!r} is duplicated")
            edge_ids.add(edge.id)
            for end in (edge.from_id, edge.to_id):
                if end not in ids:
                    raise ValueError(f"edges[{i}] points at missing node {end!r}")
        return self
