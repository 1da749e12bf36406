"""Builders for injector tests: nodes, hand-made recall results, fixture graphs, golden files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memory_recall.ingest.stbme import import_stbme
from memory_recall.model.graph import MemoryScope, Node, StoryTime, StoryTimeSpan
from memory_recall.model.state import MemoryGraph
from memory_recall.pipeline.result import (
    ExplanationModel,
    ExplanationPartModel,
    OmittedNode,
    RecallResult,
    ScopeBucketsModel,
    SelectedMemory,
)

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
NOW_MS = 1_800_000_000_000


def golden(name: str) -> str:
    """Golden text without the file's final newline."""
    return (GOLDEN / name).read_bytes().decode("utf-8").removesuffix("\n")


def fixture_graph(name: str) -> MemoryGraph:
    return import_stbme(ROOT / "fixtures" / "chats" / name / "graph.json", now_ms=NOW_MS)


def node(nid: str, type_: str = "event", *, scope: MemoryScope | None = None, time: str = "", tense: str = "unknown",
         span: tuple[str, str] = ("", ""), **fields: Any) -> dict[str, Any]:
    """A node dict as ``RecallResult.nodes`` holds it."""
    return Node(
        id=nid, type=type_, fields=fields, scope=scope or MemoryScope(),
        story_time=StoryTime(label=time, tense=tense),
        story_time_span=StoryTimeSpan(start_label=span[0], end_label=span[1]),
    ).model_dump(mode="json")


def char_pov(name: str) -> MemoryScope:
    return MemoryScope(layer="pov", owner_type="character", owner_id=name, owner_name=name)


def user_pov(name: str) -> MemoryScope:
    return MemoryScope(layer="pov", owner_type="user", owner_id=name, owner_name=name)


def selected(nid: str, score: float, rank: int = 1, type_: str = "event") -> SelectedMemory:
    expl = ExplanationModel(node_id=nid, score=score, score_kind="weighted_score",
                            parts=[ExplanationPartModel(name="graph", value=score, weight=1.0, contribution=score)])
    return SelectedMemory(rank=rank, node_id=nid, type=type_, label=nid, origin="score", score=score,
                          explanation=expl)


def make_result(
    nodes: list[dict[str, Any]],
    *,
    scores: dict[str, float] | None = None,
    core: list[str] = (),
    recall: list[str] = (),
    buckets: ScopeBucketsModel | None = None,
    summaries: list[dict[str, Any]] = (),
    omitted: list[OmittedNode] = (),
    meta: dict[str, Any] | None = None,
) -> RecallResult:
    """A :class:`RecallResult` holding exactly the given parts (the pipeline-only fields are blank)."""
    by_id = {n["id"]: n for n in nodes}
    scores = scores or {}
    return RecallResult(
        chat_id="chat", graph_version=1, user_message="", selected_node_ids=list(scores),
        selected=[selected(nid, s, rank, by_id[nid]["type"]) for rank, (nid, s) in enumerate(scores.items(), 1)],
        core_node_ids=list(core), recall_node_ids=list(recall), grouped_recall_node_ids={},
        summary_entries=list(summaries), scope_buckets=buckets or ScopeBucketsModel(), nodes=by_id,
        omitted=list(omitted), stats={}, final_owner_keys=[], final_owner_scores=[], final_owner_mode="unresolved",
        reinforced_node_ids=[], probabilistic_node_ids=[], retrieval_status="ok", semantic_search_used=False,
        failure_category="", llm_status="", meta=meta or {}, traces=[], timings={},
    )


def en_result() -> RecallResult:
    """English fixture recall: two Erin POVs (candidate label "Erin Vale"), one user POV, current region, global
    objective nodes, a result-level core-cap omission and a gate-suppressed core node."""
    g = fixture_graph("en-thornwick-manor")
    nodes = {n.id: n.model_dump(mode="json") for n in g.nodes}
    pick = ["pov-erin-crane-window", "pov-erin-household", "pov-wren-torn", "ev-marcus-confession", "char-marcus",
            "ev-crane-closed", "thread-pip-debt", "rule-will-attendance", "ev-burglar-theory"]
    return make_result(
        [nodes[i] for i in pick],
        scores={"pov-erin-crane-window": 0.9, "ev-marcus-confession": 0.8, "pov-erin-household": 0.7,
                "pov-wren-torn": 0.6, "char-marcus": 0.5, "ev-crane-closed": 0.4},
        core=["ev-marcus-confession", "ev-crane-closed", "thread-pip-debt", "rule-will-attendance",
              "ev-burglar-theory"],
        recall=["pov-erin-crane-window", "pov-erin-household", "pov-wren-torn", "char-marcus"],
        buckets=ScopeBucketsModel(
            characterPov=["pov-erin-crane-window", "pov-erin-household"],
            characterPovByOwner={"character:erin": ["pov-erin-crane-window", "pov-erin-household"]},
            characterPovOwnerOrder=["character:erin"], characterPovOwnerLabels={"character:erin": "Erin"},
            userPov=["pov-wren-torn"], objectiveCurrentRegion=["ev-marcus-confession", "char-marcus"],
            objectiveGlobal=["ev-crane-closed", "thread-pip-debt", "rule-will-attendance", "ev-burglar-theory"],
        ),
        summaries=[e.model_dump(mode="json") for e in g.summaries.active_entries()],
        omitted=[OmittedNode(node_id="ev-will-reading", reason="core-cap")],
        meta={"retrieval": {"gate_suppressed": ["ev-burglar-theory"]},
              "scopeContext": {"sceneOwnerCandidates": [{"ownerKey": "character:erin", "ownerName": "Erin Vale"}]}},
    )


def zh_result() -> RecallResult:
    """Chinese fixture recall: two character owners (labels from the node scopes), user POV, current region and
    global objective nodes of every table type."""
    g = fixture_graph("zh-bell-tower")
    nodes = {n.id: n.model_dump(mode="json") for n in g.nodes}
    ailin = ["pov-ailin-suspects-lucia", "pov-ailin-trusts-ye"]
    lucia = ["pov-lucia-guilt"]
    current = ["ev-guard-no-entry", "ev-two-keys", "loc-cellar"]
    glob = ["ev-ambush-plan", "thread-missing-children", "refl-midnight-signal", "rule-midnight-bell"]
    return make_result(
        [nodes[i] for i in [*ailin, *lucia, "pov-ye-torn", *current, *glob]],
        scores={"pov-ailin-suspects-lucia": 0.95, "ev-two-keys": 0.9, "pov-lucia-guilt": 0.85, "pov-ye-torn": 0.8,
                "pov-ailin-trusts-ye": 0.7, "loc-cellar": 0.6, "refl-midnight-signal": 0.5},
        core=["ev-guard-no-entry", "ev-two-keys", "ev-ambush-plan", "thread-missing-children",
              "rule-midnight-bell"],
        recall=[*ailin, *lucia, "pov-ye-torn", "loc-cellar", "refl-midnight-signal"],
        buckets=ScopeBucketsModel(
            characterPov=[*ailin, *lucia],
            characterPovByOwner={"character:艾琳": ailin, "character:露西亚": lucia},
            characterPovOwnerOrder=["character:艾琳", "character:露西亚"],
            userPov=["pov-ye-torn"], objectiveCurrentRegion=current, objectiveGlobal=glob,
        ),
        summaries=[e.model_dump(mode="json") for e in g.summaries.active_entries()],
    )
