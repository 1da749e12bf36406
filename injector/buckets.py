"""Section layout of the injection block (reference §4.1): which sections, in which order, holding which nodes.

:func:`plan_sections` turns summary entries, scope buckets and core/recall nodes into a list of
:class:`SectionPlan` — the block before any table is rendered and before the budget (:mod:`injector.budget`)
drops rows. Sections, in order:

1. ``summary`` — ``[Summary - Active Frontier]``, one entry per active summary entry with non-empty text
   (``[Summary L<level> / 楼 <a> ~ <b>]``, rollups ``[Summary L<level> / Rolled Up / 楼 <a> ~ <b>]``, ``?`` for a
   missing range; ``messages`` for ``楼`` in English blocks), an optional ``story_time_span: …`` line, then the
   text.
2. Scoped sections, each only when its node list is non-empty: ``character_pov`` (one per owner in
   ``characterPovOwnerOrder``, labelled by the scene-owner candidate's name, else the first node's scope owner
   name / id, else the key, else ``未命名角色`` (``unnamed character``); a single unlabelled section when the
   order is empty but ``characterPov`` is not), ``user_pov`` (with its fixed note line),
   ``objective_current_region``, ``objective_global``.
3. Only when 1 and 2 produced nothing: the legacy ``core`` and ``recalled`` sections (``recalled`` grouped
   under ``## 当前状态记忆`` / ``## 情景事件记忆`` / ``## 反思与长期锚点`` / ``## 规则与约束`` /
   ``## 其他关联记忆``, or their English forms). Callers pass
   only nodes that passed the recall gate (recall-spec departure 2: the reference printed gated nodes here,
   §7 item 3); :func:`injector.render.render` takes them from the result's core/recall lists minus
   ``gate_suppressed``.

The fixed words (floor marker, unnamed labels, the legacy group headings and the user-POV note while they are at
their defaults) come from the :class:`~injector.labels.Labels` passed in (default: the reference's Chinese).

Inside a section the nodes are grouped by type in order of first appearance, one table per type. A node is
planned at most once per block (the first section that holds it); a node whose type is not in the schema gets no
table (its section header stays) and is reported as ``unknown-type``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memory_recall.model.graph import NodeTypeSpec
from memory_recall.settings import InjectorHeadings

from .labels import ZH, Labels, localised_headings
from .tables import node_id, node_type, scope_owner, story_span_label

__all__ = [
    "LEGACY_GROUPS",
    "SECTION_PRIORITY",
    "SectionPlan",
    "SummaryItem",
    "TablePlan",
    "owner_label",
    "plan_sections",
    "summary_header",
]

# Headings and the user-POV note are settings (InjectorSettings.headings); their defaults are the reference's text,
# worded in the block's language by injector.labels.

#: Legacy ``[Memory - Recalled]`` groups, in print order; ``other`` takes every remaining type (reference §4.1).
LEGACY_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("## 当前状态记忆", ("character", "location")),
    ("## 情景事件记忆", ("event", "thread")),
    ("## 反思与长期锚点", ("reflection", "synopsis")),
    ("## 规则与约束", ("rule",)),
)

#: Budget priority of each section (higher is kept longer, recall-spec departure 5). Scoped sections follow the
#: reference's bucket priorities (§1.4: characterPov 5 > userPov 4 > currentRegion 3 > global 1); the summary
#: frontier is kept longest; in the legacy layout recalled (selected) nodes outrank always-inject core nodes,
#: which the reference let crowd them out (§7 item 15).
SECTION_PRIORITY: dict[str, int] = {
    "summary": 7,
    "character_pov": 6,
    "user_pov": 5,
    "objective_current_region": 4,
    "recalled": 3,
    "core": 2,
    "objective_global": 1,
}


@dataclass(frozen=True)
class SummaryItem:
    """One summary entry as printed: header line, optional span, text."""

    id: str
    header: str
    story_time_span: str
    text: str


@dataclass(frozen=True)
class TablePlan:
    """The nodes of one type in one section; ``spec`` is ``None`` for a type the schema does not know."""

    type: str
    spec: NodeTypeSpec | None
    nodes: tuple[dict[str, Any], ...]
    heading: str = ""


@dataclass(frozen=True)
class SectionPlan:
    """One section of the block before rendering."""

    section: str
    heading: str
    owner_key: str = ""
    note: str = ""
    tables: tuple[TablePlan, ...] = ()
    summary: tuple[SummaryItem, ...] = ()
    #: Headings of legacy groups that hold nodes (a group of unknown types still prints its heading).
    group_headings: tuple[str, ...] = ()

    @property
    def priority(self) -> int:
        return SECTION_PRIORITY[self.section]


@dataclass
class _Planner:
    schema: Mapping[str, NodeTypeSpec]
    planned: set[str] = field(default_factory=set)
    unknown: list[str] = field(default_factory=list)

    def tables(self, nodes: Sequence[dict[str, Any]], heading: str = "") -> list[TablePlan]:
        by_type: dict[str, list[dict[str, Any]]] = {}
        for node in nodes:
            nid = node_id(node)
            if nid in self.planned:
                continue
            t = node_type(node)
            if t not in self.schema:
                if nid not in self.unknown:
                    self.unknown.append(nid)
                by_type.setdefault(t, [])
                continue
            self.planned.add(nid)
            by_type.setdefault(t, []).append(node)
        return [TablePlan(type=t, spec=self.schema.get(t), nodes=tuple(ns), heading=heading)
                for t, ns in by_type.items()]


def summary_header(entry: Mapping[str, Any], labels: Labels = ZH) -> str:
    """``[Summary L<level> / 楼 <a> ~ <b>]`` (``labels.floors`` for ``楼``); rollups add ``Rolled Up /``; ``?`` for
    a missing range end."""
    level = entry.get("level", 0)
    rng = entry.get("message_range", entry.get("messageRange"))
    a = b = "?"
    if isinstance(rng, list | tuple):
        a = str(rng[0]) if len(rng) > 0 and rng[0] is not None else "?"
        b = str(rng[1]) if len(rng) > 1 and rng[1] is not None else "?"
    kind = " / Rolled Up" if entry.get("kind") == "rollup" else ""
    return f"[Summary L{level}{kind} / {labels.floors} {a} ~ {b}]"


def _summary_key(entry: Mapping[str, Any]) -> tuple[float, float, int, int, str]:
    rng = entry.get("message_range", entry.get("messageRange"))
    a, b = (rng[0], rng[1]) if isinstance(rng, list | tuple) and len(rng) == 2 else (math.inf, math.inf)
    created = entry.get("created_at", entry.get("createdAt", 0)) or 0
    return (a, b, int(entry.get("level", 0) or 0), int(created), str(entry.get("id", "")))


def summary_items(entries: Sequence[Mapping[str, Any]], labels: Labels = ZH) -> list[SummaryItem]:
    """Active entries with non-empty text, in the §1.8 order (range start, end, level, createdAt, id)."""
    active = [e for e in entries if e.get("status", "active") == "active" and str(e.get("text") or "").strip()]
    return [
        SummaryItem(id=str(e.get("id", "")), header=summary_header(e, labels), story_time_span=story_span_label(e),
                    text=str(e.get("text")).strip())
        for e in sorted(active, key=_summary_key)
    ]


def owner_label(key: str, nodes: Sequence[Mapping[str, Any]], owner_labels: Mapping[str, str],
                labels: Labels = ZH) -> str:
    """Section label of a character-POV owner: the scene-owner candidate's name for ``key``, else the first
    node's scope owner name / id, else the key, else ``labels.unnamed_character`` (``未命名角色``)."""
    if owner_labels.get(key):
        return str(owner_labels[key])
    if nodes:
        _, name, oid = scope_owner(nodes[0])
        if name or oid:
            return name or oid
    return key or labels.unnamed_character


def plan_sections(
    *,
    summary_entries: Sequence[Mapping[str, Any]],
    scope_buckets: Mapping[str, Any] | None,
    core_nodes: Sequence[dict[str, Any]],
    recall_nodes: Sequence[dict[str, Any]],
    owner_labels: Mapping[str, str],
    schema: Sequence[NodeTypeSpec],
    headings: InjectorHeadings | None = None,
    labels: Labels = ZH,
) -> tuple[list[SectionPlan], list[str]]:
    """The block's sections (see the module docstring) and the ids of nodes of unknown types, in plan order.

    ``scope_buckets`` holds node dicts under the reference's keys (``characterPov``, ``characterPovByOwner``,
    ``characterPovOwnerOrder``, ``userPov``, ``objectiveCurrentRegion``, ``objectiveGlobal``); ``None`` means no
    scoped layout at all (straight to the legacy layout). Headings still at their defaults are worded by
    ``labels`` (:func:`injector.labels.localised_headings`).
    """
    h = localised_headings(headings or InjectorHeadings(), labels)
    planner = _Planner(schema={s.id: s for s in schema})
    sections: list[SectionPlan] = []
    items = summary_items(summary_entries, labels)
    if items:
        sections.append(SectionPlan(section="summary", heading=h.summary, summary=tuple(items)))
    if scope_buckets is not None:
        by_owner: Mapping[str, Sequence[dict[str, Any]]] = scope_buckets.get("characterPovByOwner") or {}
        order = list(scope_buckets.get("characterPovOwnerOrder") or [])
        if order:
            for key in order:
                nodes = list(by_owner.get(key) or [])
                if nodes:
                    sections.append(SectionPlan(
                        section="character_pov",
                        heading=h.character_pov_owner.format(owner=owner_label(key, nodes, owner_labels, labels)),
                        owner_key=key, tables=tuple(planner.tables(nodes)),
                    ))
        elif scope_buckets.get("characterPov"):
            sections.append(SectionPlan(section="character_pov", heading=h.character_pov,
                                        tables=tuple(planner.tables(scope_buckets["characterPov"]))))
        for section, heading, key, note in (
            ("user_pov", h.user_pov, "userPov", h.user_pov_note),
            ("objective_current_region", h.objective_current_region, "objectiveCurrentRegion", ""),
            ("objective_global", h.objective_global, "objectiveGlobal", ""),
        ):
            nodes = list(scope_buckets.get(key) or [])
            if nodes:
                sections.append(SectionPlan(section=section, heading=heading, note=note,
                                            tables=tuple(planner.tables(nodes))))
    if sections:
        return sections, planner.unknown
    if core_nodes:
        sections.append(SectionPlan(section="core", heading=h.core, tables=tuple(planner.tables(core_nodes))))
    if recall_nodes:
        tables: list[TablePlan] = []
        group_titles: list[str] = []
        group_names = (h.group_state, h.group_episodic, h.group_reflective, h.group_rule)
        known = {t for _, types in LEGACY_GROUPS for t in types}
        groups = [*((name, types) for name, (_, types) in zip(group_names, LEGACY_GROUPS, strict=True)),
                  (h.group_other, ())]
        for heading, types in groups:
            members = [n for n in recall_nodes if (node_type(n) in types if types else node_type(n) not in known)]
            if members:
                group_titles.append(heading)
                tables.extend(planner.tables(members, heading))
        sections.append(SectionPlan(section="recalled", heading=h.recalled, tables=tuple(tables),
                                    group_headings=tuple(group_titles)))
    return sections, planner.unknown
