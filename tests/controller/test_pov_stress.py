"""The POV stress fixture (``fixtures/pov-stress``, both languages) through the controller on the default settings
with the real packaged embedder and with a centred transform of its vectors (another similarity spread): no
forbidden memory (a secret the scene's character does not know, another character's POV, a mistaken or a hidden
node) in any selection or block, and the expected memory in every scene (target: 95 %). The runner is
``scripts/pov_stress.py``, which also prints the per-scene table."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from memory_recall.providers.embedding import LocalEmbedder, local_engine_available

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from pov_stress import ROOT as FIXTURES  # noqa: E402
from pov_stress import TransformedEmbedder, run_fixture, summarise  # noqa: E402

pytestmark = pytest.mark.skipif(not local_engine_available(), reason="the packaged local embedder is needed")


@pytest.fixture(scope="module")
def local() -> LocalEmbedder:
    return LocalEmbedder()


def test_the_fixture_is_what_its_scenes_claim() -> None:
    """36 scenes, five or more secrets per character that character does not know, every forbid kind present."""
    scenes = 0
    for fixture in sorted(p for p in FIXTURES.iterdir() if (p / "scenes.json").is_file()):
        graph = json.loads((fixture / "graph.json").read_text(encoding="utf-8"))
        owners = graph["knowledgeState"]["owners"]
        events = {n["id"] for n in graph["nodes"] if n["type"] == "event"}
        inhibit = [e for e in graph["edges"] if e["edgeType"] == 255]
        assert inhibit, fixture.name
        users = [k for k, o in owners.items() if o["ownerType"] == "user"]
        assert len(users) == 1
        assert any(n["scope"]["layer"] == "pov" and n["scope"]["ownerType"] == "user" for n in graph["nodes"])
        for key, entry in owners.items():
            if entry["ownerType"] == "character":
                unknown = events - set(entry["knownNodeIds"])
                assert len([e for e in unknown if e.startswith("sec-")]) >= 5, (fixture.name, key)
        for scene in json.loads((fixture / "scenes.json").read_text(encoding="utf-8")):
            scenes += 1
            assert scene["expect"] and scene["forbid"]
            assert set(scene["forbid_kind"]) == set(scene["forbid"])
            assert not set(scene["expect"]) & set(scene["forbid"])
        kinds = {k for s in json.loads((fixture / "scenes.json").read_text(encoding="utf-8"))
                 for k in s["forbid_kind"].values()}
        assert kinds == {"secret", "pov", "mistaken", "hidden"}, fixture.name
    assert scenes == 36


@pytest.mark.parametrize("kind", ["local", "centred"])
def test_no_forbidden_memory_and_the_expected_one_in_every_scene(
    kind: str, local: LocalEmbedder, tmp_path: Path
) -> None:
    embedder: Any = local if kind == "local" else TransformedEmbedder(local, kind)
    rows: list[dict[str, Any]] = []
    for fixture in sorted(p for p in FIXTURES.iterdir() if (p / "scenes.json").is_file()):
        rows.extend(run_fixture(fixture, embedder, tmp_path / fixture.name))
    summary = summarise(rows)
    assert [(r["fixture"], r["scene"], r["leaks"]) for r in rows if r["leaks"]] == []
    assert [(r["fixture"], r["scene"]) for r in rows if not r["hit"]] == []
    assert summary["scenes"] == 36 and summary["hits"] == 36
    # The persona's POV reaches the user-POV section where the scene asks about it.
    assert all(r["user_pov_rows"] for r in rows if r["scene"] in ("s09", "s18"))
