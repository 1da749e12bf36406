"""POV stress run: every scene of ``fixtures/pov-stress`` through the controller, per-scene table, leaks by kind
and by route.

Each ``fixtures/pov-stress/<name>/`` holds ``graph.json`` (an ST-BME export) and ``scenes.json``: per scene the
user message, the knowledge owner (``active_owners``), the persona (``user_owner``), the active region, the
``expect`` list (memories the scene should recall) and the ``forbid`` list (every memory the scene's character
does not know or must not see: secrets, other characters' POV, mistaken and hidden nodes) with each one's
kind in ``forbid_kind``. Every scene is one :class:`~memory_recall.controller.RecallRequest` on the default
settings (``persist=False``), exactly as a host asks.

A scene **hits** when an ``expect`` id is selected or printed in the block. A **leak** is a ``forbid`` id that
is selected or printed; its route is the selection origin (``score``, ``llm``, ``owner-pov``,
``scene-reconstruction``, ``probabilistic``) when it was selected, else ``core`` (an always-inject row of the
block), and its gate verdict the explanation's ``knowledge_mode`` (``unselected`` for a core row: the block
does not carry the verdict of a node it was not given as a selection).

Embedders (``--embedder``, repeatable): ``local`` (the packaged multilingual-e5-small) and ``centred`` — the
same vectors with the mean of a fixed set of generic sentences subtracted before normalising, an embedder of
another similarity spread (e5's unrelated pairs score 0.8–0.9; centred ones about 0–0.4), so a threshold
that means the same under both must give the same verdicts. ``compressed`` maps every cosine c to
(1 + c) / 2 (a constant extra dimension): spread halved.

Usage::

    python scripts/pov_stress.py                       # both fixtures, local + centred embedders
    python scripts/pov_stress.py --embedder local --json out.json

Prints the per-scene table, the summary (hits, leaks by kind, by route, by gate verdict) per embedder and the
calibration figures of each scene (the query's median cosine m over the chat and the calibrated scale 1 − m,
from the scoring trace's ``rescueCalibration``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "pov-stress"

#: Generic sentences (both languages) whose mean e5 vector the ``centred`` embedder subtracts: it carries the
#: component every e5 vector shares, which is what lifts unrelated pairs to 0.8+.
_GENERIC = (
    "The weather was cold this morning.", "She bought bread at the market.", "He wrote a letter to his friend.",
    "The meeting was moved to Tuesday.", "A dog barked in the street.", "They talked about the old days.",
    "The road to the city is long.", "Someone knocked at the door.",
    "今天早上天气很冷。", "她在集市上买了面包。", "他给朋友写了一封信。", "会议改到了星期二。",
    "街上有一条狗在叫。", "他们聊起了过去的日子。", "去城里的路很远。", "有人在敲门。",
)


class TransformedEmbedder:
    """The local embedder's vectors under a fixed transform, with its own model id (vectors of two models are
    never mixed). ``centred``: v − mean(generic), renormalised. ``compressed``: [v, 1] / √2, so every cosine c
    becomes (1 + c) / 2."""

    def __init__(self, inner: Any, kind: str) -> None:
        self.inner = inner
        self.kind = kind
        self._mean: np.ndarray | None = None

    @property
    def model_id(self) -> str:
        return f"test:{self.kind}-{self.inner.model_id}"

    @property
    def dim(self) -> int:
        return int(self.inner.dim) + (1 if self.kind == "compressed" else 0)

    def _apply(self, vecs: np.ndarray) -> np.ndarray:
        vecs = np.asarray(vecs, dtype=np.float32).reshape(-1, int(self.inner.dim))
        if self.kind == "compressed":
            out = np.hstack([vecs, np.ones((vecs.shape[0], 1), np.float32)]) / np.float32(np.sqrt(2.0))
        else:
            if self._mean is None:
                self._mean = np.asarray(self.inner.embed_passages(list(_GENERIC)), np.float32).mean(axis=0)
            out = vecs - self._mean
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return (out / np.maximum(norms, 1e-12)).astype(np.float32)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._apply(self.inner.embed_passages(texts))

    def embed_query(self, text: str) -> np.ndarray:
        return self._apply(self.inner.embed_query(text))[0]


def _block_ids(blocks: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Node id → section of every node printed in the block."""
    out: dict[str, str] = {}
    for block in blocks:
        for table in block.get("tables", ()):
            for nid in table.get("node_ids", ()):
                out.setdefault(nid, str(block.get("section", "")))
    return out


def run_fixture(fixture: Path, embedder: Any, store_dir: Path) -> list[dict[str, Any]]:
    """Every scene of one fixture through the controller: one result row per scene."""
    from memory_recall.cli_common import EMBED_CHUNK, embed_chat, terminal_bars
    from memory_recall.controller import RecallController, RecallRequest
    from memory_recall.ingest.stbme import import_stbme
    from memory_recall.model.chat import ChatMessage
    from memory_recall.settings import RecallSettings
    from memory_recall.store import Store

    store = Store.open(store_dir)
    chat_id = f"pov-{fixture.name}"
    graph = import_stbme(fixture / "graph.json", now_ms=0)
    with store.write(chat_id) as w:
        w.replace_graph(graph)
    embed_chat(store, chat_id, embedder, bars=terminal_bars(True), chunk=EMBED_CHUNK)
    now = int(max(n.created_time for n in graph.nodes)) + 60_000
    names = {k: e.owner_name for k, e in graph.knowledge.owners.items()}
    controller = RecallController(store, RecallSettings(), embedder=embedder)
    rows = []
    try:
        for scene in json.loads((fixture / "scenes.json").read_text(encoding="utf-8")):
            response = controller.run_recall(RecallRequest(
                chat_id=chat_id, messages=[ChatMessage(floor=0, role="user", text=scene["input"])],
                target_user_floor=0, now_ms=now, persist=False, active_region=scene["active_region"],
                active_owner_keys=scene["active_owners"],
                active_user_pov_owner=names.get(scene["user_owner"], ""),
            ))
            if response.status != "completed":
                raise SystemExit(f"{fixture.name}/{scene['id']}: recall ended {response.status}: {response.reason}")
            selected = {s["node_id"]: s for s in response.selected}
            printed = _block_ids(response.blocks)
            seen = set(selected) | set(printed)
            leaks = []
            for nid in scene["forbid"]:
                if nid not in seen:
                    continue
                sel = selected.get(nid)
                route = str(sel["origin"]) if sel else "core"
                mode = str(sel["explanation"]["notes"].get("knowledge_mode", "")) if sel else "unselected"
                leaks.append({"id": nid, "kind": scene["forbid_kind"][nid], "route": route, "mode": mode,
                              "in_block": nid in printed, "selected": sel is not None})
            meta = response.traces
            calib = next((t.get("notes", {}).get("rescueCalibration") for t in meta if t.get("name") == "scoring"),
                         None)
            rows.append({
                "fixture": fixture.name, "scene": scene["id"], "owner": scene["active_owners"][0],
                "input": scene["input"], "hit": any(e in seen for e in scene["expect"]),
                "expect": scene["expect"], "leaks": leaks, "selected": list(selected), "sections": sorted(
                    set(printed.values())), "user_pov_rows": sum(1 for s in printed.values() if s == "user_pov"),
                "calibration": calib,
            })
    finally:
        store.close()
    return rows


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    leaks = [leak for r in rows for leak in r["leaks"]]
    return {
        "scenes": len(rows),
        "hits": sum(r["hit"] for r in rows),
        "scenes_with_leaks": sum(1 for r in rows if r["leaks"]),
        "leaks": len(leaks),
        "by_kind": dict(sorted(Counter(leak["kind"] for leak in leaks).items())),
        "by_route": dict(sorted(Counter(leak["route"] for leak in leaks).items())),
        "by_mode": dict(sorted(Counter(leak["mode"] for leak in leaks).items())),
        "scenes_with_user_pov_section": sum(1 for r in rows if r["user_pov_rows"]),
    }


def _print(label: str, rows: Sequence[dict[str, Any]]) -> None:
    print(f"\n## embedder {label}\n")
    print("| scene | owner | hit | leaks (id kind/route/mode) | user-POV rows |")
    print("|---|---|---|---|---|")
    for r in rows:
        leaks = ", ".join(f"{x['id']} {x['kind']}/{x['route']}/{x['mode']}" for x in r["leaks"]) or "—"
        print(f"| {r['fixture']}/{r['scene']} | {r['owner']} | {'yes' if r['hit'] else 'NO'} | {leaks} | "
              f"{r['user_pov_rows']} |")
    s = summarise(rows)
    print(f"\nscenes {s['scenes']}, expected memory reached {s['hits']}/{s['scenes']} "
          f"({100.0 * s['hits'] / max(1, s['scenes']):.1f} %), leaks {s['leaks']} in {s['scenes_with_leaks']} scenes, "
          f"user-POV section in {s['scenes_with_user_pov_section']} scenes")
    print(f"leaks by kind: {s['by_kind']}\nleaks by route: {s['by_route']}\nleaks by gate verdict: {s['by_mode']}")
    cal = [r["calibration"] for r in rows if r.get("calibration")]
    if cal:
        print("calibration (per scene: the query's median cosine m over the chat / the calibrated scale 1 - m):")
        print("  " + "; ".join(f"{r['scene']} {c['median']:.3f}/{c['spread']:.3f}" for r in rows
                               if (c := r.get("calibration"))))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--root", default=str(ROOT), help="fixture root (default: the repository's)")
    parser.add_argument("--embedder", action="append", choices=("local", "centred", "compressed"),
                        help="embedder(s) to run (repeatable; default local and centred)")
    parser.add_argument("--json", help="also write every row and summary to this JSON file")
    args = parser.parse_args(argv)
    from memory_recall.providers.embedding import LocalEmbedder

    local = LocalEmbedder()
    fixtures = sorted(p for p in Path(args.root).iterdir() if (p / "scenes.json").is_file())
    out: dict[str, Any] = {}
    for label in args.embedder or ("local", "centred"):
        embedder = local if label == "local" else TransformedEmbedder(local, label)
        rows: list[dict[str, Any]] = []
        with tempfile.TemporaryDirectory(prefix="pov-stress-") as tmp:
            for fixture in fixtures:
                rows.extend(run_fixture(fixture, embedder, Path(tmp)))
        _print(label, rows)
        out[label] = {"summary": summarise(rows), "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(out, ensure_ascii=False, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
