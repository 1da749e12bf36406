"""Persisted recall records, one per chat and user floor (reference §2.4, recall-spec departure 7)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["PersistedRecall", "estimate_tokens"]


def estimate_tokens(text: str) -> int:
    """Reference token estimate: ``ceil(cjk/2 + other/4)``, cjk = characters in U+4E00–U+9FFF."""
    cjk = sum(1 for ch in text if "\u4e00" <= ch <= "\u9fff")
    other = len(text) - cjk
    total = cjk / 2 + other / 4
    whole = int(total)
    return whole if whole == total else whole + 1


class PersistedRecall(BaseModel):
    """The recall computed for one user floor, replayed byte for byte on reroll/swipe/regenerate/continue.

    ``bound_user_floor_text`` is the floor text at recall time (the staleness key); ``graph_version`` is the
    chat's store version the recall was computed on; ``generation_count`` counts replays.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    chat_id: str
    user_floor: int = Field(ge=0)
    injection_text: str = Field(min_length=1)
    blocks: list[dict[str, Any]] = Field(default_factory=list)
    selected_node_ids: tuple[str, ...] = ()
    recall_input: str = ""
    recall_source: str = ""
    hook_name: str = ""
    token_estimate: int = Field(default=0, ge=0)
    bound_user_floor_text: str = ""
    authoritative_input_used: bool = False
    graph_version: int = Field(default=0, ge=0)
    generation_count: int = Field(default=0, ge=0)
    manually_edited: bool = False
    created_at: int = Field(default=0, ge=0)
    updated_at: int = Field(default=0, ge=0)

    @field_validator("injection_text")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("must not be blank")
        return value

    @field_validator("selected_node_ids", mode="before")
    @classmethod
    def _clean_ids(cls, value: Any) -> tuple[str, ...]:
        out: list[str] = []
        for v in value or ():
            if isinstance(v, str) and v.strip() and v.strip() not in out:
                out.append(v.strip())
        return tuple(out)
