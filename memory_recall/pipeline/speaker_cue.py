"""Speaker cue: a question that names a speaker raises that speaker's own chat turns (not in the reference;
issue 17).

Contract of :func:`speaker_cue_weights`
    Reads the question (``state.query.user_message``) and, of the candidate rows that are message nodes, the
    turn's ``fields.speaker``. A turn whose speaker is named in the question — the full name, or its first word
    of three letters or more, as a whole word, case-insensitively — is multiplied by ``1 + speaker_cue_boost``;
    every other row (extracted memories included) by exactly 1. No answers, evidence or categories are read.
Why
    Questions about a chat ask what someone said or did, and their own turns say it ("What does John do to
    supplement his basketball training?" is answered by John's turns). The reference's field match sees the
    name too, but additively and in every turn that mentions it, so on transcripts it was measured as noise
    (docs/evaluation.md); as a multiplier it only reorders turns whose evidence is close.
Cost
    One regex per distinct speaker of the candidates (a handful) and one memo lookup per candidate message row.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from memory_recall.pipeline._graph_cache import cached, carry_rows
from memory_recall.settings import ScoringSettings
from memory_recall.store.snapshot import GraphSnapshot, StructureChange

__all__ = ["named_in", "speaker_cue_weights"]


def named_in(question: str, speaker: str) -> bool:
    """Whether ``question`` names ``speaker`` (full name or first name, whole words, any case; a name in a
    script written without spaces, such as Chinese, as a substring).

    >>> named_in("What does John do after training?", "John Smith"), named_in("Johnny's dog?", "John")
    (True, False)
    """
    name = " ".join(speaker.split())
    if not name:
        return False
    forms = {name}
    first = name.split(" ")[0]
    if len(first) >= 3:
        forms.add(first)
    if any(ord(ch) >= 0x2E80 for ch in name):  # CJK and other scripts without spaces: no word boundaries
        return name in question
    pattern = r"(?<!\w)(?:" + "|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)) + r")(?!\w)"
    return re.search(pattern, question, re.IGNORECASE) is not None


#: The speaker memo's value for a turn not read yet (an object scalar, so numpy compares it element by element).
_UNREAD = np.array(None, dtype=object)


def _carried_speakers(old: np.ndarray, change: StructureChange) -> np.ndarray:
    """The speaker memo of a structure a delta derived from ``old``'s: each kept turn's speaker moved to its new
    position, ``None`` (not read yet) for the rewritten and new nodes (a rewritten turn's speaker may have
    changed). Any change carries, an edit or a deletion too: O(n) in numpy, no node parsed."""
    return carry_rows(old, change, None)


def _speaker_memo(snapshot: GraphSnapshot) -> np.ndarray:
    """(n,) object array: node position → the turn's speaker ("" without one), ``None`` until a recall reads the
    node (filled as candidates are read)."""
    memo: np.ndarray
    memo, _ = cached(snapshot, ("speaker-cue-speakers",), lambda: np.full(snapshot.n, None, dtype=object),
                     _carried_speakers, recipe=_speaker_memo)
    return memo


def _speakers(snapshot: GraphSnapshot, idx: np.ndarray) -> list[str]:
    # The memo keeps the names; the parsed nodes are not kept (a turn's model is ~6 KB, its speaker a short str),
    # and the memo follows the chat's writes, so a turn's speaker is read once, not once per snapshot version.
    # Racing recalls on one snapshot store equal values: harmless.
    memo = _speaker_memo(snapshot)
    names = memo[idx]
    for j in np.flatnonzero(np.equal(names, _UNREAD)).tolist():  # only the turns not read yet, in Python
        i = int(idx[j])
        name = memo[i]  # a repeated row read above
        if name is None:
            texts = snapshot.node(i, keep=False).field_text("speaker")
            name = memo[i] = texts[0] if texts else ""
        names[j] = name
    return names.tolist()  # type: ignore[no-any-return]


def speaker_cue_weights(
    snapshot: GraphSnapshot,
    idx: np.ndarray,
    is_message: np.ndarray,
    question: str,
    settings: ScoringSettings,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Per-row multipliers of the speaker cue and trace notes (``speakers`` named, ``raised`` rows); all ones
    (and no notes) when ``settings.speaker_cue`` is off or no candidate turn's speaker is named."""
    weights = np.ones(idx.size)
    if not settings.speaker_cue or settings.speaker_cue_boost <= 0 or not is_message.any() or not question:
        return weights, {}
    rows = np.flatnonzero(is_message)
    speakers = _speakers(snapshot, idx[rows])
    named = sorted(s for s in set(speakers) if named_in(question, s))
    if not named:
        return weights, {}
    hit = np.isin(np.array(speakers, dtype=object), np.array(named, dtype=object))
    weights[rows[hit]] = 1.0 + float(settings.speaker_cue_boost)
    return weights, {"speakers": named, "raised": int(np.count_nonzero(hit))}
