"""Chat messages as the host sends them (one per floor)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["MAX_MESSAGE_CHARS", "ChatMessage", "GenerationType"]

#: Longest accepted message text (characters). Longer messages are rejected, not truncated silently.
MAX_MESSAGE_CHARS = 200_000



def reject_nul(value: str) -> str:
    """``value`` unchanged, or ``ValueError`` when it holds a NUL (the store cannot read one back)."""
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


def reject_nul_items(values: Any) -> Any:
    """``values`` unchanged, or ``ValueError`` naming the first item that holds a NUL."""
    for i, item in enumerate(values or ()):
        if "\x00" in item:
            raise ValueError(f"[{i}]: must not contain NUL characters")
    return values

class GenerationType(StrEnum):
    """Host generation types (reference §2.1)."""

    NORMAL = "normal"
    CONTINUE = "continue"
    REGENERATE = "regenerate"
    SWIPE = "swipe"
    QUIET = "quiet"
    IMPERSONATE = "impersonate"


class ChatMessage(BaseModel):
    """One chat message (a "floor").

    ``floor`` is the message index in the chat (0-based). ``date`` is the message's story or wall-clock date as
    the source gives it (free text, e.g. LoCoMo's ``"1:56 pm on 8 May, 2023"``); ``evidence_id`` is a source
    locator kept on the message node (LoCoMo ``dia_id``); ``attachments`` holds captions of shared images.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    floor: int = Field(ge=0, le=10_000_000)
    role: Literal["user", "assistant", "system"]
    speaker: str = Field(default="", max_length=200)
    text: str = Field(max_length=MAX_MESSAGE_CHARS)
    hidden: bool = False
    date: str = Field(default="", max_length=200)
    send_time_ms: int | None = Field(default=None, ge=0)
    evidence_id: str = Field(default="", max_length=200)
    attachments: tuple[str, ...] = ()
    extra: dict[str, Any] = Field(default_factory=dict)

    # Every string that reaches a node (date → fields.date and story time, captions → summary) is checked:
    # ingest builds nodes without re-validating them, and the store refuses to read a NUL back.
    @field_validator("text", "speaker", "date", "evidence_id")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        return reject_nul(value)

    @field_validator("attachments")
    @classmethod
    def _no_nul_captions(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return reject_nul_items(value)
