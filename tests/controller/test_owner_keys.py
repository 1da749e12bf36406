"""Owner keys checked against the chat's knowledge state (recall-spec departure 4 as amended): an unknown key is a
typed error naming it and the known keys — in the controller, over HTTP (422) and on the CLI (one line) — never an
owner without an entry who sees every memory."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from memory_recall.controller import RecallController, RecallRequest
from memory_recall.errors import InputError
from memory_recall.ingest.stbme import import_stbme
from memory_recall.model.chat import ChatMessage
from memory_recall.settings import RecallSettings
from memory_recall.store import Store

ROOT = Path(__file__).resolve().parents[2]
GRAPH = ROOT / "fixtures" / "chats" / "en-thornwick-manor" / "graph.json"
KNOWN = "character:erin, character:marcus, user:wren"
NOW = 1_800_000_000_000


@pytest.fixture
def manor(tmp_path: Path) -> Store:
    store = Store.open(tmp_path / "store")
    with store.write("manor") as w:
        w.replace_graph(import_stbme(GRAPH, now_ms=0))
    yield store
    store.close()


def _request(**kw: Any) -> RecallRequest:
    return RecallRequest(chat_id="manor", messages=[ChatMessage(floor=0, role="user", text="Who took the locket?")],
                         target_user_floor=0, now_ms=NOW, persist=False, **kw)


def test_known_keys_match_with_any_case_and_node_id(manor: Store) -> None:
    controller = RecallController(manor, RecallSettings())
    response = controller.run_recall(_request(active_owner_keys=["Character:Erin", "character:marcus#char-marcus"]))
    assert response.status == "completed"
    scoring = next(t for t in response.traces if t["name"] == "scoring")
    assert scoring["notes"]["owner_keys"] == ["character:erin", "character:marcus"]  # as the context stage writes them


@pytest.mark.parametrize(
    ("keys", "field", "reason"),
    [
        (["Erin"], "active_owner_keys[0]",
         f"unknown owner key 'Erin' (did you mean 'character:erin'?); known keys: {KNOWN}"),
        (["character:erin", "not-a-key"], "active_owner_keys[1]",
         f"unknown owner key 'not-a-key'; known keys: {KNOWN}"),
        (["character:wren"], "active_owner_keys[0]",
         f"unknown owner key 'character:wren' (did you mean 'user:wren'?); known keys: {KNOWN}"),
    ],
)
def test_an_unknown_owner_key_is_an_input_error_naming_it_and_the_known_keys(
    manor: Store, keys: list[str], field: str, reason: str
) -> None:
    controller = RecallController(manor, RecallSettings())
    with pytest.raises(InputError) as err:
        controller.run_recall(_request(active_owner_keys=keys))
    assert (err.value.field, err.value.reason) == (field, reason)


def test_a_user_key_as_the_pov_owner_must_be_a_user_entry(manor: Store) -> None:
    controller = RecallController(manor, RecallSettings())
    response = controller.run_recall(_request(active_owner_keys=["character:erin"], active_user_pov_owner="user:wren"))
    assert response.status == "completed"
    with pytest.raises(InputError) as err:
        controller.run_recall(_request(active_user_pov_owner="user:nobody"))
    assert err.value.field == "active_user_pov_owner"
    assert err.value.reason == "unknown user owner key 'user:nobody'; known user keys: user:wren"
    with pytest.raises(InputError) as err:  # a character's key is not a user key
        controller.run_recall(_request(active_user_pov_owner="user:erin"))
    assert err.value.field == "active_user_pov_owner"


def test_a_chat_without_knowledge_state_has_no_owner_keys(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s")
    try:
        from memory_recall.ingest.messages import ingest_messages

        ingest_messages(store, "manor", [ChatMessage(floor=0, role="user", text="hello there")], now_ms=NOW - 10)
        with pytest.raises(InputError) as err:
            RecallController(store, RecallSettings()).run_recall(_request(active_owner_keys=["character:erin"]))
        assert err.value.reason == ("unknown owner key 'character:erin'; known keys: none (the chat has no "
                                    "knowledge state)")
    finally:
        store.close()


def test_the_service_answers_422_naming_the_key(tmp_path: Path) -> None:
    """A real uvicorn server on 127.0.0.1 (the service tests' LiveServer)."""
    import httpx

    sys.path.insert(0, str(ROOT / "tests" / "service"))
    from service_live import LiveServer

    from memory_recall.service import create_app

    store = Store.open(tmp_path / "http")
    server = LiveServer(create_app(RecallSettings(), store=store, embedder=None)).start()
    client = httpx.Client(base_url=server.url, timeout=60)
    try:
        _service_checks(client)
    finally:
        client.close()
        server.stop()
        store.close()


def _service_checks(client: Any) -> None:
    r = client.post("/v1/chats/manor/import?embed=inline", json=json.loads(GRAPH.read_text(encoding="utf-8")))
    assert r.status_code == 200, r.text
    body = {"chat_id": "manor", "messages": [{"floor": 0, "role": "user", "text": "Who took the locket?"}],
            "target_user_floor": 0, "persist": False, "active_owner_keys": ["Erin"]}
    r = client.post("/v1/recall", json=body)
    assert r.status_code == 422
    assert r.json()["error"] == ("body.active_owner_keys.0: unknown owner key 'Erin' (did you mean "
                                 f"'character:erin'?); known keys: {KNOWN}")
    body["active_owner_keys"] = ["character:erin"]
    assert client.post("/v1/recall", json=body).status_code == 200


def test_the_cli_prints_one_line_naming_the_option(manor: Store, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from memory_recall.cli import main

    data_dir = str(tmp_path / "store")
    manor.close()
    base = ["recall", "--data-dir", data_dir, "--chat", "manor", "--input", "Who took the locket?"]
    for extra, line in (
        (["--owner", "not-a-key"], f"--owner[0]: unknown owner key 'not-a-key'; known keys: {KNOWN}"),
        (["--owner", "character:erin", "--user-owner", "user:nobody"],
         "--user-owner: unknown user owner key 'user:nobody'; known user keys: user:wren"),
    ):
        code = main([*base, *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert code != 0 and len(err) == 1 and err[0].endswith(line), err
    assert main([*base, "--owner", "character:erin", "--user-owner", "user:wren"]) == 0

