"""Chat messages → graph: exact nodes and edges, the chain, edits, deletions, idempotence and determinism."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from memory_recall.errors import InputError, NotFound
from memory_recall.ingest.messages import (
    GraphView,
    character_id,
    delete_message,
    edit_message,
    entity_id,
    ingest_messages,
    parse_message_date,
    plan_deletions,
    plan_messages,
    swipe_message,
)
from memory_recall.model import ChatMessage
from memory_recall.store.sqlite import Store

NOW = 1_767_225_600_000
LATER = NOW + 60_000
D0 = 1_683_554_160_000  # 1:56 pm on 8 May, 2023 (UTC)
T1 = 1_700_000_000_000
NICOLE = "ent:becoming-nicole-" + hashlib.sha1(b"becoming nicole").hexdigest()[:8]
NEW_YORK = "ent:new-york-" + hashlib.sha1(b"new york").hexdigest()[:8]
TAHOE = "ent:lake-tahoe-" + hashlib.sha1(b"lake tahoe").hexdigest()[:8]

ENGLISH = [
    ChatMessage(floor=0, role="user", speaker="Caroline", date="1:56 pm on 8 May, 2023", evidence_id="D1:1",
                text="Hey Mel! I went to the LGBTQ support group yesterday."),
    ChatMessage(floor=1, role="assistant", speaker="Melanie", text="Wow, Caroline! Did you bring Oscar?",
                send_time_ms=T1),
    ChatMessage(floor=2, role="user", speaker="Caroline", attachments=("a photo of a book",),
                text='Yes! We read "Becoming Nicole" together in New York.'),
    ChatMessage(floor=3, role="system", text="[memory] Caroline likes Paris."),
    ChatMessage(floor=4, role="assistant", speaker="Melanie", text="Lovely. Oscar misses you.", hidden=True),
    ChatMessage(floor=5, role="user", speaker="Caroline",
                text="Next time let's go to Lake Tahoe with melanie."),
]

CHINESE = [
    ChatMessage(floor=0, role="user", speaker="林晚", text="苏言，明天去「摩耶山」看夜景吧？"),
    ChatMessage(floor=1, role="assistant", speaker="苏言", text="好啊，林晚。摩耶山的夜景很美。"),
    ChatMessage(floor=2, role="user", speaker="林晚", text="那我带上《三体》。"),
]


def _store(tmp_path: Path, name: str = "s") -> Store:
    return Store(tmp_path / f"{name}.sqlite3")


def _nodes(store: Store, chat: str) -> dict[str, Any]:
    return {n.id: n for n in store.get_nodes(chat)}


def _edges(store: Store, chat: str) -> dict[str, Any]:
    return {e.id: e for e in store.get_edges(chat)}


def _dump(store: Store, chat: str) -> str:
    nodes = sorted((n.model_dump(mode="json") for n in store.get_nodes(chat)), key=lambda d: d["id"])
    edges = sorted((e.model_dump(mode="json") for e in store.get_edges(chat)), key=lambda d: d["id"])
    return json.dumps({"nodes": nodes, "edges": edges}, ensure_ascii=False)


def _active_dump(store: Store, chat: str) -> str:
    data = json.loads(_dump(store, chat))
    for item in data["nodes"] + data["edges"]:
        del item["updated_at"]
    return json.dumps(data, ensure_ascii=False)


def _chain(store: Store, chat: str) -> list[tuple[str, str | None, str | None]]:
    msgs = sorted((n for n in store.get_nodes(chat) if n.type == "message"), key=lambda n: n.seq)
    return [(n.id, n.prev_id, n.next_id) for n in msgs if not n.archived]


class TestEnglishChat:
    def test_nodes(self, tmp_path: Path) -> None:
        store = _store(tmp_path)
        report = ingest_messages(store, "en", ENGLISH, now_ms=NOW)
        assert (report.messages, report.skipped, report.version) == (5, 1, store.chat_version("en"))
        nodes = _nodes(store, "en")
        assert sorted(nodes) == sorted([
            "char:caroline", "char:melanie", NICOLE, TAHOE, "ent:lgbtq", "ent:mel", NEW_YORK, "ent:oscar",
            "msg:0", "msg:1", "msg:2", "msg:4", "msg:5",
        ])
        assert report.node_ids == tuple(sorted(nodes)) and report.nodes_added == 13
        got = {nid: (n.type, n.fields, n.seq_range, n.created_time) for nid, n in nodes.items()}
        assert not any(n.archived for n in nodes.values())

        def ent(name: str, kind: str = "name") -> dict[str, Any]:
            return {"name": name, "kind": kind, "aliases": []}

        def msg(i: int, speaker: str, suffix: str = "") -> dict[str, Any]:
            return {"speaker": speaker, "summary": ENGLISH[i].text + suffix, "participants": [speaker]}

        assert got == {
            "char:caroline": ("character", {"name": "Caroline", "core_note": "user persona"}, (0, 5), D0),
            "char:melanie": ("character", {"name": "Melanie"}, (1, 5), T1),
            NICOLE: ("entity", ent("Becoming Nicole", "quoted"), (2, 2), NOW),
            TAHOE: ("entity", ent("Lake Tahoe"), (5, 5), NOW),
            "ent:lgbtq": ("entity", ent("LGBTQ"), (0, 0), D0),
            "ent:mel": ("entity", ent("Mel"), (0, 0), D0),
            NEW_YORK: ("entity", ent("New York"), (2, 2), NOW),
            "ent:oscar": ("entity", ent("Oscar"), (1, 4), T1),
            "msg:0": ("message", {**msg(0, "Caroline"), "date": "1:56 pm on 8 May, 2023"}, (0, 0), D0),
            "msg:1": ("message", msg(1, "Melanie"), (1, 1), T1),
            "msg:2": ("message", msg(2, "Caroline", " [image: a photo of a book]"), (2, 2), NOW),
            "msg:4": ("message", msg(4, "Melanie"), (4, 4), NOW),
            "msg:5": ("message", msg(5, "Caroline"), (5, 5), NOW),
        }
        m0 = nodes["msg:0"]
        assert list(m0.fields) == ["speaker", "summary", "participants", "date"]
        assert (m0.seq, m0.importance, m0.evidence, m0.extra) == (0, 5.0, ("D1:1",), {"role": "user"})
        assert (m0.story_time.label, m0.story_time.source) == ("1:56 pm on 8 May, 2023", "extract")
        assert nodes["msg:1"].story_time.label == "" and nodes["msg:1"].evidence == ()
        assert nodes["msg:4"].extra == {"role": "assistant", "hidden": True}
        assert all(n.updated_at == NOW for n in nodes.values())

    def test_edges(self, tmp_path: Path) -> None:
        store = _store(tmp_path)
        ingest_messages(store, "en", ENGLISH, now_ms=NOW)
        got = {eid: (e.from_id, e.to_id, e.relation, e.strength, e.invalid_at)
               for eid, e in _edges(store, "en").items()}
        speak, mention = ("involved_in", 0.6, None), ("related", 0.5, None)
        assert got == {
            "e:char:caroline>msg:0": ("char:caroline", "msg:0", *speak),
            "e:char:caroline>msg:2": ("char:caroline", "msg:2", *speak),
            "e:char:caroline>msg:5": ("char:caroline", "msg:5", *speak),
            "e:char:melanie>msg:1": ("char:melanie", "msg:1", *speak),
            "e:char:melanie>msg:4": ("char:melanie", "msg:4", *speak),
            "e:msg:0>ent:lgbtq": ("msg:0", "ent:lgbtq", *mention),
            "e:msg:0>ent:mel": ("msg:0", "ent:mel", *mention),
            "e:msg:1>char:caroline": ("msg:1", "char:caroline", *mention),
            "e:msg:1>ent:oscar": ("msg:1", "ent:oscar", *mention),
            f"e:msg:2>{NICOLE}": ("msg:2", NICOLE, *mention),
            f"e:msg:2>{NEW_YORK}": ("msg:2", NEW_YORK, *mention),
            "e:msg:4>ent:oscar": ("msg:4", "ent:oscar", *mention),
            "e:msg:5>char:melanie": ("msg:5", "char:melanie", *mention),  # lower-case known speaker
            f"e:msg:5>{TAHOE}": ("msg:5", TAHOE, *mention),
        }

    def test_chain_skips_the_system_floor(self, tmp_path: Path) -> None:
        store = _store(tmp_path)
        ingest_messages(store, "en", ENGLISH, now_ms=NOW)
        assert _chain(store, "en") == [
            ("msg:0", None, "msg:1"), ("msg:1", "msg:0", "msg:2"), ("msg:2", "msg:1", "msg:4"),
            ("msg:4", "msg:2", "msg:5"), ("msg:5", "msg:4", None),
        ]

    def test_out_of_order_floor_is_linked_in(self, tmp_path: Path) -> None:
        store = _store(tmp_path)
        ingest_messages(store, "en", [ENGLISH[0], ENGLISH[2]], now_ms=NOW)
        report = ingest_messages(store, "en", [ENGLISH[1]], now_ms=LATER)
        assert _chain(store, "en") == [
            ("msg:0", None, "msg:1"), ("msg:1", "msg:0", "msg:2"), ("msg:2", "msg:1", None),
        ]
        assert "msg:0" in report.node_ids and "msg:2" in report.node_ids


class TestChineseChat:
    def test_nodes_and_edges(self, tmp_path: Path) -> None:
        store = _store(tmp_path)
        ingest_messages(store, "zh", CHINESE, now_ms=NOW)
        nodes = _nodes(store, "zh")
        assert {nid: (n.type, n.fields, n.seq_range) for nid, n in nodes.items()} == {
            "char:林晚": ("character", {"name": "林晚", "core_note": "user persona"}, (0, 2)),
            "char:苏言": ("character", {"name": "苏言"}, (0, 1)),
            "ent:摩耶山": ("entity", {"name": "摩耶山", "kind": "quoted", "aliases": []}, (0, 1)),
            "ent:三体": ("entity", {"name": "三体", "kind": "quoted", "aliases": []}, (2, 2)),
            "msg:0": ("message", {"speaker": "林晚", "summary": CHINESE[0].text, "participants": ["林晚"]},
                      (0, 0)),
            "msg:1": ("message", {"speaker": "苏言", "summary": CHINESE[1].text, "participants": ["苏言"]},
                      (1, 1)),
            "msg:2": ("message", {"speaker": "林晚", "summary": CHINESE[2].text, "participants": ["林晚"]},
                      (2, 2)),
        }
        # 摩耶山 is quoted in msg:0 and found unquoted in msg:1 (non-Latin entity names are known names).
        assert {eid: (e.relation, e.strength) for eid, e in _edges(store, "zh").items()} == {
            "e:char:林晚>msg:0": ("involved_in", 0.6),
            "e:char:林晚>msg:2": ("involved_in", 0.6),
            "e:char:苏言>msg:1": ("involved_in", 0.6),
            "e:msg:0>char:苏言": ("related", 0.5),
            "e:msg:0>ent:摩耶山": ("related", 0.5),
            "e:msg:1>char:林晚": ("related", 0.5),
            "e:msg:1>ent:摩耶山": ("related", 0.5),
            "e:msg:2>ent:三体": ("related", 0.5),
        }
        assert _chain(store, "zh") == [
            ("msg:0", None, "msg:1"), ("msg:1", "msg:0", "msg:2"), ("msg:2", "msg:1", None),
        ]

    def test_one_by_one(self, tmp_path: Path) -> None:
        store = _store(tmp_path)
        for m in CHINESE:
            ingest_messages(store, "zh", [m], now_ms=NOW)
        edges = _edges(store, "zh")
        # The entity quoted in msg:0 is known when msg:1 arrives and is found unquoted. 苏言 is named in
        # msg:0 before anyone called 苏言 has spoken: without capitals that name cannot be seen yet (a batch
        # sees all its speakers first and links it).
        assert "e:msg:1>ent:摩耶山" in edges and "e:msg:0>char:苏言" not in edges
        assert len(edges) == 7


class TestEdit:
    def test_mentions_change(self, tmp_path: Path) -> None:
        store = _store(tmp_path)
        ingest_messages(store, "en", ENGLISH, now_ms=NOW)
        edited = ENGLISH[2].model_copy(update={"text": "Yes! We stayed in Boston.", "attachments": ()})
        report = edit_message(store, "en", edited, now_ms=LATER)
        assert (report.nodes_added, report.nodes_updated, report.nodes_retired) == (1, 1, 2)
        assert (report.edges_added, report.edges_updated, report.edges_retired) == (1, 0, 2)
        assert report.node_ids == (NICOLE, "ent:boston", NEW_YORK, "msg:2")
        assert report.edge_ids == (f"e:msg:2>{NICOLE}", "e:msg:2>ent:boston", f"e:msg:2>{NEW_YORK}")
        nodes, edges = _nodes(store, "en"), _edges(store, "en")
        assert nodes["msg:2"].fields["summary"] == "Yes! We stayed in Boston."
        assert nodes["msg:2"].created_time == NOW and nodes["msg:2"].updated_at == LATER
        assert nodes[NICOLE].archived and nodes[NEW_YORK].archived  # no active mention left
        assert not nodes["ent:boston"].archived
        assert edges[f"e:msg:2>{NICOLE}"].invalid_at == LATER
        assert edges["e:msg:2>ent:boston"].invalid_at is None
        assert edges["e:char:caroline>msg:2"].invalid_at is None  # speaker unchanged: untouched

    def test_speaker_change_and_restore(self, tmp_path: Path) -> None:
        store = _store(tmp_path)
        ingest_messages(store, "en", ENGLISH[:3], now_ms=NOW)
        edit_message(store, "en", ENGLISH[1].model_copy(update={"speaker": "Caroline", "role": "user"}),
                     now_ms=LATER)
        nodes, edges = _nodes(store, "en"), _edges(store, "en")
        assert edges["e:char:melanie>msg:1"].invalid_at == LATER
        assert nodes["char:melanie"].archived  # Melanie spoke only msg:1 and nobody mentions her
        assert edges["e:char:caroline>msg:1"].invalid_at is None
        assert edges["e:msg:1>char:caroline"].invalid_at == LATER  # own speaker: no mention edge
        edit_message(store, "en", ENGLISH[1], now_ms=LATER + 1)
        nodes, edges = _nodes(store, "en"), _edges(store, "en")
        assert not nodes["char:melanie"].archived
        assert edges["e:char:melanie>msg:1"].invalid_at is None
        assert edges["e:char:caroline>msg:1"].invalid_at == LATER + 1

    def test_reinforcement_survives(self, tmp_path: Path) -> None:
        store = _store(tmp_path)
        ingest_messages(store, "en", ENGLISH, now_ms=NOW)
        store.reinforce("en", ["msg:0"], NOW + 5)
        edit_message(store, "en", ENGLISH[0].model_copy(update={"text": "Hi Mel."}), now_ms=LATER)
        node = store.get_node("en", "msg:0")
        assert node is not None
        assert (node.access_count, node.importance, node.last_access_time) == (1, 5.1, NOW + 5)

    def test_swipe(self, tmp_path: Path) -> None:
        store = _store(tmp_path)
        ingest_messages(store, "en", ENGLISH, now_ms=NOW)
        swiped = ENGLISH[1].model_copy(update={"text": "Did Oscar come along?"})
        swipe_message(store, "en", swiped, now_ms=LATER)
        assert _nodes(store, "en")["msg:1"].fields["summary"] == "Did Oscar come along?"
        assert _edges(store, "en")["e:msg:1>char:caroline"].invalid_at == LATER
        with pytest.raises(InputError) as err:
            swipe_message(store, "en", ENGLISH[0], now_ms=LATER)
        assert err.value.field == "message.role"

    def test_missing_floor(self, tmp_path: Path) -> None:
        store = _store(tmp_path)
        ingest_messages(store, "en", ENGLISH, now_ms=NOW)
        with pytest.raises(NotFound):
            edit_message(store, "en", ENGLISH[0].model_copy(update={"floor": 99}), now_ms=LATER)


class TestDelete:
    def test_archive_invalidate_relink(self, tmp_path: Path) -> None:
        store = _store(tmp_path)
        ingest_messages(store, "en", ENGLISH, now_ms=NOW)
        report = delete_message(store, "en", 1, now_ms=LATER)
        assert report.nodes_retired == 1 and report.edges_retired == 3
        assert report.node_ids == ("msg:0", "msg:1", "msg:2")
        nodes, edges = _nodes(store, "en"), _edges(store, "en")
        assert (nodes["msg:1"].archived, nodes["msg:1"].prev_id, nodes["msg:1"].next_id) == (True, None, None)
        assert {eid: e.invalid_at for eid, e in edges.items() if "msg:1" in (e.from_id, e.to_id)} == {
            "e:char:melanie>msg:1": LATER, "e:msg:1>char:caroline": LATER, "e:msg:1>ent:oscar": LATER,
        }
        assert _chain(store, "en")[:2] == [("msg:0", None, "msg:2"), ("msg:2", "msg:0", "msg:4")]
        assert not nodes["ent:oscar"].archived  # msg:4 still mentions Oscar
        delete_message(store, "en", 4, now_ms=LATER + 1)
        nodes = _nodes(store, "en")
        assert nodes["ent:oscar"].archived
        assert not nodes["char:melanie"].archived  # msg:5 still mentions her

    def test_delete_twice_and_missing(self, tmp_path: Path) -> None:
        store = _store(tmp_path)
        ingest_messages(store, "en", ENGLISH, now_ms=NOW)
        delete_message(store, "en", 5, now_ms=LATER)
        version = store.chat_version("en")
        again = delete_message(store, "en", 5, now_ms=LATER + 1)
        assert (again.nodes_retired, again.version, store.chat_version("en")) == (0, version, version)
        assert _chain(store, "en")[-1] == ("msg:4", "msg:2", None)
        with pytest.raises(NotFound):
            delete_message(store, "en", 3, now_ms=LATER)  # the system floor was never ingested

    def test_system_message_retires_and_reingest_restores(self, tmp_path: Path) -> None:
        store = _store(tmp_path)
        ingest_messages(store, "en", ENGLISH, now_ms=NOW)
        before = _active_dump(store, "en")
        ingest_messages(store, "en", [ChatMessage(floor=5, role="system", text="/sys note")], now_ms=LATER)
        assert _nodes(store, "en")["msg:5"].archived and _nodes(store, "en")[TAHOE].archived
        ingest_messages(store, "en", [ENGLISH[5]], now_ms=LATER + 1)
        nodes = _nodes(store, "en")
        assert not nodes["msg:5"].archived and not nodes[TAHOE].archived
        assert _chain(store, "en")[-1] == ("msg:5", "msg:4", None)
        assert _active_dump(store, "en") == before  # everything back, only updated_at moved

    def test_foreign_edges_survive_edits_not_deletion(self, tmp_path: Path) -> None:
        store = _store(tmp_path)
        ingest_messages(store, "en", ENGLISH, now_ms=NOW)
        store.upsert_nodes("en", [{"id": "ev-1", "type": "event", "fields": {"title": "support group"}}])
        store.upsert_edges("en", [{"id": "x1", "from_id": "ev-1", "to_id": "msg:0", "relation": "related"}])
        edit_message(store, "en", ENGLISH[0].model_copy(update={"text": "Hi Mel."}), now_ms=LATER)
        assert _edges(store, "en")["x1"].invalid_at is None
        delete_message(store, "en", 0, now_ms=LATER + 1)
        assert _edges(store, "en")["x1"].invalid_at == LATER + 1
        assert not _nodes(store, "en")["ev-1"].archived  # only ingest-owned characters/entities are archived

    def test_plan_deletions_is_pure(self) -> None:
        plan = plan_messages(ENGLISH, None, NOW)
        view = GraphView.of(plan.nodes, plan.edges)
        deletion = plan_deletions([2], view, LATER)
        assert deletion.retired_nodes == (NICOLE, NEW_YORK, "msg:2")
        assert deletion.updated_nodes == ("msg:1", "msg:4")
        assert view.nodes["msg:2"].archived is False


class TestIdempotenceAndDeterminism:
    def test_reingest_changes_nothing(self, tmp_path: Path) -> None:
        store = _store(tmp_path)
        ingest_messages(store, "en", ENGLISH, now_ms=NOW)
        before, version = _dump(store, "en"), store.chat_version("en")
        report = ingest_messages(store, "en", ENGLISH, now_ms=LATER)
        counts = (report.nodes_added, report.nodes_updated, report.edges_added, report.edges_updated)
        assert counts == (0, 0, 0, 0)
        assert report.node_ids == () and report.version == version
        assert store.chat_version("en") == version and _dump(store, "en") == before

    def test_two_runs_identical(self, tmp_path: Path) -> None:
        a, b = _store(tmp_path, "a"), _store(tmp_path, "b")
        ingest_messages(a, "en", ENGLISH, now_ms=NOW)
        ingest_messages(b, "en", list(reversed(ENGLISH)), now_ms=NOW)
        assert _dump(a, "en") == _dump(b, "en")
        p1, p2 = plan_messages(ENGLISH, None, NOW), plan_messages(ENGLISH, None, NOW)
        assert [n.model_dump_json() for n in p1.nodes] == [n.model_dump_json() for n in p2.nodes]
        assert [e.model_dump_json() for e in p1.edges] == [e.model_dump_json() for e in p2.edges]
        assert [n.id for n in p1.nodes] == sorted(n.id for n in p1.nodes)

    def test_one_by_one_equals_batch_for_active_graph(self, tmp_path: Path) -> None:
        # Bob is mentioned before he first speaks: the batch links msg:0 to char:bob at once, one-by-one
        # ingestion creates ent:bob first and hands it over when Bob speaks.
        chat = [
            ChatMessage(floor=0, role="user", speaker="Ann", text="Have you met Bob?"),
            ChatMessage(floor=1, role="assistant", speaker="Bob", text="Hi Ann, I'm Bob from Leeds."),
            ChatMessage(floor=2, role="user", speaker="Ann", text="Bob, welcome!"),
        ]
        a, b = _store(tmp_path, "a"), _store(tmp_path, "b")
        ingest_messages(a, "c", chat, now_ms=NOW)
        for m in chat:
            ingest_messages(b, "c", [m], now_ms=NOW)

        def active(store: Store) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            nodes = [n.model_dump(mode="json", exclude={"updated_at"}) for n in store.get_nodes("c")
                     if not n.archived]
            edges = [e.model_dump(mode="json", exclude={"updated_at"}) for e in store.get_edges("c")
                     if e.invalid_at is None]
            return sorted(nodes, key=lambda d: d["id"]), sorted(edges, key=lambda d: d["id"])

        assert active(a) == active(b)
        ids = [n["id"] for n in active(a)[0]]
        assert ids == ["char:ann", "char:bob", "ent:leeds", "msg:0", "msg:1", "msg:2"]
        assert _nodes(b, "c")["ent:bob"].archived and _edges(b, "c")["e:msg:0>ent:bob"].invalid_at == NOW

    def test_input_not_mutated(self) -> None:
        view = GraphView.of(plan_messages(ENGLISH, None, NOW).nodes)
        snapshot = {k: v.model_dump_json() for k, v in view.nodes.items()}
        plan_messages([ENGLISH[0].model_copy(update={"text": "changed"})], view, LATER)
        assert {k: v.model_dump_json() for k, v in view.nodes.items()} == snapshot

    def test_empty_batch(self, tmp_path: Path) -> None:
        store = _store(tmp_path)
        report = ingest_messages(store, "en", [], now_ms=NOW)
        assert (report.node_ids, report.version, store.chat_version("en")) == ((), 0, 0)


class TestValidation:
    def test_duplicate_floor(self) -> None:
        with pytest.raises(InputError) as err:
            plan_messages([ENGLISH[0], ENGLISH[0]], None, NOW)
        assert err.value.field == "messages[1].floor"

    def test_send_time_out_of_range(self) -> None:
        with pytest.raises(ValidationError) as exc:  # the message model bounds it: up to the year 9999
            ChatMessage(floor=0, role="user", text="hi", send_time_ms=10**15)
        assert exc.value.errors()[0]["loc"] == ("send_time_ms",)
        # A message built without validation is still caught before anything is planned.
        late = ChatMessage.model_construct(floor=0, role="user", text="hi", send_time_ms=10**15)
        with pytest.raises(InputError) as err:
            plan_messages([ENGLISH[1], late], None, NOW)
        assert err.value.field == "messages[1].send_time_ms"

    @pytest.mark.parametrize("now", [-1, True, 1.5])
    def test_bad_now(self, now: Any) -> None:
        with pytest.raises(InputError) as err:
            plan_messages(ENGLISH, None, now)
        assert err.value.field == "now_ms"

    def test_blank_speaker(self) -> None:
        narration = ChatMessage(floor=0, role="assistant", text="The storm hits Dover.")
        plan = plan_messages([narration], None, NOW)
        assert [n.id for n in plan.nodes] == ["ent:dover", "msg:0"]
        assert plan.nodes[1].fields == {"speaker": "", "summary": "The storm hits Dover.", "participants": []}
        assert [e.id for e in plan.edges] == ["e:msg:0>ent:dover"]


class TestIdsAndDates:
    def test_ids(self) -> None:
        assert character_id("Caroline") == character_id("CAROLINE") == "char:caroline"
        assert character_id("Mary Jane") == "char:mary-jane-" + hashlib.sha1(b"mary jane").hexdigest()[:8]
        assert character_id("Mary-Jane") == "char:mary-jane"
        assert entity_id("林晚") == "ent:林晚" and entity_id("Ｚoë") == "ent:zoë"
        long = entity_id("x" * 300)
        assert len(long) == 100 and long.startswith("ent:xxx")

    @pytest.mark.parametrize(("text", "expected"), [
        ("1:56 pm on 8 May, 2023", D0),
        ("12:48 am on 1 February, 2023", 1_675_212_480_000),
        ("8 May, 2023", 1_683_504_000_000),
        ("2023-05-08", 1_683_504_000_000),
        ("2023-05-08T13:56:00+02:00", 1_683_546_960_000),
        ("2023-05-08T11:56:00Z", 1_683_546_960_000),
        ("1:56 pm on 31 February, 2023", None),
        ("13:00 pm on 8 May, 2023", None),
        ("1960-01-01", None),
        ("yesterday", None),
        ("", None),
    ])
    def test_parse_message_date(self, text: str, expected: int | None) -> None:
        assert parse_message_date(text) == expected


def test_public_surface() -> None:
    import memory_recall.ingest as ingest

    assert ingest.__all__ == sorted(ingest.__all__)
    assert all(getattr(ingest, name) is not None for name in ingest.__all__)
    assert ingest.ingest_messages is ingest_messages
