"""``memory-recall eval``: offline recall evaluation on LoCoMo and on the roleplay fixtures.

Usage::

    memory-recall eval locomo locomo_dev.json --baselines --ablate diffusion --out eval-out
    memory-recall eval fixtures --out eval-fixtures
    main(["locomo", "locomo_dev.json", "--k", "5,10,25"])      # what the CLI calls

LoCoMo protocol (issue 7)
    * Graph: each conversation is ingested with :func:`~memory_recall.ingest.messages.ingest_messages` (the rules
      users run) into chat ``<sample_id>`` of the store in ``--data-dir`` (default: the usual data directory) and
      embedded with the configured embedder (the packaged local model by default) through
      :func:`~memory_recall.providers.cache.embed_missing`, so a second run embeds nothing.
    * ``now``: every time stamp (ingestion, snapshot, query) is the date of the conversation's last session.
      LoCoMo's dates are years old; with the wall clock as ``now`` every turn would sit at the far end of the
      time decay. A user asking right after the last session is what the benchmark models.
    * Question: asked as the user turn after the last session (``user_floor`` = number of turns), through one
      controller a host uses: :func:`controller_recall` sends a ``RecallRequest`` (the final session's turns plus
      the question as the next user floor, ``persist=False`` so no record is written and nothing is reinforced)
      to :meth:`RecallController.run_recall`, which keeps its ``controller.recent_context_messages`` last lines as
      the recent context; ``--no-context`` sends the question alone. Tests may inject a :data:`RecallFn` instead
      (:func:`pipeline_recall` calls :func:`~memory_recall.pipeline.retrieve.retrieve` directly).
    * Units: ``message`` nodes, mapped to dia_ids through ``node.evidence``; other selected nodes (characters,
      entities) are skipped when cutting the top k. The pipeline normally selects ``max_recall_nodes`` (12)
      nodes; to rank k = 25 turns the evaluation raises the selection sizes through settings overrides
      (:func:`eval_overrides`: ``selection.max_recall_nodes`` = min(200, 2 × max k), ``selection.top_k`` ≥ that,
      ``rerank.enabled`` false) and ranks by the pipeline's final selection order.
    * Honesty: the recall function sees the question text, the recent turns and ``now``; answers, evidence and
      categories are only read when scoring.
    * Baselines (``--baselines``): ``bm25``, ``dense`` and ``rrf`` (k = 60) over the same message units, same
      store and embedder, from the question text alone (identical with and without ``--no-context``).
    * Ablations (``--ablate STAGE``…): the full pipeline with that stage off (``retrieve(..., ablate={stage})``),
      reported as ``no-<stage>``.

Outputs in ``--out`` (default ``eval-out``): ``metrics.json`` (the shape of issue 7), ``details.json``
(latency without query embedding, questions without evidence, settings overrides, ``now`` per chat),
``report.md`` and ``recall_at_k.png``.

Fixtures protocol (``eval fixtures``)
    Each ``<root>/<name>/graph.json`` (``--root``, default ``fixtures/chats`` of the current directory) is imported
    with :func:`~memory_recall.ingest.stbme.import_stbme` into chat ``fixture-<name>`` of a temporary store
    (removed afterwards; ``--data-dir`` names a store to use instead), embedded, and every question of
    ``questions.json`` is recalled with its
    ``recent`` lines, ``active_region`` and ``active_owners``; ``now`` = the newest node time + 1 minute.
    Units are all node ids. Metrics: recall@k of ``expected``, and the must-not leak rate@k (fraction of
    questions with a ``must_not`` id among the top k). The summary is printed; ``metrics.json``,
    ``details.json`` and ``report.md`` are written only into ``--out`` when it is given.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memory_recall.errors import InputError, MemoryRecallError
from memory_recall.eval.baselines import bm25_ranking, dense_ranking, rrf
from memory_recall.eval.metrics import QuestionOutcome, latency_without_embedding, recall_at_k, summarise
from memory_recall.pipeline.retrieve import STAGE_ORDER, retrieve
from memory_recall.pipeline.state import Providers, RecallQuery
from memory_recall.settings import RecallSettings
from memory_recall.store.snapshot import GraphSnapshot

__all__ = [
    "DEFAULT_KS",
    "EvalChat",
    "EvalQuestion",
    "RecallFn",
    "eval_overrides",
    "main",
    "pipeline_recall",
    "run_fixtures",
    "run_locomo",
]

DEFAULT_KS: tuple[int, ...] = (5, 10, 25)
FULL = "memory-recall"

#: ``recall_fn(snapshot, query, settings, providers, ablate) -> node ids in final order``.
RecallFn = Callable[[GraphSnapshot, RecallQuery, RecallSettings, Providers, frozenset[str]], Sequence[str]]


def pipeline_recall(
    snapshot: GraphSnapshot,
    query: RecallQuery,
    settings: RecallSettings,
    providers: Providers,
    ablate: frozenset[str],
) -> list[str]:
    """The default :data:`RecallFn`: :func:`retrieve`'s selected node ids, in selection order."""
    return list(retrieve(snapshot, query, settings, providers, ablate=ablate).selected_node_ids)


def controller_recall(
    chat: EvalChat,
    question: EvalQuestion,
    settings: RecallSettings,
    embedder: Any,
    ablate: frozenset[str],
    cache: Any,
) -> list[str]:
    """The default path: one :class:`~memory_recall.controller.RecallRequest` through
    :meth:`RecallController.run_recall`, exactly as a host asks, with ``persist=False`` (no record read or written,
    no access reinforcement: question order cannot change later results). The question is the last user floor of
    ``question.messages``; the controller builds the recent-context lines from the messages before it."""
    from functools import partial

    from memory_recall.controller import RecallController, RecallRequest

    controller = RecallController(
        chat.store, settings, embedder=embedder, snapshot_cache=cache, pipeline=partial(retrieve, ablate=ablate),
    )
    floor = question.messages[-1].floor
    response = controller.run_recall(RecallRequest(
        chat_id=chat.chat_id, messages=list(question.messages), target_user_floor=floor,
        now_ms=question.query.now_ms, persist=False,
    ))
    if response.status != "completed":
        raise MemoryRecallError(f"recall of {question.qid} ended {response.status}: {response.reason}")
    return list(response.selected_node_ids)


def eval_overrides(max_k: int, settings: RecallSettings) -> dict[str, dict[str, Any]]:
    """Selection sizes large enough to rank ``max_k`` units (twice as many nodes: non-unit nodes such as
    characters and entities take selection slots too), LLM rerank off."""
    nodes = min(200, 2 * max_k)
    return {
        "selection": {"max_recall_nodes": nodes, "top_k": max(settings.selection.top_k, nodes)},
        "rerank": {"enabled": False},
    }


class _TimedEmbedder:
    """Wraps an embedder and adds the time spent in ``embed_query`` to ``spent_ms``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.spent_ms = 0.0

    @property
    def model_id(self) -> str:
        return str(self.inner.model_id)

    @property
    def dim(self) -> int:
        return int(self.inner.dim)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self.inner.embed_passages(texts))

    def embed_query(self, text: str) -> np.ndarray:
        start = time.perf_counter()
        try:
            return np.asarray(self.inner.embed_query(text))
        finally:
            self.spent_ms += (time.perf_counter() - start) * 1000.0


@dataclass(frozen=True)
class EvalQuestion:
    """One question as the recall function sees it (``query``) plus what only scoring reads."""

    chat_id: str
    query: RecallQuery
    relevant: tuple[str, ...]
    category: int = 0
    must_not: tuple[str, ...] = ()
    qid: str = ""
    #: The request's chat messages for the controller path (recent turns + the question as the last user floor).
    messages: tuple[Any, ...] = ()


@dataclass
class EvalChat:
    """One prepared chat: its snapshot, the unit id of each ranked node, the lexical index, the unit vectors."""

    chat_id: str
    snapshot: GraphSnapshot
    now_ms: int
    unit_of: dict[str, str]
    search: Callable[[list[str], int], list[tuple[str, float]]]
    unit_ids: list[str] = field(default_factory=list)  # node ids of units with a vector (dense baseline)
    unit_vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    store: Any = None  # the store the controller path reads (None: only an injected recall function can run)


def _units(ranked_nodes: Iterable[str], unit_of: Mapping[str, str], depth: int) -> tuple[str, ...]:
    out: dict[str, None] = {}
    for node_id in ranked_nodes:
        unit = unit_of.get(node_id)
        if unit is not None:
            out.setdefault(unit, None)
            if len(out) >= depth:
                break
    return tuple(out)


def _progress(total: int, quiet: bool, desc: str) -> Any:
    from memory_recall.cli_common import terminal_bars

    return terminal_bars(quiet)(desc, total, "q")


def _prepare_chat(
    store: Any, chat_id: str, embedder: Any, now_ms: int, unit_type: str | None, quiet: bool = True
) -> EvalChat:
    from memory_recall.cli_common import EMBED_CHUNK, embed_chat, terminal_bars
    from memory_recall.store.snapshot import build_snapshot

    if embedder is not None:
        # Embedding a LoCoMo conversation takes minutes: its own bar (nodes, committed chunk by chunk).
        embed_chat(store, chat_id, embedder, bars=terminal_bars(quiet), chunk=EMBED_CHUNK)
    model_id = embedder.model_id if embedder is not None else ""
    snap = build_snapshot(store.snapshot_source(chat_id, model_id), now_ms=now_ms)
    unit_of: dict[str, str] = {}
    rows: list[int] = []
    for i, node_id in enumerate(snap.ids):
        if snap.archived[i]:
            continue
        if unit_type is None:
            unit_of[node_id] = node_id
        elif snap.type_of(i) == unit_type:
            evidence = snap.node(i).evidence
            if not evidence:
                continue
            unit_of[node_id] = evidence[0]
        else:
            continue
        if snap.embeddings.shape[0] and snap.has_vector[i]:
            rows.append(i)
    chat = EvalChat(
        chat_id=chat_id,
        snapshot=snap,
        now_ms=now_ms,
        unit_of=unit_of,
        search=lambda terms, limit, **kw: store.bm25(chat_id, terms, limit, **kw),
        unit_ids=[snap.ids[i] for i in rows],
        unit_vectors=snap.embeddings[rows] if rows else np.zeros((0, max(snap.dim, 1)), np.float32),
        store=store,
    )
    return chat


def _evaluate(
    chats: Mapping[str, EvalChat],
    questions: Sequence[EvalQuestion],
    *,
    ks: Sequence[int],
    settings: RecallSettings,
    embedder: Any,
    baselines: bool,
    ablate: Sequence[str],
    recall_fn: RecallFn | None,
    quiet: bool,
) -> dict[str, list[QuestionOutcome]]:
    """Every system's outcome for every question (systems in report order)."""
    depth = _depth(ks)
    timed = _TimedEmbedder(embedder) if embedder is not None else None
    systems: list[tuple[str, frozenset[str]]] = [(FULL, frozenset())]
    systems += [(f"no-{stage}", frozenset({stage})) for stage in ablate]
    n_runs = len(systems) + (1 if baselines else 0)
    outcomes: dict[str, list[QuestionOutcome]] = {name: [] for name, _ in systems}
    if baselines:
        for name in ("bm25", "dense", "rrf"):
            outcomes[name] = []
    from memory_recall.store.snapshot import SnapshotCache

    cache = SnapshotCache()  # one snapshot per chat, shared by every system (nothing is written between questions)
    bar = _progress(len(questions) * n_runs, quiet, "recall")
    try:
        for q in questions:
            chat = chats[q.chat_id]
            providers = Providers(embedder=timed, lexical_index=chat.search)
            for name, ablated in systems:
                if timed is not None:
                    timed.spent_ms = 0.0
                start = time.perf_counter()
                if recall_fn is None:
                    ranked = controller_recall(chat, q, settings, timed, ablated, cache)
                else:
                    ranked = list(recall_fn(chat.snapshot, q.query, settings, providers, ablated))
                took = (time.perf_counter() - start) * 1000.0
                spent = timed.spent_ms if timed is not None else 0.0
                outcomes[name].append(QuestionOutcome(
                    _units(ranked, chat.unit_of, depth), q.relevant, q.category, took, max(0.0, took - spent)
                ))
                bar.update(1)
            if baselines:
                _run_baselines(chat, q, embedder, depth, outcomes)
                bar.update(1)
    finally:
        bar.close()
    return outcomes


def _run_baselines(
    chat: EvalChat, q: EvalQuestion, embedder: Any, depth: int, outcomes: dict[str, list[QuestionOutcome]]
) -> None:
    text = q.query.user_message
    fused_depth = max(depth, 100)  # RRF fuses deeper lists than it reports, as fusion is meant to
    start = time.perf_counter()
    lexical = bm25_ranking(chat.search, text, chat.unit_of.keys(), fused_depth)
    t_bm25 = (time.perf_counter() - start) * 1000.0
    start = time.perf_counter()
    dense: list[str] = []
    embed_ms = 0.0
    if embedder is not None:
        vector = embedder.embed_query(text)
        embed_ms = (time.perf_counter() - start) * 1000.0
        dense = dense_ranking(vector, chat.unit_ids, chat.unit_vectors, fused_depth)
    t_dense = (time.perf_counter() - start) * 1000.0
    start = time.perf_counter()
    fused = [uid for uid, _ in rrf([lexical, dense])]
    t_rrf = (time.perf_counter() - start) * 1000.0 + t_bm25 + t_dense
    for name, ranked, took, spent in (
        ("bm25", lexical, t_bm25, 0.0),
        ("dense", dense, t_dense, embed_ms),
        ("rrf", fused, t_rrf, embed_ms),
    ):
        outcomes[name].append(QuestionOutcome(
            _units(ranked, chat.unit_of, depth), q.relevant, q.category, took, max(0.0, took - spent)
        ))


# ---------------------------------------------------------------------------------------------------------------
# LoCoMo
# ---------------------------------------------------------------------------------------------------------------


def _final_session(messages: Sequence[Any]) -> list[Any]:
    """The messages of the final session (LoCoMo's ``session`` extra)."""
    if not messages:
        return []
    session = messages[-1].extra.get("session")
    return [m for m in messages if m.extra.get("session") == session]


def _context_lines(messages: Sequence[Any], count: int) -> tuple[str, ...]:
    """The last ``count`` turns of the final session as ``[user]: …`` / ``[assistant]: …`` lines."""
    if not messages or count <= 0:
        return ()
    session = messages[-1].extra.get("session")
    final = [m for m in messages if m.extra.get("session") == session]
    return tuple(f"[{m.role}]: {m.text}" for m in final[-count:])


def run_locomo(
    path: str | Path,
    *,
    ks: Sequence[int] = DEFAULT_KS,
    baselines: bool = False,
    ablate: Sequence[str] = (),
    out: str | Path = "eval-out",
    limit_questions: int | None = None,
    context: bool = True,
    data_dir: str | Path | None = None,
    settings: RecallSettings | None = None,
    embedder: Any = "default",
    recall_fn: RecallFn | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Run the LoCoMo evaluation (see the module docstring); writes the outputs and returns ``metrics.json``."""
    from memory_recall.ingest.locomo import load_locomo
    from memory_recall.ingest.messages import ingest_messages, parse_message_date
    from memory_recall.model.chat import ChatMessage
    from memory_recall.store import Store, default_data_dir

    ks = _check_ks(ks)
    _check_ablate(ablate)
    conversations = load_locomo(path)  # a missing or bad file fails before anything is created
    out_dir = _out_dir(out)
    base = settings or RecallSettings()
    eval_settings = base.with_overrides(eval_overrides(_depth(ks), base))
    if embedder == "default":
        embedder = _default_embedder(base)
    # Like every command: --data-dir, else the settings' store.data_dir, else the default data directory.
    store = Store.open(default_data_dir(data_dir or base.store.data_dir or None))
    try:
        chats: dict[str, EvalChat] = {}
        questions: list[EvalQuestion] = []
        without_evidence = 0
        for conv in conversations:
            if limit_questions is not None and len(questions) >= limit_questions:
                break
            dates = [parse_message_date(m.date) for m in conv.messages if m.date]
            now_ms = max((d for d in dates if d is not None), default=0) or int(time.time() * 1000)
            chat_id = conv.sample_id
            ingest_messages(store, chat_id, conv.messages, now_ms=now_ms)
            chats[chat_id] = _prepare_chat(store, chat_id, embedder, now_ms, "message", quiet)
            recent = _context_lines(conv.messages, base.query_plan.recent_context_messages) if context else ()
            # The controller path gets the final session's turns (it keeps controller.recent_context_messages of
            # them as context lines) and the question as the next user floor.
            prior = _final_session(conv.messages) if context else []
            for i, item in enumerate(conv.questions):
                if limit_questions is not None and len(questions) >= limit_questions:
                    break
                without_evidence += not item.evidence
                questions.append(EvalQuestion(
                    chat_id=chat_id,
                    query=RecallQuery(
                        user_message=item.question, recent_lines=recent, now_ms=now_ms, chat_id=chat_id,
                        user_floor=len(conv.messages),
                    ),
                    relevant=item.evidence,
                    category=item.category,
                    qid=f"{chat_id}#{i}",
                    messages=(*prior, ChatMessage(floor=len(conv.messages), role="user", text=item.question)),
                ))
        outcomes = _evaluate(
            chats, questions, ks=ks, settings=eval_settings, embedder=embedder, baselines=baselines,
            ablate=ablate, recall_fn=recall_fn, quiet=quiet,
        )
    finally:
        store.close()
    metrics = {
        "dataset": Path(path).name,
        "unit": "turn",
        "questions": len(questions),
        "k": list(ks),
        "systems": {name: summarise(rows, ks) for name, rows in outcomes.items()},
    }
    details = {
        "profile": base.profile,
        "context": "last turns of the final session" if context else "none (--no-context)",
        "recent_context_messages": base.query_plan.recent_context_messages if context else 0,
        "questions_without_evidence": without_evidence,
        "settings_overrides": eval_overrides(_depth(ks), base),
        "now_ms": {cid: chat.now_ms for cid, chat in chats.items()},
        "embedder": getattr(embedder, "model_id", None),
        "latency_ms_without_query_embedding": {
            name: latency_without_embedding(rows) for name, rows in outcomes.items()
        },
    }
    _write_outputs(out_dir, metrics, details, outcomes, questions)
    return metrics


# ---------------------------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------------------------


def run_fixtures(
    root: str | Path = "fixtures/chats",
    *,
    ks: Sequence[int] = DEFAULT_KS,
    out: str | Path | None = None,
    data_dir: str | Path | None = None,
    settings: RecallSettings | None = None,
    embedder: Any = "default",
    recall_fn: RecallFn | None = pipeline_recall,
    quiet: bool = False,
) -> dict[str, Any]:
    """Run the fixture evaluation (see the module docstring) and return ``metrics.json``'s content.

    The chats go into a temporary store unless ``data_dir`` names one; ``metrics.json``, ``details.json`` and
    ``report.md`` are written into ``out`` only when it is given (nothing is written otherwise). Raises
    :class:`InputError` naming ``--root`` when ``root`` holds no fixture and ``--out`` when it cannot be written.
    """
    import tempfile

    from memory_recall.ingest.stbme import import_stbme
    from memory_recall.store import Store

    ks = _check_ks(ks)
    root_dir = Path(root)
    if not root_dir.is_dir():
        raise InputError("--root", f"no directory {str(root_dir)!r} (run from the repository root or pass --root DIR)")
    dirs = sorted(p for p in root_dir.iterdir() if (p / "questions.json").is_file() and (p / "graph.json").is_file())
    if not dirs:
        raise InputError("--root", f"no fixture with graph.json and questions.json under {str(root_dir)!r}")
    out_dir = _out_dir(out) if out is not None else None
    base = settings or RecallSettings()
    eval_settings = base.with_overrides(eval_overrides(_depth(ks), base))
    if embedder == "default":
        embedder = _default_embedder(base)
    with tempfile.TemporaryDirectory(prefix="memory-recall-eval-") as scratch:
        store = Store.open(data_dir if data_dir is not None else scratch)
        try:
            chats, questions = _fixture_chats(store, dirs, embedder, quiet, import_stbme)
            outcomes = _evaluate(
                chats, questions, ks=ks, settings=eval_settings, embedder=embedder, baselines=False, ablate=(),
                recall_fn=recall_fn, quiet=quiet,
            )[FULL]
        finally:
            store.close()
    return _fixture_metrics(questions, outcomes, ks, base, out_dir)


def _fixture_chats(
    store: Any, dirs: Sequence[Path], embedder: Any, quiet: bool, import_stbme: Callable[..., Any]
) -> tuple[dict[str, EvalChat], list[EvalQuestion]]:
    chats: dict[str, EvalChat] = {}
    questions: list[EvalQuestion] = []
    for d in dirs:
        chat_id = f"fixture-{d.name}"
        graph = import_stbme(d / "graph.json", now_ms=0)
        with store.write(chat_id) as w:
            w.replace_graph(graph)
        times = [n.created_time for n in graph.nodes if n.created_time]
        now_ms = int(max(times, default=0)) + 60_000
        chats[chat_id] = _prepare_chat(store, chat_id, embedder, now_ms, None, quiet)
        for item in json.loads((d / "questions.json").read_text(encoding="utf-8")):
            owners = item.get("active_owners")
            questions.append(EvalQuestion(
                chat_id=chat_id,
                query=RecallQuery(
                    user_message=item["input"], recent_lines=tuple(item.get("recent", ())), now_ms=now_ms,
                    chat_id=chat_id, active_region=item.get("active_region", ""),
                    active_owner_keys=tuple(owners) if owners else None,
                ),
                relevant=tuple(item.get("expected", ())),
                must_not=tuple(item.get("must_not", ())),
                qid=f"{d.name}/{item['id']}",
            ))
    return chats, questions


def _fixture_metrics(
    questions: Sequence[EvalQuestion],
    outcomes: Sequence[QuestionOutcome],
    ks: Sequence[int],
    base: RecallSettings,
    out_dir: Path | None,
) -> dict[str, Any]:
    system = summarise(outcomes, ks)
    system.pop("recall_excluding_adversarial")
    system.pop("recall_by_category")
    system["must_not_leak"] = {
        str(k): float(np.mean([bool(set(q.must_not) & set(o.ranked[:k])) for q, o in zip(questions, outcomes,
                                                                                      strict=True)]))
        for k in ks
    }
    per_question: list[dict[str, Any]] = [
        {
            "id": q.qid,
            "recall": {str(k): recall_at_k(o.ranked, q.relevant, k) for k in ks},
            "leaked": sorted(set(q.must_not) & set(o.ranked)),
            "ranked": list(o.ranked),
        }
        for q, o in zip(questions, outcomes, strict=True)
    ]
    metrics = {
        "dataset": "fixtures",
        "unit": "node",
        "questions": len(questions),
        "k": list(ks),
        "systems": {FULL: system},
    }
    if out_dir is None:
        return metrics
    _dump(out_dir / "metrics.json", metrics)
    _dump(out_dir / "details.json", {"questions": per_question, "settings_overrides": eval_overrides(_depth(ks), base)})
    lines = [f"# memory-recall fixture evaluation ({len(questions)} questions)", ""]
    lines += ["| k | recall@k | recall_all@k | must-not leak@k |", "|---|---|---|---|"]
    for k in ks:
        lines.append(
            f"| {k} | {system['recall'][str(k)]:.3f} | {system['recall_all'][str(k)]:.3f} "  # type: ignore[index]
            f"| {system['must_not_leak'][str(k)]:.3f} |"  # type: ignore[index]
        )
    lines += ["", f"nDCG@10 {system['ndcg@10']:.3f}, MRR {system['mrr']:.3f}", ""]
    lines += ["| question | " + " | ".join(f"R@{k}" for k in ks) + " | leaked |", "|---" * (len(ks) + 2) + "|"]
    for row in per_question:
        cells = " | ".join(f"{row['recall'][str(k)]:.2f}" for k in ks)
        lines.append(f"| {row['id']} | {cells} | {', '.join(row['leaked']) or '—'} |")
    (out_dir / "report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return metrics


# ---------------------------------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------------------------------


def _out_dir(out: str | Path) -> Path:
    """The output directory, created now (before any work: a bad ``--out`` costs no run); an existing file or an
    uncreatable directory raises :class:`InputError` naming ``--out``."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise InputError("--out", f"{str(path)!r} is a file; name a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError("--out", f"cannot create directory {str(path)!r}: {exc.strerror or exc}") from None
    return path


def _dump(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_outputs(
    out: Path,
    metrics: dict[str, Any],
    details: dict[str, Any],
    outcomes: Mapping[str, Sequence[QuestionOutcome]],
    questions: Sequence[EvalQuestion],
) -> None:
    from memory_recall.eval.report import plot_recall, render_report

    _dump(out / "metrics.json", metrics)
    _dump(out / "details.json", details)
    with (out / "rankings.jsonl").open("w", encoding="utf-8") as fh:
        for i, q in enumerate(questions):
            row = {
                "id": q.qid, "category": q.category, "evidence": list(q.relevant),
                "ranked": {name: list(rows[i].ranked) for name, rows in outcomes.items()},
            }
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    (out / "report.md").write_text(render_report(metrics, details), encoding="utf-8")
    plot_recall(metrics, out / "recall_at_k.png")


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------


def _depth(ks: Sequence[int]) -> int:
    """How many units each system ranks: the largest k, and at least 10 for nDCG@10 (MRR is MRR@depth)."""
    return max(*ks, 10)


def _check_ks(ks: Sequence[int]) -> tuple[int, ...]:
    values = tuple(sorted(set(ks)))
    if not values or any(isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 100 for k in values):
        raise InputError("k", f"must be ints in the range [1, 100]. Got {list(ks)!r} instead.")
    return values


def _check_ablate(ablate: Sequence[str]) -> None:
    unknown = [s for s in ablate if s not in STAGE_ORDER]
    if unknown:
        raise InputError("ablate", f"unknown stage(s) {', '.join(unknown)}; expected names from {STAGE_ORDER}")


def _default_embedder(settings: RecallSettings) -> Any:
    from memory_recall.providers.embedding import make_embedder

    embedder = make_embedder(settings.embedding)
    if embedder is None:
        raise InputError("embedding", "no embedder configured (install the 'local' extra): the evaluation needs one")
    return embedder


def _parse_ks(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated ints. Got {text!r} instead.") from None


def _parser() -> argparse.ArgumentParser:
    from memory_recall.cli_common import OneLineParser

    parser = OneLineParser(prog="memory-recall eval", description="Offline recall evaluation.")
    sub = parser.add_subparsers(dest="target", required=True)
    loc = sub.add_parser("locomo", help="evidence-turn recall on a LoCoMo file")
    loc.add_argument("path")
    loc.add_argument("--k", type=_parse_ks, default=DEFAULT_KS, help="cut-offs, e.g. 5,10,25")
    loc.add_argument("--baselines", action="store_true", help="also run bm25, dense and rrf")
    loc.add_argument("--ablate", nargs="+", action="extend", default=[], metavar="STAGE",
                     help=f"stages to switch off one at a time ({', '.join(STAGE_ORDER)})")
    loc.add_argument("--out", default="eval-out")
    loc.add_argument("--limit-questions", type=int, default=None)
    loc.add_argument("--no-context", action="store_true", help="ask each question without recent turns")
    loc.add_argument("--data-dir", default=None, help="store directory (default: the usual data directory)")
    loc.add_argument("--config", default=None, help="settings TOML file")
    loc.add_argument("--profile", default=None,
                     help="settings profile (default, app, fallback, transcript); without it: default")
    loc.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    fix = sub.add_parser("fixtures", help="recall of the expected memories of fixtures/chats")
    fix.add_argument("--root", default="fixtures/chats", help="fixture chats directory (default: fixtures/chats)")
    fix.add_argument("--k", type=_parse_ks, default=DEFAULT_KS)
    fix.add_argument("--out", default=None, help="write metrics.json, details.json, report.md here (default: none)")
    fix.add_argument("--data-dir", default=None, help="store to import the fixtures into (default: a temporary one)")
    fix.add_argument("--config", default=None)
    fix.add_argument("--profile", default=None)
    fix.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    return parser


def _print_summary(metrics: Mapping[str, Any]) -> None:
    ks = metrics["k"]
    print(f"{metrics['dataset']}: {metrics['questions']} questions")
    for name, system in metrics["systems"].items():
        cells = "  ".join(f"R@{k} {system['recall'][str(k)]:.3f}" for k in ks)
        print(f"  {name:<24} {cells}  nDCG@10 {system['ndcg@10']:.3f}  MRR {system['mrr']:.3f}  "
              f"p50 {system['latency_ms']['p50']:.0f} ms")


def main(argv: Sequence[str] | None = None) -> int:
    """``memory-recall eval locomo PATH …`` / ``memory-recall eval fixtures …``; returns the exit status."""
    from memory_recall.settings import load_settings

    args = _parser().parse_args(argv)
    try:
        settings = load_settings(args.config, profile=args.profile)
        if args.target == "locomo":
            if args.limit_questions is not None and args.limit_questions < 1:
                raise InputError("limit-questions", f"must be ≥ 1. Got {args.limit_questions} instead.")
            metrics = run_locomo(
                args.path, ks=args.k, baselines=args.baselines, ablate=args.ablate, out=args.out,
                limit_questions=args.limit_questions, context=not args.no_context, data_dir=args.data_dir,
                settings=settings, quiet=args.quiet,
            )
        else:
            metrics = run_fixtures(
                args.root, ks=args.k, out=args.out, data_dir=args.data_dir, settings=settings, quiet=args.quiet
            )
    except MemoryRecallError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _print_summary(metrics)
    if args.out is not None:
        print(f"outputs in {args.out}")
    return 0

