"""The bearer-token check cannot be bypassed (adds to the auth tests of the service suite): wrong, empty,
prefix, suffix and very long tokens, the token in the query string, header-name casing, encoded paths that
decode to the open route, and the constant-time compare."""

from __future__ import annotations

import hmac
import json
import logging
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))

from service_live import LiveServer  # noqa: E402

from memory_recall.controller import RecallController  # noqa: E402
from memory_recall.errors import ConfigError  # noqa: E402
from memory_recall.ingest import ingest_messages  # noqa: E402
from memory_recall.model.chat import ChatMessage  # noqa: E402
from memory_recall.service import auth, create_app  # noqa: E402
from memory_recall.service.auth import check_bind  # noqa: E402
from memory_recall.settings import RecallSettings  # noqa: E402
from memory_recall.store import Store  # noqa: E402

TOKEN = "k3y-0123456789abcdef"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    settings = RecallSettings()
    settings = settings.model_copy(update={"service": settings.service.model_copy(update={"token": TOKEN})})
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp))
        live = LiveServer(create_app(settings, store=store)).start()
        yield live.url
        live.stop()
        store.close()


REFUSED_HEADERS = [
    {},
    {"Authorization": ""},
    {"Authorization": "Bearer"},
    {"Authorization": f"Bearer {TOKEN[:-1]}"},  # prefix
    {"Authorization": f"Bearer {TOKEN}0"},  # suffix
    {"Authorization": f"Bearer {TOKEN.upper()}"},  # the token is case sensitive
    {"Authorization": f"Basic {TOKEN}"},
    {"Authorization": TOKEN},
    {"Authorization": f"Bearer {TOKEN * 400}"},  # long: 8 KB
    {"X-Authorization": f"Bearer {TOKEN}"},
    {"Cookie": f"token={TOKEN}"},
]


@pytest.mark.parametrize("headers", REFUSED_HEADERS, ids=range(len(REFUSED_HEADERS)))
def test_refused(server: str, headers: dict[str, str]) -> None:
    r = httpx.get(f"{server}/v1/chats", headers=headers)
    assert r.status_code == 401
    assert r.json()["error"] == "missing or wrong bearer token"


@pytest.mark.parametrize("query", [f"token={TOKEN}", f"access_token={TOKEN}", f"authorization=Bearer%20{TOKEN}"])
def test_token_in_query_string_is_not_accepted(server: str, query: str) -> None:
    assert httpx.get(f"{server}/v1/chats?{query}").status_code == 401


@pytest.mark.parametrize("path", ["/v1/health/../chats", "/v1/health%2F..%2Fchats", "/v1//chats", "/v1/%63hats",
                                  "/V1/chats", "/v1/health/"])
def test_paths_near_the_open_route_need_the_token(server: str, path: str) -> None:
    r = httpx.get(f"{server}{path}")
    assert r.status_code == 401, path


@pytest.mark.parametrize("name", ["authorization", "AUTHORIZATION", "Authorization"])
@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_header_name_and_scheme_casing(server: str, name: str, scheme: str) -> None:
    # HTTP header names and the auth scheme are case-insensitive (RFC 9110); the token itself is not.
    assert httpx.get(f"{server}/v1/chats", headers={name: f"{scheme} {TOKEN}"}).status_code == 200
    assert httpx.get(f"{server}/v1/chats", headers={name: f"{scheme} {TOKEN.upper()}"}).status_code == 401


def test_first_authorization_header_decides(server: str) -> None:
    headers = [("Authorization", "Bearer wrong"), ("Authorization", f"Bearer {TOKEN}")]
    assert httpx.get(f"{server}/v1/chats", headers=headers).status_code == 401


def test_health_stays_open(server: str) -> None:
    assert httpx.get(f"{server}/v1/health").status_code == 200


def test_compare_is_constant_time(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert httpx.get(f"{server}/v1/chats", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert httpx.get(f"{server}/v1/chats", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert calls == [(b"nope", TOKEN.encode()), (TOKEN.encode(), TOKEN.encode())]


@pytest.mark.parametrize("token", [None, "", "   ", "\t\n"])
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "example.com"])
def test_public_bind_needs_a_real_token(host: str, token: str | None) -> None:
    with pytest.raises(ConfigError, match="without a token"):
        check_bind(host, token)


# -- privacy: raw text stays out of the logs unless debug logging is on ----------------------------------------

MARKER = "zq7privatemarker"


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name} {record.getMessage()}")


def _ingest_and_recall(level: int, tmp: Path) -> list[str]:
    """Every log line of the service and the package while a chat holding ``MARKER`` is ingested and recalled."""
    capture = _Capture()
    loggers = [logging.getLogger(n) for n in ("memory_recall", "memory_recall.service", "uvicorn", "uvicorn.error",
                                              "uvicorn.access")]
    saved = [lg.level for lg in loggers]
    root = logging.getLogger()
    root.addHandler(capture)
    for lg in loggers:
        lg.setLevel(level)
    try:
        store = Store.open(tmp)
        live = LiveServer(create_app(RecallSettings(), store=store)).start()
        msgs = [{"floor": 0, "role": "user", "speaker": "Ann", "text": f"the {MARKER} key lies under the stone"},
                {"floor": 1, "role": "assistant", "speaker": "Bob", "text": f"Bob hides the {MARKER} key."}]
        with httpx.Client(base_url=live.url, timeout=60) as client:
            assert client.post("/v1/chats/p/events", json={"type": "message_added", "messages": msgs}).is_success
            ask = {"floor": 2, "role": "user", "speaker": "Ann", "text": f"where is the {MARKER} key?"}
            r = client.post("/v1/recall", json={"chat_id": "p", "messages": [*msgs, ask], "target_user_floor": 2})
            assert r.status_code == 200 and r.json()["status"] == "completed"
        live.stop()
        store.close()
    finally:
        root.removeHandler(capture)
        for lg, old in zip(loggers, saved, strict=True):
            lg.setLevel(old)
    return capture.lines


def test_query_and_message_text_not_logged_at_info(tmp_path: Path) -> None:
    lines = _ingest_and_recall(logging.INFO, tmp_path)
    assert any(line.startswith("memory_recall.service recall chat='p'") for line in lines)  # logging was captured
    assert not [line for line in lines if MARKER in line]


def test_query_text_logged_at_debug(tmp_path: Path) -> None:
    lines = _ingest_and_recall(logging.DEBUG, tmp_path)
    assert [line for line in lines if MARKER in line and line.startswith("memory_recall.service")]


# -- isolation: a recall never returns a node of another chat ----------------------------------------------------

WORDS = ["lighthouse", "key", "stone", "river", "map", "sword", "tower", "garden", "letter", "storm"]
CHATS = {"red": "crimsonmark", "blue": "azuremark", "green": "verdantmark"}


@pytest.fixture(scope="module")
def three_chats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, dict[str, dict[str, str]]]]:
    """Three chats in one store with the same message ids (``msg:…``) and the same words; each node text also
    carries its chat's own marker. Returns the store and, per chat, node id → node text."""
    store = Store.open(tmp_path_factory.mktemp("iso"))
    texts: dict[str, dict[str, str]] = {}
    for chat, mark in CHATS.items():
        msgs = [{"floor": i, "role": "user" if i % 2 == 0 else "assistant", "speaker": "Ann" if i % 2 == 0 else "Bob",
                 "text": f"{WORDS[i % 10]} {WORDS[(i * 3) % 10]} {mark} near the {WORDS[(i * 7) % 10]}"}
                for i in range(12)]
        ingest_messages(store, chat, [ChatMessage(**m) for m in msgs], now_ms=1_700_000_000_000)
        texts[chat] = {n.id: json.dumps(n.model_dump(mode="json")) for n in store.load_graph(chat).nodes}
    yield store, texts
    store.close()


def test_recall_never_crosses_chats(three_chats: tuple[Store, dict[str, dict[str, str]]]) -> None:
    store, texts = three_chats
    controller = RecallController(store, RecallSettings())
    seen: list[str] = []

    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(chat=st.sampled_from(sorted(CHATS)),
           words=st.lists(st.sampled_from(WORDS + sorted(CHATS.values())), min_size=1, max_size=5))
    def check(chat: str, words: list[str]) -> None:
        ask = {"floor": 100, "role": "user", "speaker": "Ann", "text": " ".join(words)}
        r = controller.run_recall({"chat_id": chat, "messages": [ask], "target_user_floor": 100, "persist": False,
                                   "now_ms": 1_700_000_100_000})
        assert r.status == "completed", r.reason
        assert set(r.selected_node_ids) <= set(texts[chat])
        others = [mark for c, mark in CHATS.items() if c != chat]
        assert not [m for m in others if m in r.injection_text]
        for item in r.selected:
            assert not [m for m in others if m in json.dumps(item)]
        if r.selected_node_ids:  # the marker check can fail: the chat's own marker does reach the injection
            assert CHATS[chat] in r.injection_text
        seen.extend(r.selected_node_ids)

    check()
    assert seen, "some recalls selected nodes"
