"""Chat messages as the host sends them (one per floor)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator

__all__ = ["MAX_MESSAGE_CHARS", "NUL_FREE_SCHEMA", "ChatMessage", "GenerationType", "NulFreeStr"]

#: Longest accepted message text (characters). Longer messages are rejected, not truncated silently.
MAX_MESSAGE_CHARS = 200_000
#: JSON Schema of the strings :func:`reject_nul` accepts, to merge into a string schema (shown in the OpenAPI
#: schema; the check itself is the validator, which names the field). ``not`` a pattern rather than an anchored
#: ``[^\x00]*``: schema tools fold ``maxLength`` into a pattern's quantifier, and ``{0,200000}`` breaks them.
NUL_FREE_SCHEMA: dict[str, Any] = {"not": {"pattern": "\\x00"}}
#: A string (never a number or a boolean) whose schema states that it holds no NUL; pair it with
#: :func:`reject_nul` / :func:`reject_nul_items` in a validator.
NulFreeStr = Annotated[StrictStr, Field(json_schema_extra=NUL_FREE_SCHEMA)]



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

    # Strict types: a request body's ``false`` or ``"3"`` is not a floor, ``4.0`` neither (no coercion).
    floor: StrictInt = Field(ge=0, le=10_000_000)
    role: Literal["user", "assistant", "system"]
    speaker: NulFreeStr = Field(default="", max_length=200)
    text: NulFreeStr = Field(max_length=MAX_MESSAGE_CHARS)
    hidden: StrictBool = False
    date: NulFreeStr = Field(default="", max_length=200)
    send_time_ms: StrictInt | None = Field(default=None, ge=0, le=253_402_300_799_999)  # up to year 9999
    evidence_id: NulFreeStr = Field(default="", max_length=200)
    attachments: tuple[NulFreeStr, ...] = ()
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
