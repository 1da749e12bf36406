"""Speaker cue (memory_recall.pipeline.speaker_cue): a question naming a speaker raises that speaker's turns."""

from __future__ import annotations

import numpy as np
import pytest
from score_helpers import candidates_for, make_graph, make_node, make_snapshot, make_state, run_scoring, settings

from memory_recall.model.graph import Node
from memory_recall.pipeline import speaker_cue
from memory_recall.pipeline.scoring import explain_row
from memory_recall.pipeline.speaker_cue import named_in, speaker_cue_weights
from memory_recall.store import Store
from memory_recall.store.snapshot import SnapshotCache, build_snapshot


@pytest.mark.parametrize(("question", "speaker", "expected"), [
    ("What does John do after training?", "John", True),
    ("What does john do after training?", "John Smith", True),  # first name, any case
    ("Did Mr Smith call?", "John Smith", False),  # only the full name or the first name count
    ("Did John Smith call?", "John Smith", True),
    ("What about Johnny?", "John", False),  # whole words only
    ("Where did Al go?", "Al Green", False),  # a first name under three letters counts only in the full name
    ("林黛玉去哪里了？", "林黛玉", True),
    ("Anything new?", "", False),
])
def test_named_in(question: str, speaker: str, expected: bool) -> None:
    assert named_in(question, speaker) is expected


def _turns():  # type: ignore[no-untyped-def]
    nodes = [
        make_node("msg:1", "message", seq=1, speaker="Caroline", summary="I started painting again."),
        make_node("msg:2", "message", seq=2, speaker="Melanie", summary="I started painting again too!"),
        make_node("ev-3", "event", seq=3, speaker="Melanie", summary="Melanie paints"),
    ]
    snap = make_snapshot(make_graph(nodes))
    return snap, np.array([snap.index["msg:1"], snap.index["msg:2"], snap.index["ev-3"]])


def test_weights_raise_only_the_named_speakers_turns() -> None:
    snap, idx = _turns()
    on = settings(scoring={"speaker_cue": True, "speaker_cue_boost": 0.5}).scoring
    w, notes = speaker_cue_weights(snap, idx, np.array([True, True, False]), "What does Melanie paint?", on)
    assert w.tolist() == [1.0, 1.5, 1.0] and notes == {"speakers": ["Melanie"], "raised": 1}
    w, notes = speaker_cue_weights(snap, idx, np.array([True, True, False]), "What does Bob paint?", on)
    assert w.tolist() == [1.0, 1.0, 1.0] and notes == {}
    off = settings().scoring
    w, notes = speaker_cue_weights(snap, idx, np.array([True, True, False]), "What does Melanie paint?", off)
    assert w.tolist() == [1.0, 1.0, 1.0] and notes == {}


def test_scoring_ranks_the_named_speakers_turn_first_and_explains_it() -> None:
    snap, _ = _turns()
    cands = candidates_for(snap, ["msg:1", "msg:2"], vector={"msg:1": 0.5, "msg:2": 0.5})
    base = settings(scoring={"message_weights": True}, lexical={"enable_bm25": False})
    on = base.with_overrides({"scoring": {"speaker_cue": True}})
    question = "What does Melanie paint?"
    plain = run_scoring(make_state(snap, question, candidates=cands), base).state.scored
    cued = run_scoring(make_state(snap, question, candidates=cands), on)
    table = cued.state.scored
    assert [snap.ids[i] for i in plain.index] == ["msg:1", "msg:2"]  # a tie: node id order
    assert [snap.ids[i] for i in table.index] == ["msg:2", "msg:1"]
    assert table.final_score[0] == pytest.approx(1.3 * plain.final_score[1], rel=1e-12)  # the DPP quality too
    assert explain_row(snap, table, 0, on.scoring, on.lexical).multipliers["speaker_cue"] == pytest.approx(1.3)
    assert "speaker_cue" not in explain_row(snap, table, 1, on.scoring, on.lexical).multipliers
    assert cued.trace.notes["speaker_cue"] == {"speakers": ["Melanie"], "raised": 1}


def _write_turns(store: Store, chat: str, speakers: list[str]) -> list[Node]:
    """One chained message turn per speaker (``t0``, ``t1``, …), written to ``chat``."""
    turns = [Node(id=f"t{i}", type="message", seq=i, seq_range=(i, i), prev_id=f"t{i - 1}" if i else None,
                  fields={"text": f"turn {i}", "speaker": speaker}) for i, speaker in enumerate(speakers)]
    with store.write(chat) as w:
        w.upsert_nodes(turns)
    return turns


def test_the_speaker_memo_follows_the_chats_appends(store: Store) -> None:
    """After an appended-only delta the child structure's memo is the parent's without the rewritten turns (their
    speaker may have changed), without parsing any node; the weights equal those of a fresh build; no parsed node
    is kept for the speakers read."""
    chat, model, now = "cue", "m", 1_700_000_000_000
    turns = _write_turns(store, chat, ["Caroline", "Melanie", "Caroline"])
    cache = SnapshotCache()
    on = settings(scoring={"speaker_cue": True, "speaker_cue_boost": 0.5}).scoring
    question = "What did Melanie say?"
    parent = cache.get(store, chat, model, now_ms=now)
    idx = np.arange(parent.n)
    w, _ = speaker_cue_weights(parent, idx, np.ones(parent.n, dtype=bool), question, on)
    assert w.tolist() == [1.0, 1.5, 1.0] and dict(parent._nodes) == {}
    with store.write(chat) as wr:  # turn 0 now spoken by Melanie; a new turn by Melanie
        wr.upsert_nodes([turns[0].model_copy(update={"fields": {"text": "turn 0", "speaker": "Melanie"}}),
                         Node(id="t3", type="message", seq=3, seq_range=(3, 3), prev_id="t2",
                              fields={"text": "turn 3", "speaker": "Melanie"})])
    child = cache.get(store, chat, model, now_ms=now)
    change = child.structure.change
    assert change is not None and change.appended_only and child.structure.parent is parent.structure
    rewritten = change.rewritten.tolist()
    assert rewritten == [child.index["t0"]]
    memo = speaker_cue._speaker_memo(child)
    assert memo.tolist() == [None if i in rewritten else name
                             for i, name in enumerate(["Caroline", "Melanie", "Caroline"])] + [None]
    idx = np.arange(child.n)
    w, notes = speaker_cue_weights(child, idx, np.ones(child.n, dtype=bool), question, on)
    fresh = build_snapshot(store.snapshot_source(chat, model), now_ms=now)
    want, want_notes = speaker_cue_weights(fresh, idx, np.ones(fresh.n, dtype=bool), question, on)
    assert [child.ids[i] for i in idx] == ["t0", "t1", "t2", "t3"]
    assert w.tolist() == want.tolist() == [1.5, 1.5, 1.0, 1.5] and notes == want_notes
    assert dict(child._nodes) == {}


def test_the_speaker_memo_follows_an_edit_and_a_deletion(store: Store) -> None:
    """A delta that is not an append (a turn deleted, so the kept turns move; an edge written) carries the memo
    too: each kept turn's speaker at its new position, the rewritten turn's unknown, nothing parsed for the kept
    ones; the weights equal those of a fresh build."""
    chat, model, now = "cue-edit", "m", 1_700_000_000_000
    speakers = ["Caroline", "Melanie", "Caroline", "Melanie"]
    turns = _write_turns(store, chat, speakers)
    cache = SnapshotCache()
    on = settings(scoring={"speaker_cue": True, "speaker_cue_boost": 0.5}).scoring
    question = "What did Caroline say?"
    parent = cache.get(store, chat, model, now_ms=now)
    speaker_cue_weights(parent, np.arange(parent.n), np.ones(parent.n, dtype=bool), question, on)
    assert speaker_cue._speaker_memo(parent).tolist() == speakers
    with store.write(chat) as wr:  # t1 deleted; t3 now spoken by Caroline
        wr.delete_nodes(["t1"])
        wr.upsert_nodes([turns[3].model_copy(update={"fields": {"text": "turn 3", "speaker": "Caroline"}})])
    child = cache.get(store, chat, model, now_ms=now)
    change = child.structure.change
    assert change is not None and not change.appended_only and child.structure.parent is parent.structure
    memo = speaker_cue._speaker_memo(child)
    assert {child.ids[i]: name for i, name in enumerate(memo.tolist())} == {"t0": "Caroline", "t2": "Caroline",
                                                                           "t3": None}
    parsed: list[int] = []
    read = type(child).node

    def counting(self, i: int, *, keep: bool = True):  # type: ignore[no-untyped-def]
        parsed.append(i)
        return read(self, i, keep=keep)

    idx = np.arange(child.n)
    try:
        type(child).node = counting  # type: ignore[method-assign]
        w, notes = speaker_cue_weights(child, idx, np.ones(child.n, dtype=bool), question, on)
    finally:
        type(child).node = read  # type: ignore[method-assign]
    assert parsed == [child.index["t3"]]
    fresh = build_snapshot(store.snapshot_source(chat, model), now_ms=now)
    want, want_notes = speaker_cue_weights(fresh, idx, np.ones(fresh.n, dtype=bool), question, on)
    assert [child.ids[i] for i in idx] == ["t0", "t2", "t3"]
    assert w.tolist() == want.tolist() == [1.5, 1.5, 1.5] and notes == want_notes == {
        "speakers": ["Caroline"], "raised": 3}
