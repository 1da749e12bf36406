"""LoCoMo loader on the real development split, on small synthetic files, and a full ingest into a store."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from memory_recall.errors import InputError
from memory_recall.ingest.locomo import LocomoConversation, load_locomo, parse_locomo
from memory_recall.ingest.messages import (
    MENTION_STRENGTH,
    SPEAKER_STRENGTH,
    character_id,
    entity_id,
    ingest_messages,
    message_id,
    parse_message_date,
)
from memory_recall.ingest.names import detect_names, fold_name
from memory_recall.store.sqlite import Store

REPO_ROOT = Path(__file__).resolve().parents[2]
DEV_PATH = Path(os.environ.get("LOCOMO_DEV_PATH", "../shared/datasets/locomo/locomo_dev.json"))
if not DEV_PATH.is_absolute():
    DEV_PATH = (REPO_ROOT / DEV_PATH).resolve()

needs_dev = pytest.mark.skipif(
    not DEV_PATH.is_file(),
    reason=f"LoCoMo dev split not found at {DEV_PATH} (set LOCOMO_DEV_PATH to locomo_dev.json)",
)

NOW = 1_767_225_600_000


@pytest.fixture(scope="module")
def dev() -> list[LocomoConversation]:
    return load_locomo(DEV_PATH)


@pytest.fixture(scope="module")
def raw() -> list[dict[str, Any]]:
    return json.loads(DEV_PATH.read_text(encoding="utf-8"))


@needs_dev
class TestDevSplit:
    def test_counts(self, dev: list[LocomoConversation]) -> None:
        assert [c.sample_id for c in dev] == ["conv-26", "conv-30", "conv-41", "conv-42", "conv-43"]
        assert [(c.speaker_a, c.speaker_b) for c in dev] == [
            ("Caroline", "Melanie"), ("Jon", "Gina"), ("John", "Maria"), ("Joanna", "Nate"), ("Tim", "John"),
        ]
        assert [len(c.messages) for c in dev] == [419, 369, 663, 629, 680]
        assert sum(len(c.messages) for c in dev) == 2760
        assert [len(c.questions) for c in dev] == [199, 105, 193, 260, 242]
        assert sum(len(c.questions) for c in dev) == 999

    def test_messages_follow_turns(self, dev: list[LocomoConversation], raw: list[dict[str, Any]]) -> None:
        for conv, sample in zip(dev, raw, strict=True):
            c = sample["conversation"]
            n = len([k for k in c if k.startswith("session_") and not k.endswith("_date_time")])
            turns = [(i, t) for i in range(1, n + 1) for t in c[f"session_{i}"]]
            assert len(turns) == len(conv.messages)
            for floor, ((session, turn), m) in enumerate(zip(turns, conv.messages, strict=True)):
                assert m.floor == floor
                assert (m.speaker, m.text, m.evidence_id) == (turn["speaker"], turn["text"], turn["dia_id"])
                assert m.role == ("user" if turn["speaker"] == c["speaker_a"] else "assistant")
                assert m.date == c[f"session_{session}_date_time"]
                assert m.attachments == ((turn["blip_caption"],) if turn.get("blip_caption") else ())
                assert conv.dia_index[m.evidence_id] == floor

    def test_session_order_is_numeric(self, dev: list[LocomoConversation]) -> None:
        conv = dev[0]
        last_of_9 = max(f for d, f in conv.dia_index.items() if d.startswith("D9:"))
        assert conv.dia_index["D10:1"] == last_of_9 + 1
        sessions = [int(m.evidence_id[1:].split(":")[0]) for m in conv.messages]
        assert sessions == sorted(sessions) and sessions[-1] == 19

    def test_caption_kept(self, dev: list[LocomoConversation]) -> None:
        m = next(m for m in dev[0].messages if m.attachments)
        caption = "a photo of a dog walking past a wall with a painting of a woman"
        assert (m.evidence_id, m.attachments) == ("D1:5", (caption,))
        assert sum(1 for c in dev for m in c.messages if m.attachments) == 116 + 72 + 131 + 119 + 164

    def test_malformed_evidence_normalised(self, dev: list[LocomoConversation]) -> None:
        fixed = {
            (c.sample_id, q.raw_evidence): q.evidence
            for c in dev for q in c.questions if q.evidence != q.raw_evidence
        }
        assert fixed == {
            ("conv-26", ("D8:6; D9:17",)): ("D8:6", "D9:17"),
            ("conv-42", ("D2:14", "D9:12", "D9:14", "D10:11", "D19:17", "D27:23", "D10:19")):
                ("D2:14", "D9:12", "D9:14", "D10:11", "D19:17", "D27:23"),
            ("conv-42", ("D1:18", "D", "D1:20")): ("D1:18", "D1:20"),
            ("conv-43", ("D1:14", "D2:7", "D4:7", "D5:15", "D:11:26", "D20:21", "D26:36")):
                ("D1:14", "D2:7", "D4:7", "D5:15", "D20:21", "D26:36"),
        }

    def test_every_evidence_maps_to_a_floor(self, dev: list[LocomoConversation]) -> None:
        for c in dev:
            for q in c.questions:
                for ev in q.evidence:
                    assert c.messages[c.dia_index[ev]].evidence_id == ev

    def test_answers_and_categories(self, dev: list[LocomoConversation]) -> None:
        assert all(isinstance(q.answer, str) and q.answer for c in dev for q in c.questions)
        assert Counter(q.category for c in dev for q in c.questions) == Counter(
            {4: 418, 5: 237, 2: 156, 1: 142, 3: 46}
        )
        both = [q for q in dev[0].questions if q.question == "Is Oscar Melanie's pet?"]
        assert [q.answer for q in both] == ["No"]  # answer wins over adversarial_answer

    def test_dates_parse(self, dev: list[LocomoConversation]) -> None:
        assert dev[0].messages[0].date == "1:56 pm on 8 May, 2023"
        assert all(parse_message_date(m.date) is not None for c in dev for m in c.messages)


def _sample(**conversation: Any) -> dict[str, Any]:
    conv = {"speaker_a": "Ann", "speaker_b": "Bob", **conversation}
    return {"sample_id": "s", "conversation": conv, "qa": []}


class TestSynthetic:
    def test_numeric_session_order_and_evidence(self) -> None:
        data = [_sample(
            session_10=[{"speaker": "Bob", "dia_id": "D10:1", "text": "ten"}],
            session_10_date_time="10 June, 2023",
            session_2=[{"speaker": "Ann", "dia_id": "D2:1", "text": "two", "blip_caption": "a cat"}],
            session_2_date_time="2 June, 2023",
            session_1=[{"speaker": "Ann", "dia_id": "D1:1", "text": "one"}],
            session_3_date_time="no turns",
        )]
        data[0]["qa"] = [
            {"question": "q", "answer": 7, "evidence": ["D10:1; D1:1", "D1:1", "D", " D2:1 "], "category": 1},
            {"question": "a", "adversarial_answer": "x", "evidence": [], "category": 5},
        ]
        (conv,) = parse_locomo(data)
        assert [(m.floor, m.evidence_id, m.text, m.role, m.date) for m in conv.messages] == [
            (0, "D1:1", "one", "user", ""),
            (1, "D2:1", "two", "user", "2 June, 2023"),
            (2, "D10:1", "ten", "assistant", "10 June, 2023"),
        ]
        assert conv.messages[1].attachments == ("a cat",)
        assert conv.dia_index == {"D1:1": 0, "D2:1": 1, "D10:1": 2}
        assert [(q.answer, q.evidence, q.category) for q in conv.questions] == [
            ("7", ("D10:1", "D1:1", "D2:1"), 1), ("x", (), 5),
        ]

    @pytest.mark.parametrize(("mutate", "field"), [
        (lambda d: d[0]["conversation"]["session_3"][1].update(text=5), "conversation[0].session_3[1].text"),
        (lambda d: d[0]["conversation"]["session_3"][0].pop("dia_id"), "conversation[0].session_3[0].dia_id"),
        (lambda d: d[0]["conversation"]["session_3"][0].update(speaker="Eve"),
         "conversation[0].session_3[0].speaker"),
        (lambda d: d[0]["conversation"].update(session_3={}), "conversation[0].session_3"),
        (lambda d: d[0]["conversation"].pop("speaker_b"), "conversation[0].speaker_b"),
        (lambda d: d[0].update(qa=[{"question": "q", "evidence": [], "category": 1}]),
         "conversation[0].qa[0].answer"),
        (lambda d: d[0].update(qa=[{"question": "q", "answer": "a", "evidence": [3], "category": 1}]),
         "conversation[0].qa[0].evidence[0]"),
        (lambda d: d[0].update(qa=[{"question": "q", "answer": "a", "evidence": [], "category": "1"}]),
         "conversation[0].qa[0].category"),
        (lambda d: d.append([]), "conversation[1]"),
    ])
    def test_malformed_names_the_path(self, mutate: Any, field: str) -> None:
        turns = [
            {"speaker": "Ann", "dia_id": "D3:1", "text": "a"},
            {"speaker": "Bob", "dia_id": "D3:2", "text": "b"},
        ]
        data = [_sample(session_3=turns, session_3_date_time="")]
        mutate(data)
        with pytest.raises(InputError) as err:
            parse_locomo(data)
        assert err.value.field == field

    def test_not_a_list_and_bad_file(self, tmp_path: Path) -> None:
        with pytest.raises(InputError, match="conversation"):
            parse_locomo({"sample_id": "x"})
        bad = tmp_path / "bad.json"
        bad.write_text("{", encoding="utf-8")
        with pytest.raises(InputError) as err:
            load_locomo(bad)
        assert err.value.field == "path"
        with pytest.raises(InputError):
            load_locomo(tmp_path / "missing.json")


@needs_dev
class TestIngestDevSplit:
    def test_counts_per_type(self, dev: list[LocomoConversation], tmp_path: Path) -> None:
        store = Store(tmp_path / "locomo.sqlite3")
        totals: Counter[str] = Counter()
        for conv in dev:
            report = ingest_messages(store, conv.sample_id, conv.messages, now_ms=NOW)
            stats = store.stats(conv.sample_id)
            edges = store.get_edges(conv.sample_id)
            by_relation = Counter(e.relation for e in edges)
            # Independent expectation: one involved_in edge per turn; one related edge per distinct mention
            # target of a turn other than its own speaker; entities = the other targets.
            speakers = {fold_name(conv.speaker_a): conv.speaker_a, fold_name(conv.speaker_b): conv.speaker_b}
            related = 0
            entities: set[str] = set()
            for m in conv.messages:
                summary = m.text + "".join(f" [image: {c}]" for c in m.attachments)
                targets = set()
                for mention in detect_names(summary, list(speakers.values())):
                    key = fold_name(mention.name)
                    if key in speakers:
                        targets.add(character_id(speakers[key]))
                    else:
                        targets.add(entity_id(mention.name))
                        entities.add(entity_id(mention.name))
                targets.discard(character_id(m.speaker))
                related += len(targets)
            assert stats["nodes_by_type"] == {
                "character": 2, "entity": len(entities), "message": len(conv.messages),
            }
            assert stats["archived_count"] == 0
            assert by_relation == Counter({"involved_in": len(conv.messages), "related": related})
            assert {e.strength for e in edges if e.relation == "involved_in"} == {SPEAKER_STRENGTH}
            assert {e.strength for e in edges if e.relation == "related"} == {MENTION_STRENGTH}
            assert report.nodes_added == stats["node_count"] and report.edges_added == len(edges)
            nodes = {n.id: n for n in store.get_nodes(conv.sample_id)}
            chain = [message_id(i) for i in range(len(conv.messages))]
            assert [nodes[i].next_id for i in chain] == [*chain[1:], None]
            assert nodes[character_id(conv.speaker_a)].fields["core_note"] == "user persona"
            for m in conv.messages:
                if m.attachments:  # the caption is part of the evidence text
                    summary = nodes[message_id(m.floor)].fields["summary"]
                    assert summary == f"{m.text} [image: {m.attachments[0]}]"
            totals.update(stats["nodes_by_type"])
            totals["edges"] += len(edges)
        # Frozen totals of the dev split (change only with a deliberate rule change).
        assert dict(totals) == {"character": 10, "entity": 332, "message": 2760, "edges": 4462}
