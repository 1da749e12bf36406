"""Render a recall result as the prompt block (reference §4 ``formatInjection``, recall-spec departures 2 and 5).

Usage::

    from injector import render
    injection = render(result, settings.injector)
    prompt_block = injection.text

:func:`render` reads a :class:`~memory_recall.pipeline.result.RecallResult`; :func:`render_parts` takes the same
parts built by hand (golden tests, other callers). Both return an :class:`Injection`: the text (lines joined with
``"\\n"``, trimmed, ``""`` when there is nothing to inject), the blocks as structured data, every node left out
with its reason, the length in characters and the reference's token estimate.

Pipeline: block language (:mod:`injector.labels`, from ``settings.language`` and the texts of every node and summary
entry passed in, before caps and budget) → caps (:func:`injector.budget.fill_cap`) → section plan
(:func:`injector.buckets.plan_sections`) → tables (:mod:`injector.tables`) → row and block budget
(:func:`injector.budget.fit`) → text.

Omission reasons
    ``core-cap``, ``objective-global-cap``, ``objective-global-disabled`` (from the result, or applied here to
    hand-built parts), ``user-pov-disabled``, ``gate-suppressed`` (a listed node the recall gate removed; never
    printed, departure 2), ``unknown-type`` (no table in the schema; its section header is still printed, as in
    the reference), ``budget-row``, ``budget-block``. Summary entries dropped by the budget are listed by entry id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from memory_recall.model.graph import DEFAULT_SCHEMA, NodeTypeSpec
from memory_recall.model.records import estimate_tokens
from memory_recall.settings import InjectorSettings

from .buckets import SectionPlan, plan_sections
from .budget import DropCandidate, fill_cap, fit, row_rank, summary_rank
from .labels import ZH, Labels, block_texts, labels_for, language_of
from .tables import InjectionTable, as_node_dict, build_table, node_id, row_line, table_lines

__all__ = ["Injection", "InjectionBlock", "InjectionSummaryEntry", "OmittedEntry", "render", "render_parts"]

_BUCKET_LISTS = ("characterPov", "userPov", "objectiveCurrentRegion", "objectiveGlobal")


class InjectionSummaryEntry(BaseModel):
    """One printed summary entry."""

    model_config = ConfigDict(frozen=True)

    id: str
    header: str
    story_time_span: str
    text: str


class InjectionBlock(BaseModel):
    """One printed section: ``section`` is ``summary``, ``character_pov``, ``user_pov``,
    ``objective_current_region``, ``objective_global``, ``core`` or ``recalled``."""

    model_config = ConfigDict(frozen=True)

    section: str
    heading: str
    owner_key: str = ""
    note: str = ""
    tables: list[InjectionTable] = []
    summary_entries: list[InjectionSummaryEntry] = []


class OmittedEntry(BaseModel):
    """A node (or summary entry) left out of the block, why, and from which section (empty for caps)."""

    model_config = ConfigDict(frozen=True)

    node_id: str
    reason: str
    section: str = ""


class Injection(BaseModel):
    """The rendered block. ``char_count`` is ``len(text)``; ``token_estimate`` is the reference's
    ``ceil(cjk/2 + other/4)``."""

    model_config = ConfigDict(frozen=True)

    text: str
    blocks: list[InjectionBlock]
    omitted: list[OmittedEntry]
    char_count: int
    token_estimate: int


# --- materialising a plan -----------------------------------------------------------------------------------------


def _row_key(nid: str) -> str:
    return f"node:{nid}"


def _summary_key(sid: str) -> str:
    return f"summary:{sid}"


class _Layout:
    """A section plan rendered with some rows dropped."""

    def __init__(self, plans: Sequence[SectionPlan], settings: InjectorSettings, labels: Labels) -> None:
        self.plans = plans
        self.settings = settings
        self.labels = labels

    def blocks(self, dropped: frozenset[str]) -> list[tuple[int, InjectionBlock]]:
        """``(plan index, block)`` of every section that is printed."""
        out: list[tuple[int, InjectionBlock]] = []
        s = self.settings
        for index, plan in enumerate(self.plans):
            if plan.summary:
                kept = [e for e in plan.summary if _summary_key(e.id) not in dropped]
                if kept:
                    out.append((index, InjectionBlock(section=plan.section, heading=plan.heading, summary_entries=[
                        InjectionSummaryEntry(id=e.id, header=e.header, story_time_span=e.story_time_span,
                                              text=e.text) for e in kept])))
                continue
            tables: list[InjectionTable] = []
            planned_rows = 0
            for t in plan.tables:
                if t.spec is None:
                    continue
                planned_rows += len(t.nodes)
                nodes = [n for n in t.nodes if _row_key(node_id(n)) not in dropped]
                if nodes:
                    tables.append(build_table(t.spec, nodes, cell_chars=s.cell_chars,
                                              story_time_labels=s.inject_story_time_label, heading=t.heading,
                                              labels=self.labels))
            # A section keeps its header only while it keeps a row; one that never had a row (unknown types
            # only) prints its bare header, as in the reference.
            if tables or planned_rows == 0:
                out.append((index, InjectionBlock(section=plan.section, heading=plan.heading,
                                                  owner_key=plan.owner_key, note=plan.note, tables=tables)))
        return out

    def lines(self, blocks: Sequence[tuple[int, InjectionBlock]]) -> list[str]:
        lines: list[str] = []
        for index, block in blocks:
            plan = self.plans[index]
            if lines:
                lines.append("")
            lines.append(block.heading)
            for entry in block.summary_entries:
                span = [f"story_time_span: {entry.story_time_span}"] if entry.story_time_span else []
                lines.extend([entry.header, *span, entry.text, ""])
            while lines and lines[-1] == "":
                lines.pop()
            if block.note:
                lines.append(block.note)
            if not plan.group_headings:
                for table in block.tables:
                    lines.extend(table_lines(table))
                continue
            # Legacy groups: a heading stays while its group keeps a table, or when the group never had one.
            kept = {t.heading for t in block.tables}
            planned = {t.heading for t in plan.tables if t.spec is not None and t.nodes}
            for heading in plan.group_headings:
                if heading in kept or heading not in planned:
                    lines.append(heading)
                    for table in block.tables:
                        if table.heading == heading:
                            lines.extend(table_lines(table))
        return lines

    def text(self, dropped: frozenset[str]) -> str:
        return "\n".join(self.lines(self.blocks(dropped))).strip()


# --- public API ---------------------------------------------------------------------------------------------------


def _nodes(items: Sequence[Any] | None) -> list[dict[str, Any]]:
    return [as_node_dict(n) for n in items or ()]


def _injector_settings(settings: Any) -> InjectorSettings:
    if settings is None:
        return InjectorSettings()
    if isinstance(settings, InjectorSettings):
        return settings
    if isinstance(getattr(settings, "injector", None), InjectorSettings):
        return settings.injector
    raise TypeError(f"settings must be InjectorSettings or RecallSettings, got {type(settings).__name__}")


def render_parts(
    *,
    summary_entries: Sequence[Any] = (),
    scope_buckets: Mapping[str, Any] | None = None,
    core_nodes: Sequence[Any] = (),
    recall_nodes: Sequence[Any] = (),
    owner_labels: Mapping[str, str] | None = None,
    settings: InjectorSettings | None = None,
    schema: Sequence[NodeTypeSpec] = DEFAULT_SCHEMA,
    scores: Mapping[str, float] | None = None,
    omitted: Sequence[OmittedEntry] = (),
) -> Injection:
    """Render hand-built parts.

    ``summary_entries`` are :class:`~memory_recall.model.state.SummaryEntry` models or their dicts (folded or
    empty entries are skipped). ``scope_buckets`` maps the reference's bucket keys (``characterPov``,
    ``characterPovByOwner`` {owner key: nodes}, ``characterPovOwnerOrder``, ``userPov``,
    ``objectiveCurrentRegion``, ``objectiveGlobal``) to nodes (:class:`~memory_recall.model.graph.Node` or dicts);
    ``None`` skips the scoped layout. ``core_nodes`` are the always-inject nodes, ``recall_nodes`` the selected
    non-core ones, both in recall order. ``owner_labels`` maps owner keys to scene-owner candidate names. The fixed
    labels follow ``settings.language`` (``"auto"``: the language of these parts' texts, :mod:`injector.labels`).
    ``scores`` (node id → weighted score of selected nodes) orders cap filling and budget drops; ``omitted`` is
    prepended to the report (caps already applied upstream).
    """
    s = _injector_settings(settings)
    scores = dict(scores or {})
    report: list[OmittedEntry] = list(omitted)
    core = _nodes(core_nodes)
    recall = _nodes(recall_nodes)
    summaries = [as_node_dict(e) for e in summary_entries]
    labels = labels_for(language_of(s.language, block_texts(
        [*core, *recall, *_bucket_nodes(scope_buckets)], summaries, sorted((owner_labels or {}).values()))))
    recall_ids = {node_id(n) for n in recall}

    kept_core, capped = fill_cap(core, scores, s.core_cap)
    removed = {node_id(n) for n in capped if node_id(n) not in scores and node_id(n) not in recall_ids}
    report.extend(OmittedEntry(node_id=node_id(n), reason="core-cap") for n in capped
                  if node_id(n) in removed)

    buckets: dict[str, Any] | None = None
    if scope_buckets is not None:
        def keep(items: Any) -> list[dict[str, Any]]:
            return [n for n in _nodes(items) if node_id(n) not in removed]

        buckets = {key: keep(scope_buckets.get(key)) for key in _BUCKET_LISTS}
        by_owner = scope_buckets.get("characterPovByOwner") or {}
        buckets["characterPovByOwner"] = {k: keep(v) for k, v in by_owner.items()}
        buckets["characterPovOwnerOrder"] = list(scope_buckets.get("characterPovOwnerOrder") or [])
        if not s.inject_user_pov_memory:
            report.extend(OmittedEntry(node_id=node_id(n), reason="user-pov-disabled") for n in buckets["userPov"])
            buckets["userPov"] = []
        if not s.inject_objective_global_memory:
            report.extend(OmittedEntry(node_id=node_id(n), reason="objective-global-disabled")
                          for n in buckets["objectiveGlobal"])
            buckets["objectiveGlobal"] = []
        buckets["objectiveGlobal"], left = fill_cap(buckets["objectiveGlobal"], scores, s.objective_global_cap)
        report.extend(OmittedEntry(node_id=node_id(n), reason="objective-global-cap") for n in left)

    plans, unknown = plan_sections(
        summary_entries=summaries,
        scope_buckets=buckets,
        core_nodes=[n for n in kept_core if node_id(n) not in removed],
        recall_nodes=recall,
        owner_labels=owner_labels or {},
        schema=schema,
        headings=s.headings,
        labels=labels,
    )
    section_of: dict[str, str] = {}
    for plan in plans:
        for t in plan.tables:
            for n in t.nodes:
                section_of.setdefault(node_id(n), plan.section)
    report.extend(OmittedEntry(node_id=nid, reason="unknown-type") for nid in unknown)

    layout = _Layout(plans, s, labels)
    # Row budget: judged on the rows as the unbudgeted block prints them.
    too_long: list[str] = []
    for _, block in layout.blocks(frozenset()):
        for table in block.tables:
            for nid, cells in zip(table.node_ids, table.rows, strict=True):
                if len(row_line(cells)) > s.max_row_chars:
                    too_long.append(nid)
    report.extend(OmittedEntry(node_id=nid, reason="budget-row", section=section_of.get(nid, ""))
                  for nid in too_long)
    base = frozenset(_row_key(nid) for nid in too_long)

    candidates: list[DropCandidate] = []
    for index, plan in enumerate(plans):
        for pos, entry in enumerate(plan.summary):
            candidates.append(DropCandidate(_summary_key(entry.id), plan.section,
                                            summary_rank(plan.priority, index, pos)))
        pos = 0
        for t in plan.tables:
            for n in t.nodes:
                nid = node_id(n)
                if _row_key(nid) not in base:
                    candidates.append(DropCandidate(_row_key(nid), plan.section,
                                                    row_rank(plan.priority, index, pos, scores.get(nid))))
                pos += 1
    drops = fit(candidates, lambda extra: len(layout.text(base | extra)), s.max_chars)
    dropped = base | frozenset(drops)
    by_key = {c.key: c for c in candidates}
    report.extend(OmittedEntry(node_id=key.split(":", 1)[1], reason="budget-block", section=by_key[key].section)
                  for key in drops)

    printed = layout.blocks(dropped)
    text = "\n".join(layout.lines(printed)).strip()
    blocks = [b for _, b in printed]
    if len(text) > s.max_chars:  # only bare headers left, and even they do not fit
        blocks, text = [], ""
    return Injection(text=text, blocks=blocks, omitted=report, char_count=len(text),
                     token_estimate=estimate_tokens(text))


def _bucket_nodes(scope_buckets: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    if scope_buckets is None:
        return []
    out = [n for key in _BUCKET_LISTS for n in _nodes(scope_buckets.get(key))]
    by_owner = scope_buckets.get("characterPovByOwner") or {}
    for key in sorted(by_owner):
        out.extend(_nodes(by_owner[key]))
    return out


def _suppressed(meta: Mapping[str, Any]) -> set[str]:
    out: set[str] = set()
    for where in (meta, meta.get("retrieval") or {}):
        # currentTurnExcluded: the current-turn rule of the visibility stage (message nodes at floors ≥ the
        # recall's user floor), final like the gate's verdict.
        for key in ("gate_suppressed", "temporalSuppressedNodes", "currentTurnExcluded"):
            out.update(str(x) for x in where.get(key) or ())
    return out


def _candidate_names(meta: Mapping[str, Any]) -> dict[str, str]:
    names: dict[str, str] = {}
    for where in (meta.get("retrieval") or {}, meta.get("scopeContext") or {}, meta):
        for c in where.get("sceneOwnerCandidates") or ():
            if isinstance(c, Mapping) and c.get("ownerKey") and c.get("ownerName"):
                names.setdefault(str(c["ownerKey"]), str(c["ownerName"]))
    return names


def render(result: Any, settings: Any = None, schema: Sequence[NodeTypeSpec] = DEFAULT_SCHEMA) -> Injection:
    """Render a :class:`~memory_recall.pipeline.result.RecallResult` (``settings``: :class:`InjectorSettings` or a
    whole ``RecallSettings``). Only nodes in the result's lists are printed, never one in
    ``meta["gate_suppressed"]`` / ``meta["retrieval"]["gate_suppressed"]`` (or temporally suppressed, or in
    ``currentTurnExcluded``: the turn being answered and later ones), so the legacy layout cannot re-introduce a
    gated node (departure 2)."""
    nodes: Mapping[str, dict[str, Any]] = result.nodes
    suppressed = _suppressed(result.meta or {})
    gated: list[str] = []

    def resolve(ids: Sequence[str]) -> list[dict[str, Any]]:
        out = []
        for nid in ids:
            if nid in suppressed:
                if nid not in gated:
                    gated.append(nid)
            elif nid in nodes:
                out.append(nodes[nid])
        return out

    sb = result.scope_buckets
    buckets = {
        "characterPov": resolve(sb.characterPov),
        "characterPovByOwner": {k: resolve(v) for k, v in sb.characterPovByOwner.items()},
        "characterPovOwnerOrder": list(sb.characterPovOwnerOrder),
        "userPov": resolve(sb.userPov),
        "objectiveCurrentRegion": resolve(sb.objectiveCurrentRegion),
        "objectiveGlobal": resolve(sb.objectiveGlobal),
    }
    # The result builder labels an owner with neither key nor name "未命名角色"; dropped here, the injector's own
    # fallback words it in the block's language.
    owner_labels = {k: v for k, v in sb.characterPovOwnerLabels.items() if k or v != ZH.unnamed_character}
    owner_labels.update(_candidate_names(result.meta or {}))
    core = resolve(result.core_node_ids)
    recall = resolve(result.recall_node_ids)
    prior = [OmittedEntry(node_id=o.node_id, reason=o.reason) for o in result.omitted]
    prior += [OmittedEntry(node_id=nid, reason="gate-suppressed") for nid in gated]
    return render_parts(
        summary_entries=result.summary_entries,
        scope_buckets=buckets,
        core_nodes=core,
        recall_nodes=recall,
        owner_labels=owner_labels,
        settings=_injector_settings(settings),
        schema=schema,
        scores={m.node_id: float(m.score) for m in result.selected},
        omitted=prior,
    )
