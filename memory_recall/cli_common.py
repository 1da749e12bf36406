"""Helpers the command modules share (:mod:`memory_recall.cli`, :mod:`memory_recall.demo`, ``eval``, ``bench``).

* :class:`OneLineParser` — an argparse parser whose every error is one line on stderr (exit status 2), with the
  ``type=`` functions :func:`port_number`, :func:`int_in_range` and :func:`int_list`.
* :func:`command_settings`, :func:`open_store` — a command loads and validates its settings before it opens the
  store (a broken settings file changes nothing); the store is the one ``--data-dir`` names, else
  ``store.data_dir`` of the settings, ``$MEMORY_RECALL_DATA_DIR``, the per-user default.
* :func:`ingest_chats`, :func:`embed_chat`, :func:`embed_summary` — ingestion and embedding with progress bars
  that count the work as it is committed (:data:`BarFactory`; :func:`terminal_bars` draws them on stderr only
  when stderr is a terminal).
* :func:`cli_recall` — one recall through the controller, read-only unless ``persist``.
* :func:`by_score` (the order of every ranked table), :func:`display_width`, :func:`fit`, :func:`format_table`
  (cells padded by terminal columns: CJK and full-width characters take two, combining marks none).

Only the standard library is imported at module level, so ``memory-recall --version`` and ``--help`` load
nothing heavy; numpy, pydantic and the store are imported by the functions that use them.
"""

from __future__ import annotations

import argparse
import sys
import time
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TextIO

from memory_recall.errors import InputError

if TYPE_CHECKING:
    from memory_recall.controller import RecallResponse
    from memory_recall.ingest.messages import IngestReport
    from memory_recall.model.chat import ChatMessage
    from memory_recall.providers.cache import EmbedReport
    from memory_recall.providers.embedding import Embedder
    from memory_recall.settings import RecallSettings
    from memory_recall.store import Store

__all__ = [
    "EMBED_CHUNK",
    "Bar",
    "BarFactory",
    "Column",
    "IngestedChat",
    "OneLineParser",
    "by_score",
    "cli_recall",
    "command_settings",
    "display_width",
    "embed_chat",
    "embed_summary",
    "fit",
    "format_table",
    "ingest_chats",
    "int_in_range",
    "int_list",
    "open_store",
    "port_number",
    "terminal_bars",
]


# ---------------------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------------------


class OneLineParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors are one line, ``error: <prog>: <message>``, exit status 2.

    argparse prints its whole usage block before the error; ``--help`` still shows it. Sub-parsers made with
    ``add_subparsers().add_parser`` are of this class too (argparse uses the parent's class).
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message}\n")


def _parse_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def int_in_range(low: int, high: int) -> Callable[[str], int]:
    """A ``type=`` function accepting an int in ``[low, high]``; else argparse reports
    ``must be an int in the range [low, high]. Got '…' instead.``"""

    def parse(text: str) -> int:
        value = _parse_int(text)
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an int in the range [{low}, {high}]. Got {text!r} instead.")
        return value

    parse.__name__ = f"int in [{low}, {high}]"
    return parse


#: ``type=`` of a TCP port option: an int in [0, 65535] (0 = any free port), e.g. ``serve --port``.
port_number: Callable[[str], int] = int_in_range(0, 65535)


def int_list(low: int, high: int) -> Callable[[str], tuple[int, ...]]:
    """A ``type=`` function accepting comma-separated ints, each in ``[low, high]`` (at least one)."""

    def parse(text: str) -> tuple[int, ...]:
        values = [_parse_int(part) for part in text.split(",") if part.strip()]
        if not values or any(v is None or not low <= v <= high for v in values):
            raise argparse.ArgumentTypeError(
                f"must be comma-separated ints in the range [{low}, {high}]. Got {text!r} instead."
            )
        return tuple(v for v in values if v is not None)

    parse.__name__ = f"ints in [{low}, {high}]"
    return parse


# ---------------------------------------------------------------------------------------------------------------
# Settings and store
# ---------------------------------------------------------------------------------------------------------------


def command_settings(args: argparse.Namespace) -> RecallSettings:
    """The settings of a command: ``args.config`` (else ``$MEMORY_RECALL_CONFIG``) and the environment, loaded and
    validated once per namespace (kept as ``args.settings``). Raises :class:`~memory_recall.errors.ConfigError`."""
    settings: RecallSettings | None = getattr(args, "settings", None)
    if settings is None:
        from memory_recall.settings import load_settings

        settings = load_settings(getattr(args, "config", None))
        args.settings = settings
    return settings


def open_store(data_dir: str | None, settings: RecallSettings) -> Store:
    """The store of ``data_dir``, else of ``settings.store.data_dir``, else the default data directory."""
    from memory_recall.store import Store

    return Store.open(data_dir or settings.store.data_dir or None, busy_timeout=settings.store.busy_timeout_ms / 1000)


# ---------------------------------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------------------------------


class Bar(Protocol):
    """A progress bar: ``update(n)`` adds ``n`` units just done; ``close()`` ends it."""

    def update(self, n: int) -> object: ...

    def close(self) -> object: ...


#: ``bars(description, total, unit)`` opens a progress :class:`Bar` of ``total`` units.
BarFactory = Callable[[str, int, str], Bar]


class _NoBar:
    def update(self, n: int) -> None:
        return None

    def close(self) -> None:
        return None


def terminal_bars(quiet: bool = False, stream: TextIO | None = None) -> BarFactory:
    """tqdm bars on ``stream`` (default stderr) when it is a terminal and not ``quiet``; else bars that draw
    nothing (a log file or a pipe gets no carriage-return noise)."""
    out = sys.stderr if stream is None else stream
    isatty = getattr(out, "isatty", None)
    if quiet or not callable(isatty) or not isatty():
        return lambda desc, total, unit: _NoBar()

    def open_bar(desc: str, total: int, unit: str) -> Bar:
        from tqdm import tqdm

        bar: Bar = tqdm(total=total, desc=desc, unit=unit, file=out, leave=False, dynamic_ncols=True)
        return bar

    return open_bar


# ---------------------------------------------------------------------------------------------------------------
# Ingest and embedding
# ---------------------------------------------------------------------------------------------------------------


#: Nodes per embedding chunk of the command line: each chunk is committed, then advances the bar. With the local
#: engine on two cores 128 passages took 3.5, 4.1 and 4.4 s at 8, 16 and 64 per call, so small chunks cost no
#: throughput and the bar moves about twice a second (64-node chunks kept it still for half a minute on long
#: texts). Never above ``embedding.batch_size``.
EMBED_CHUNK = 16


@dataclass(frozen=True)
class IngestedChat:
    """One chat of :func:`ingest_chats`: messages given, the ingest report, seconds taken, and whether the chat
    exists in the store afterwards (``False``: nothing to write and no such chat before)."""

    chat_id: str
    messages: int
    report: IngestReport
    seconds: float
    exists: bool


def ingest_chats(
    store: Store, chats: Sequence[tuple[str, Sequence[ChatMessage]]], *, now_ms: int, bars: BarFactory
) -> list[IngestedChat]:
    """Ingest each chat in one transaction, in order. One bar counts messages: it advances by a chat's messages
    once that chat's transaction committed (a chat is written whole or not at all, so that is the done work)."""
    from memory_recall.ingest.messages import ingest_messages

    done: list[IngestedChat] = []
    bar = bars("ingest", sum(len(messages) for _, messages in chats), "msg")
    try:
        for chat_id, messages in chats:
            started = time.perf_counter()
            report = ingest_messages(store, chat_id, messages, now_ms=now_ms)
            took = time.perf_counter() - started
            done.append(IngestedChat(chat_id, len(messages), report, took, store.chat_version(chat_id) > 0))
            bar.update(len(messages))
    finally:
        bar.close()
    return done


def embed_chat(store: Store, chat_id: str, embedder: Embedder, *, bars: BarFactory, chunk: int) -> EmbedReport:
    """Embed the chat's nodes that lack a current vector, ``chunk`` nodes per committed step. The bar (units:
    nodes) opens with the number of nodes to embed before the first is sent, so its rate is timed from the start,
    and advances by each committed chunk; with nothing to embed no bar is opened."""
    from memory_recall.providers.cache import embed_missing

    bar: Bar | None = None
    shown = 0

    def started(total: int) -> None:
        nonlocal bar
        if total:  # nothing to embed: no bar flashing by
            bar = bars(f"embed {chat_id}", total, "node")

    def progress(done: int, total: int) -> None:
        nonlocal shown
        if bar is not None:
            bar.update(done - shown)
        shown = done

    try:
        return embed_missing(store, chat_id, embedder, progress=progress, started=started, batch_size=chunk)
    finally:
        if bar is not None:
            bar.close()


def embed_summary(store: Store, chat_id: str, settings: RecallSettings, *, skip: bool, bars: BarFactory) -> str:
    """Embed the chat with the configured embedder (see :func:`embed_chat`); returns a one-line summary."""
    if skip:
        return "embedding skipped (--no-embed)"
    from memory_recall.providers.embedding import make_embedder

    embedder = make_embedder(settings.embedding)
    if embedder is None:
        return "no embedder configured (install the 'local' extra): lexical recall only"
    report = embed_chat(store, chat_id, embedder, bars=bars, chunk=min(EMBED_CHUNK, settings.embedding.batch_size))
    return (
        f"embeddings ({embedder.model_id}): {report.embedded} embedded, {report.from_cache} from cache, "
        f"{report.up_to_date} already up to date"
    )


# ---------------------------------------------------------------------------------------------------------------
# Recall
# ---------------------------------------------------------------------------------------------------------------

#: Request fields the CLI fills from its options: a validation error names the option.
_OPTION_OF = {"active_region": "--region", "active_owner_keys": "--owner", "query_text": "--input", "chat_id": "--chat",
              "active_user_pov_owner": "--user-owner"}


def _context_messages(lines: Sequence[str], text: str) -> list[ChatMessage]:
    """``[user]: …`` / ``[assistant]: …`` context lines plus ``text`` as the newest user message."""
    from pydantic import ValidationError

    from memory_recall.model.chat import ChatMessage
    from memory_recall.model.graph import first_validation_error

    out = []
    for floor, line in enumerate(lines):
        role, _, body = line.partition(":")
        role = role.strip().strip("[]").lower()
        if role not in ("user", "assistant") or not body.strip():
            raise InputError(f"--recent[{floor}]", "expected '[user]: text' or '[assistant]: text'")
        try:
            out.append(ChatMessage(floor=floor, role="user" if role == "user" else "assistant", text=body.strip()))
        except ValidationError as exc:
            raise first_validation_error(exc, f"--recent[{floor}]") from None
    try:
        out.append(ChatMessage(floor=len(lines), role="user", text=text))
    except ValidationError as exc:
        raise first_validation_error(exc, "--input") from None
    return out


def cli_recall(
    data_dir: str | None,
    settings: RecallSettings,
    *,
    chat_id: str,
    text: str,
    recent: Sequence[str] = (),
    region: str = "",
    owners: Sequence[str] | None = None,
    persist: bool = False,
    user_owner: str = "",
) -> RecallResponse:
    """Recall ``text`` for ``chat_id`` through the controller, with no target floor (no record is read or written).

    ``persist=False`` (the default) is the controller's what-if path: no access reinforcement either, so the chat
    is exactly as before and a second run prints the same. ``persist=True`` writes the reinforcement a host's
    recall writes. ``owners`` are knowledge owner keys and ``user_owner`` the persona (``user:…`` key or name);
    an owner key the chat's knowledge state does not hold is an error naming ``--owner`` / ``--user-owner``.
    Raises :class:`InputError` naming the option (``--input``, ``--chat``, ``--region`` …).
    """
    from pydantic import ValidationError

    from memory_recall.controller import RecallController, RecallRequest
    from memory_recall.model.graph import first_validation_error
    from memory_recall.providers.embedding import make_embedder
    from memory_recall.providers.llm import make_llm

    if not text.strip():
        raise InputError("--input", "must not be empty")
    messages = _context_messages(recent, text)
    try:
        request = RecallRequest(
            chat_id=chat_id,
            messages=messages,
            query_text=text,
            active_region=region,
            active_owner_keys=list(owners) if owners else None,
            active_user_pov_owner=user_owner,
            persist=persist,
        )
    except ValidationError as exc:
        err = first_validation_error(exc)
        head, _, rest = err.field.partition(".")
        raise InputError(_OPTION_OF.get(head, head) + (f".{rest}" if rest else ""), err.reason) from None
    store = open_store(data_dir, settings)
    try:
        if store.chat_version(chat_id) == 0:
            raise InputError("--chat", f"no chat {chat_id!r} in this store")
        controller = RecallController(
            store, settings, embedder=make_embedder(settings.embedding), llm=make_llm(settings.llm)
        )
        try:
            return controller.run_recall(request)
        except InputError as exc:  # name the option, not the request field
            head, bracket, rest = exc.field.partition("[")
            if head in _OPTION_OF:
                raise InputError(_OPTION_OF[head] + (f"[{rest}" if bracket else ""), exc.reason) from None
            raise
    finally:
        store.close()


# ---------------------------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------------------------


def by_score(selected: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Memories in the order of a ranked table: by the score as printed (4 decimals), highest first, ties by
    node id. Ordering by the printed value keeps rows that print the same score in node id order."""
    return sorted(selected, key=lambda m: (-float(f"{float(m['score']):.4f}"), str(m["node_id"])))


def _char_width(ch: str) -> int:
    if unicodedata.category(ch) in ("Mn", "Me", "Cf"):  # combining and enclosing marks, zero-width format chars
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def display_width(text: str) -> int:
    """Terminal columns ``text`` takes: East Asian wide and full-width characters (``east_asian_width`` W or F)
    two, combining marks and format characters none, every other character one.

    >>> display_width("Erin"), display_width("林舟"), display_width("ＡＢ"), display_width("e\\u0301")
    (4, 4, 4, 1)
    """
    return sum(_char_width(ch) for ch in text)


_MARK = "..."  # ASCII: "…" is East Asian ambiguous, two columns wide in some CJK terminals


def fit(text: str, width: int, align: str = "<") -> str:
    """``text`` in exactly ``width`` terminal columns: control characters become spaces, a longer text is cut
    (ending ``...``), a shorter one padded with spaces (``align`` ``"<"`` left, ``">"`` right)."""
    text = "".join(" " if unicodedata.category(ch) == "Cc" else ch for ch in text)
    if display_width(text) > width:
        room = width - len(_MARK) if width > len(_MARK) else width
        kept: list[str] = []
        used = 0
        for ch in text:
            w = _char_width(ch)
            if used + w > room:
                break
            kept.append(ch)
            used += w
        text = "".join(kept) + (_MARK if width > len(_MARK) else "")
    pad = " " * (width - display_width(text))
    return pad + text if align == ">" else text + pad


@dataclass(frozen=True)
class Column:
    """A table column: its header, alignment (``"<"`` or ``">"``) and the most columns a cell may take."""

    header: str
    align: str = "<"
    max_width: int | None = None


def format_table(columns: Sequence[Column], rows: Iterable[Sequence[object]], *, gap: str = "  ") -> list[str]:
    """The header line and one line per row. Each column is as wide (in terminal columns) as its widest cell or
    header, at most ``max_width``; every cell, the last included, is padded to it, so every line of the table has
    the same display width (CJK text included)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = []
    for i, col in enumerate(columns):
        width = max([display_width(col.header), *(display_width(row[i]) for row in cells)])
        widths.append(min(width, col.max_width) if col.max_width is not None else width)
    lines = [gap.join(fit(col.header, w, col.align) for col, w in zip(columns, widths, strict=True))]
    for row in cells:
        lines.append(gap.join(fit(cell, w, col.align) for cell, col, w in zip(row, columns, widths, strict=True)))
    return lines
