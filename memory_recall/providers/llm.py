"""Chat LLM for the optional rerank: the :class:`ChatLLM` protocol, an OpenAI-compatible client, the rerank
prompt (stbme-reference §3.15) and a tolerant parser of its answer.

Contract:

* ``ChatLLM.complete(messages, deadline_s=…)`` returns the assistant text or raises
  :class:`~memory_recall.errors.LLMUnavailable` with a category: ``timeout``, ``connect``, ``http_status``
  (non-2xx), ``refusal`` (``refusal`` set, ``finish_reason == "content_filter"`` or empty content),
  ``bad_payload`` (the body or, in JSON mode, the content is not JSON). It makes exactly ONE attempt that ends
  within ``deadline_s`` (recall-spec departure 3: the reference's three attempts of up to 300 s each are the
  weakness §7.3 item 20 fixes); the rerank stage falls back to score order on any failure.
* :func:`parse_rerank_answer` extracts one JSON object (```json fences and prose around it are tolerated) and
  keeps the selection values raw: validating them against the candidate keys is the rerank stage's job.
  ``bad_payload`` when there is no JSON object, ``unknown_keys`` when the object has none of the known keys.

Usage::

    llm = make_llm(settings.llm)                       # None when no endpoint is configured
    messages = build_rerank_messages(context_lines=[...], user_message=text,
                                     candidate_lines=["[R1] 类型=事件, ..."], owner_lines=[], max_nodes=12)
    answer = request_rerank(llm, messages, deadline_s=settings.llm.timeout_s)
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

import httpx

from memory_recall.errors import ConfigError, InputError, LLMUnavailable
from memory_recall.providers._http import PooledHttpClient
from memory_recall.settings import LLMSettings

__all__ = [
    "CONTEXT_REVIEW_HEADER",
    "RERANK_KNOWN_KEYS",
    "TARGET_HEADER",
    "ChatLLM",
    "OpenAIChatLLM",
    "OwnerScore",
    "RerankAnswer",
    "build_rerank_messages",
    "extract_json_object",
    "make_llm",
    "parse_rerank_answer",
    "request_rerank",
]

#: Block headers of the reference's recall prompt (§3.15), kept verbatim.
CONTEXT_REVIEW_HEADER = "--- 以下是上下文回顾（已提取过），仅供理解剧情 ---"
TARGET_HEADER = "--- 以下是本次需要召回记忆的新对话内容 ---"

#: Keys of a rerank answer; an object with none of them is ``unknown_keys``.
RERANK_KNOWN_KEYS: tuple[str, ...] = (
    "selected_keys",
    "selected_ids",
    "reason",
    "active_owner_keys",
    "active_owner_scores",
)


@runtime_checkable
class ChatLLM(Protocol):
    """A chat model answering one request within a deadline (see the module docstring)."""

    def complete(self, messages: list[dict[str, Any]], *, deadline_s: float) -> str: ...


# ----------------------------------------------------------------------------------------------------------
# JSON extraction
# ----------------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)


def _json_objects(text: str) -> Iterator[dict[str, Any]]:
    """Every JSON object found in ``text``, in preference order: the whole text, fenced blocks, then each
    ``{...}`` that decodes, left to right."""
    if not isinstance(text, str):
        return
    stripped = text.strip().lstrip("\ufeff")
    candidates = [stripped]
    candidates.extend(m.group(1).strip() for m in _FENCE.finditer(stripped))
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value
    decoder = json.JSONDecoder()
    start = stripped.find("{")
    while start != -1:
        try:
            value, _end = decoder.raw_decode(stripped, start)
        except ValueError:
            value = None
        if isinstance(value, dict):
            yield value
        start = stripped.find("{", start + 1)


def extract_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text``: the whole text, a fenced block, or the first ``{...}`` that decodes
    (prose before and after is ignored). ``None`` when there is none."""
    return next(_json_objects(text), None)


# ----------------------------------------------------------------------------------------------------------
# OpenAI-compatible chat client
# ----------------------------------------------------------------------------------------------------------


class OpenAIChatLLM(PooledHttpClient):
    """``POST <base_url>/chat/completions`` on any OpenAI-compatible server, one attempt per call.

    ``json_mode`` sends ``response_format: {"type": "json_object"}`` and makes non-JSON content a
    ``bad_payload``. ``max_tokens`` is sent when set (the reference uses ``max(512, 160 × maxRecallNodes)``).
    ``transport`` replaces httpx's network transport (``httpx.MockTransport`` in tests).

    >>> llm = OpenAIChatLLM(base_url="http://127.0.0.1:8080/v1", model="qwen2.5-7b-instruct")
    >>> llm.complete([{"role": "user", "content": "Reply with {}"}], deadline_s=10.0)  # doctest: +SKIP
    '{}'
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        temperature: float = 0.0,
        json_mode: bool = True,
        max_tokens: int | None = None,
        connect_timeout_s: float = 3.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.api_key = api_key
        self.temperature = temperature
        self.json_mode = json_mode
        self.max_tokens = max_tokens
        self.connect_timeout_s = connect_timeout_s
        self.transport = transport
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None
        self.requests_sent = 0

    @property
    def url(self) -> str:
        root = self.base_url.rstrip("/")
        return root if root.endswith("/chat/completions") else root + "/chat/completions"

    def __repr__(self) -> str:
        return f"OpenAIChatLLM(base_url={self.base_url!r}, model={self.model!r})"

    def complete(self, messages: list[dict[str, Any]], *, deadline_s: float) -> str:
        """The assistant's text for ``messages``; one attempt within ``deadline_s``. Raises LLMUnavailable."""
        if not isinstance(deadline_s, int | float) or not deadline_s > 0:
            raise InputError(
                "deadline_s", f"must be a number in the range (0, inf). Got {deadline_s!r} instead."
            )
        body: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": self.temperature}
        if self.json_mode:
            body["response_format"] = {"type": "json_object"}
        if self.max_tokens:
            body["max_tokens"] = self.max_tokens
        # One deadline for every phase: read= bounds a server that accepts and then stays silent.
        timeout = httpx.Timeout(
            connect=min(self.connect_timeout_s, deadline_s),
            read=deadline_s,
            write=deadline_s,
            pool=deadline_s,
        )
        client = self._http()
        with self._lock:
            self.requests_sent += 1
        try:
            response = client.post(self.url, json=body, timeout=timeout)
        except httpx.TimeoutException as exc:
            raise LLMUnavailable(
                "timeout", f"{type(exc).__name__} within {deadline_s:g}s ({self.url})"
            ) from exc
        except httpx.TransportError as exc:
            raise LLMUnavailable("connect", f"{type(exc).__name__}: {exc} ({self.url})") from exc
        if not 200 <= response.status_code < 300:
            raise LLMUnavailable(
                "http_status", f"HTTP {response.status_code} from {self.url}: {_snippet(response)}"
            )
        try:
            payload = response.json()
        except ValueError as exc:
            raise LLMUnavailable("bad_payload", f"response is not JSON: {_snippet(response)}") from exc
        choices = payload.get("choices") if isinstance(payload, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise LLMUnavailable("bad_payload", "response has no 'choices'")
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise LLMUnavailable("bad_payload", "choices[0] has no 'message'")
        refusal = message.get("refusal")
        if refusal:
            raise LLMUnavailable("refusal", f"model refused: {str(refusal)[:200]}")
        if choice.get("finish_reason") == "content_filter":
            raise LLMUnavailable("refusal", "finish_reason content_filter")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise LLMUnavailable("bad_payload", "message content is not a string")
        if not content or not content.strip():
            raise LLMUnavailable("refusal", "empty content")
        if self.json_mode and extract_json_object(content) is None:
            reason = choice.get("finish_reason")
            hint = " (finish_reason length: truncated)" if reason == "length" else ""
            raise LLMUnavailable("bad_payload", f"content is not a JSON object{hint}: {content[:200]!r}")
        return content


def _snippet(response: httpx.Response, limit: int = 200) -> str:
    text = response.text.strip().replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "…"


def make_llm(
    settings: LLMSettings,
    *,
    max_tokens: int | None = None,
    transport: httpx.BaseTransport | None = None,
) -> OpenAIChatLLM | None:
    """The rerank LLM the settings describe, or ``None`` when ``base_url`` is empty (rerank is then skipped
    with a reason). Raises :class:`ConfigError` naming the key when the endpoint is half configured."""
    if not settings.base_url:
        if settings.model:
            raise ConfigError("a model is set but no endpoint root", field="llm.base_url")
        return None
    parts = urlsplit(settings.base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"must be an http(s) URL, got {settings.base_url!r}", field="llm.base_url")
    if not settings.model:
        raise ConfigError("an endpoint is set but no model name", field="llm.model")
    return OpenAIChatLLM(
        base_url=settings.base_url,
        model=settings.model,
        api_key=os.environ.get(settings.api_key_env) or None,
        temperature=settings.temperature,
        max_tokens=max_tokens,
        transport=transport,
    )


# ----------------------------------------------------------------------------------------------------------
# Rerank prompt (reference §3.15)
# ----------------------------------------------------------------------------------------------------------

_SYSTEM_PROMPT = """You select the memories a roleplay model needs to continue the story.
You receive the recent conversation, the user's new message and a numbered list of candidate memories, each
identified by a short key such as [R1].
Rules:
- Pick at most {max_nodes} candidates, by their short keys only (for example "R3"), most useful first.
- Prefer memories about the current scene, causal continuity with what just happened, and background the
  reply needs; skip memories that are redundant or unrelated.
- Keep story time consistent: do not pick memories that contradict the current point of the story.
- Choosing nothing means the memories fall back to score order; pick what is relevant.
Scene owners: from the listed scene-owner candidates only, give up to {max_owners} "active_owner_keys" (the
characters whose point of view the current scene follows) and "active_owner_scores" as
[{{"ownerKey": "<key>", "score": <0..1>, "reason": "<short>"}}].
Return [] for both when no listed candidate fits.
Output strict JSON only, no prose, no code fence:
{{"selected_keys": ["R1", "R2"], "reason": "<one sentence>", "active_owner_keys": ["character:alice"],
"active_owner_scores": [{{"ownerKey": "character:alice", "score": 0.9, "reason": "<short>"}}]}}"""

_NO_OWNER_NOTE = (
    "(no reliable scene-owner candidate: return [] for active_owner_keys and active_owner_scores)"
)


def build_rerank_messages(
    *,
    context_lines: list[str],
    user_message: str,
    candidate_lines: list[str],
    owner_lines: list[str],
    max_nodes: int,
) -> list[dict[str, str]]:
    """The rerank prompt of reference §3.15 as chat messages: one system message (task, rules, owner request,
    output format) and one user message (context review block, target block, user message, candidate lines,
    ``candidate_count=<n>``, scene-owner lines or the "return []" note).

    The context's last line is the target block, the others the review block (joined by ``\\n---\\n``), each
    under the reference's header. Candidate lines must already carry their short keys (``[R1] …``): the model
    never sees node ids. Two messages rather than the reference's several system messages, because some
    chat templates reject a system message after a user message.
    """
    if not isinstance(max_nodes, int) or isinstance(max_nodes, bool) or max_nodes < 1:
        raise InputError("max_nodes", f"must be an int in the range [1, inf). Got {max_nodes!r} instead.")
    for name, lines in (
        ("context_lines", context_lines),
        ("candidate_lines", candidate_lines),
        ("owner_lines", owner_lines),
    ):
        if not isinstance(lines, list) or not all(isinstance(x, str) for x in lines):
            raise InputError(name, "must be a list of strings")
    for i, line in enumerate(candidate_lines):
        if not re.match(r"\[R\d+\]", line):
            raise InputError(f"candidate_lines[{i}]", "must start with its short key, e.g. '[R1] …'")
    max_owners = min(4, max_nodes)
    system = _SYSTEM_PROMPT.format(max_nodes=max_nodes, max_owners=max_owners)

    blocks: list[str] = []
    lines = [line for line in context_lines if line.strip()]
    if len(lines) > 1:
        blocks.append(CONTEXT_REVIEW_HEADER + "\n" + "\n---\n".join(lines[:-1]))
    if lines:
        blocks.append(TARGET_HEADER + "\n" + lines[-1])
    blocks.append("## User message\n" + (user_message or "(empty)"))
    blocks.append("## Candidate memories\n" + ("\n".join(candidate_lines) if candidate_lines else "(none)"))
    blocks.append(f"## Graph stats\ncandidate_count={len(candidate_lines)}")
    blocks.append("## Scene-owner candidates\n" + ("\n".join(owner_lines) if owner_lines else _NO_OWNER_NOTE))
    blocks.append(
        f"Select at most {max_nodes} keys and at most {max_owners} owner keys. "
        "Answer with the JSON object only."
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(blocks)}]


# ----------------------------------------------------------------------------------------------------------
# Rerank answer
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OwnerScore:
    """One ``active_owner_scores`` entry; ``score`` clamped to [0, 1]."""

    owner_key: str
    score: float
    reason: str = ""


@dataclass(frozen=True)
class RerankAnswer:
    """A parsed rerank answer. Selection values are raw (``None`` when the key is absent): checking them is
    the rerank stage's job (reference §3.15 "Parsing")."""

    selected_keys: Any = None
    selected_ids: Any = None
    reason: str = ""
    active_owner_keys: Any = None
    active_owner_scores: tuple[OwnerScore, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def protocol(self) -> str | None:
        """``"candidate-keys-v1"`` (``selected_keys`` present), ``"legacy-selected-ids"`` or ``None``."""
        if "selected_keys" in self.raw:
            return "candidate-keys-v1"
        if "selected_ids" in self.raw:
            return "legacy-selected-ids"
        return None


def _clamp_score(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        score = float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(score):
        return None
    return min(1.0, max(0.0, score))


def _owner_scores(raw: Any) -> tuple[OwnerScore, ...]:
    out: list[OwnerScore] = []
    if isinstance(raw, Mapping):
        for key, value in raw.items():
            score = _clamp_score(value)
            if str(key).strip() and score is not None:
                out.append(OwnerScore(owner_key=str(key).strip(), score=score))
    elif isinstance(raw, list):
        for item in raw:
            if not isinstance(item, Mapping):
                continue
            key = next(
                (
                    item[k]
                    for k in ("ownerKey", "owner_key", "owner", "owner_name")
                    if isinstance(item.get(k), str) and item[k].strip()
                ),
                None,
            )
            score = _clamp_score(item.get("score"))
            if key is None or score is None:
                continue
            reason = item.get("reason")
            out.append(
                OwnerScore(
                    owner_key=key.strip(), score=score, reason=reason if isinstance(reason, str) else ""
                )
            )
    return tuple(out)


def parse_rerank_answer(text: str) -> RerankAnswer:
    """Parse the LLM's rerank answer (see the module docstring). Raises LLMUnavailable ``bad_payload`` /
    ``unknown_keys``."""
    objects = list(_json_objects(text))
    if not objects:
        shown = text[:200] if isinstance(text, str) else type(text).__name__
        raise LLMUnavailable("bad_payload", f"answer holds no JSON object: {shown!r}")
    # Prose may hold a stray "{}" before the answer: take the first object that looks like an answer.
    obj = next((o for o in objects if any(key in o for key in RERANK_KNOWN_KEYS)), objects[0])
    if not any(key in obj for key in RERANK_KNOWN_KEYS):
        raise LLMUnavailable(
            "unknown_keys",
            f"answer has none of {', '.join(RERANK_KNOWN_KEYS)}; got {', '.join(sorted(obj)[:10])}",
        )
    reason = obj.get("reason")
    return RerankAnswer(
        selected_keys=obj.get("selected_keys"),
        selected_ids=obj.get("selected_ids"),
        reason=reason if isinstance(reason, str) else ("" if reason is None else str(reason)),
        active_owner_keys=obj.get("active_owner_keys"),
        active_owner_scores=_owner_scores(obj.get("active_owner_scores")),
        raw=obj,
    )


def request_rerank(llm: ChatLLM, messages: list[dict[str, Any]], *, deadline_s: float) -> RerankAnswer:
    """One rerank call: ``llm.complete`` then :func:`parse_rerank_answer`. Raises LLMUnavailable."""
    return parse_rerank_answer(llm.complete(messages, deadline_s=deadline_s))
