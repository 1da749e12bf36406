"""Command line: ``memory-recall <command>``.

Every misuse prints one line on stderr and exits with status 2: argument errors (``error: memory-recall serve:
argument --port: …``, :class:`~memory_recall.cli_common.OneLineParser`) and every known error of the package
(``error: <field>: <reason>``, the :class:`~memory_recall.errors.MemoryRecallError` tree, caught in :func:`main`
only). Unexpected errors still exit non-zero with a traceback, because they are bugs.

A command loads and validates its settings (``--config``, the environment) before it touches the store, so a
broken settings file changes nothing. ``recall`` and ``explain`` are read-only unless ``--persist`` is given.
Module-level imports are light: ``--version`` and ``--help`` answer without loading numpy, scipy or pydantic.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from memory_recall.cli_common import (
    Column,
    OneLineParser,
    by_score,
    cli_recall,
    command_settings,
    embed_summary,
    format_table,
    ingest_chats,
    open_store,
    port_number,
    terminal_bars,
)
from memory_recall.errors import InputError, MemoryRecallError

__all__ = ["main"]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _open_store(args: argparse.Namespace) -> Any:
    return open_store(getattr(args, "data_dir", None), _settings(args))


def _settings(args: argparse.Namespace) -> Any:
    """The command's settings, loaded and validated by :func:`main` before the command runs."""
    return command_settings(args)


def _read_json(path: str) -> Any:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise InputError(str(p), "file not found") from None
    except IsADirectoryError:
        raise InputError(str(p), "is a directory, not a JSON file") from None
    except OSError as exc:
        raise InputError(str(p), f"cannot read file: {exc.strerror}") from None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(str(p), f"not valid JSON: {exc}") from None


def _check_chat_option(chat_id: str) -> str:
    from memory_recall.store.sqlite import validate_chat_id

    return validate_chat_id(chat_id)


def _output_file(path: str) -> Path:
    """``--out`` of a command that writes one file: checked before any work, so a typo costs no run."""
    out = Path(path)
    if out.is_dir():
        raise InputError("--out", f"{path} is a directory; name a file in it")
    parent = out.parent
    if not parent.is_dir():
        raise InputError("--out", f"no directory {str(parent)!r} to write {out.name} into")
    return out


def _write_text(out: Path, text: str) -> None:
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError("--out", f"cannot write {out}: {exc.strerror}") from None


# ---------------------------------------------------------------------------------------------------------------
# commands
# ---------------------------------------------------------------------------------------------------------------


def cmd_ingest(args: argparse.Namespace) -> int:
    """Ingest a chat file, or every conversation of a LoCoMo file, then embed each chat written.

    A chat with no user or assistant message writes nothing and creates no chat; it is reported on one line as
    ``nothing to ingest`` and the exit status stays 0 (an empty chat is no misuse, but nothing is claimed).
    """
    settings = _settings(args)
    if args.chat:
        _check_chat_option(args.chat)
    chats = _chats_from_json(_read_json(args.file), args)
    if not chats:
        print(f"{args.file}: no conversations: nothing to ingest, no chat written")
        return 0
    bars = terminal_bars(args.quiet)
    store = _open_store(args)
    try:
        ingested = ingest_chats(store, chats, now_ms=_now_ms(), bars=bars)
        for item in ingested:
            if not item.exists:
                what = "no messages" if item.messages == 0 else f"{item.messages} messages, none from user or assistant"
                print(f"{item.chat_id}: {what}: nothing to ingest, no chat written")
                continue
            stats = store.stats(item.chat_id)
            print(
                f"{item.chat_id}: {item.messages} messages → {stats['node_count']} nodes, {stats['edge_count']} "
                f"edges (+{item.report.nodes_added} nodes, +{item.report.edges_added} edges in {item.seconds:.2f}s)"
            )
        for item in ingested:
            if item.exists:
                print(f"{item.chat_id}: {embed_summary(store, item.chat_id, settings, skip=args.no_embed, bars=bars)}")
    finally:
        store.close()
    return 0


def _json_kind(value: Any) -> str:
    kinds = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return kinds.get(type(value), "number")


def _chats_from_json(data: Any, args: argparse.Namespace) -> list[tuple[str, list[Any]]]:
    """A chat file (``{"chat_id", "messages"}``) or a LoCoMo file (a list of conversations)."""
    from memory_recall.model.chat import ChatMessage
    from memory_recall.model.graph import first_validation_error

    if isinstance(data, list):
        from memory_recall.ingest.locomo import parse_locomo

        conversations = parse_locomo(data)
        if args.chat and len(conversations) != 1:
            picked = [c for c in conversations if c.sample_id == args.chat]
            if not picked:
                raise InputError("--chat", f"no conversation {args.chat!r} in this LoCoMo file")
            conversations = picked
        return [(c.sample_id, list(c.messages)) for c in conversations]
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise InputError(args.file, "expected a chat object with a 'messages' list or a LoCoMo list")
    chat_id = args.chat or data.get("chat_id")
    if not chat_id:
        raise InputError("--chat", "required: the file names no chat_id")
    if not isinstance(chat_id, str):
        raise InputError(args.file, f"'chat_id' must be a string, got a JSON {_json_kind(chat_id)}")
    _check_chat_option(chat_id)
    from pydantic import ValidationError

    messages = []
    for i, raw in enumerate(data["messages"]):
        try:
            messages.append(ChatMessage.model_validate(raw))
        except ValidationError as exc:
            raise first_validation_error(exc, f"messages[{i}]") from None
    return [(chat_id, messages)]


def cmd_import(args: argparse.Namespace) -> int:
    from memory_recall.ingest.stbme import import_stbme_report

    settings = _settings(args)
    _check_chat_option(args.chat)
    data = _read_json(args.file)
    if not isinstance(data, dict):
        raise InputError(args.file, f"expected an ST-BME graph export (a JSON object), got a JSON {_json_kind(data)}")
    try:
        report = import_stbme_report(data, now_ms=_now_ms())
    except InputError as exc:  # its fields are paths inside the file: say which file
        raise InputError(f"{args.file}: {exc.field}" if exc.field else args.file, exc.reason) from None
    store = _open_store(args)
    try:
        store.replace_graph(args.chat, report.graph)
        for warning in report.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        print(f"{args.chat}: imported {len(report.graph.nodes)} nodes, {len(report.graph.edges)} edges")
        bars = terminal_bars(args.quiet)
        print(f"{args.chat}: {embed_summary(store, args.chat, settings, skip=args.no_embed, bars=bars)}")
    finally:
        store.close()
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from memory_recall.ingest.stbme import export_stbme

    _check_chat_option(args.chat)
    out = _output_file(args.out) if args.out else None
    store = _open_store(args)
    try:
        if store.chat_version(args.chat) == 0:
            raise InputError("--chat", f"no chat {args.chat!r} in this store")
        exported = export_stbme(store.load_graph(args.chat))
    finally:
        store.close()
    text = json.dumps(exported, ensure_ascii=False, indent=2, sort_keys=True)
    if out is not None:
        _write_text(out, text + "\n")
        print(f"{args.chat}: wrote {len(exported['nodes'])} nodes, {len(exported['edges'])} edges to {args.out}")
    else:
        print(text)
    return 0


#: What ``stats`` says about ``version`` (the store hands out versions from one clock; sqlite.py "Versions").
VERSION_NOTE = (
    "version: the store's write counter at the chat's last write. One counter serves every chat of the store, "
    "so it is not a count of this chat's writes (cached snapshots and recall records are keyed on it)."
)


def _utc(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def cmd_stats(args: argparse.Namespace) -> int:
    if args.chat:
        _check_chat_option(args.chat)
    store = _open_store(args)
    try:
        chats = store.list_chats()
        if args.chat:
            info = next((c for c in chats if c.chat_id == args.chat), None)
            if info is None:
                raise InputError("--chat", f"no chat {args.chat!r} in this store")
            data = store.stats(args.chat)
            data["last_write_utc"] = _utc(info.updated_at)
            data["version_note"] = VERSION_NOTE
            print(json.dumps(data, ensure_ascii=False, indent=2, sort_keys=True))
            return 0
    finally:
        store.close()
    if not chats:
        print("no chats in this store")
        return 0
    columns = (
        Column("chat", max_width=48), Column("nodes", ">"), Column("edges", ">"), Column("last write (UTC)"),
        Column("version", ">"),
    )
    rows = [(c.chat_id, c.node_count, c.edge_count, _utc(c.updated_at), c.version) for c in chats]
    for line in format_table(columns, rows):
        print(line)
    print(VERSION_NOTE)
    return 0


def cmd_providers_check(args: argparse.Namespace) -> int:
    from memory_recall.providers.check import check_providers

    statuses = check_providers(_settings(args))
    for status in statuses:
        print(status.line())
    return 0


def _run_recall(args: argparse.Namespace) -> Any:
    """Recall ``args.input`` for ``args.chat`` through the controller (no target floor: no record; read-only
    unless ``args.persist``). Returns the controller's RecallResponse."""
    return cli_recall(
        getattr(args, "data_dir", None), _settings(args), chat_id=args.chat, text=args.input,
        recent=args.recent or (), region=args.region or "", owners=args.owner, persist=args.persist,
        user_owner=args.user_owner or "",
    )


def _fmt(value: float) -> str:
    return f"{value:.4f}"


def cmd_recall(args: argparse.Namespace) -> int:
    response = _run_recall(args)
    if args.json:
        print(response.model_dump_json(indent=2))
        return 0
    status = response.retrieval_status + (f" ({response.failure_category})" if response.failure_category else "")
    print(
        f"chat {response.chat_id} v{response.graph_version}: {response.status} ({response.reason}), "
        f"{len(response.selected)} memories, retrieval {status}"
    )
    columns = (
        Column("score", ">"), Column("order", ">"), Column("type"), Column("node", max_width=40),
        Column("label", max_width=80),
    )
    rows = [(_fmt(m["score"]), m["rank"], m["type"], m["node_id"], m["label"]) for m in by_score(response.selected)]
    for line in format_table(columns, rows):
        print(line)
    if response.injection_text:
        print()
        print(response.injection_text)
    return 0


def _explain_memory(mem: Mapping[str, Any]) -> list[str]:
    """One memory's score as arithmetic: ``value × weight × multiplier = contribution`` per part, the
    contributions adding up to the score (the Explanation's contract), and the multiplier as its factors."""
    import math

    expl = mem["explanation"]
    factors: dict[str, float] = expl["multipliers"]
    multiplier = math.prod(factors.values()) if factors else 1.0
    lines = [
        f"{mem['node_id']} ({mem['type']}, origin {mem['origin']}, order {mem['rank']}): "
        f"score {_fmt(expl['score'])} [{expl['score_kind']}], the sum of its parts"
    ]
    rows = []
    for part in expl["parts"]:
        # The Explanation's weight has the multiplier folded in; shown apart, it is the part's hybrid weight share.
        share = _fmt(part["weight"] / multiplier) if multiplier else "n/a"
        rows.append((part["name"], _fmt(part["value"]), "×", share, "×", _fmt(multiplier), "=",
                     _fmt(part["contribution"])))
    rows.append(("score", "", "", "", "", "", "=", _fmt(expl["score"])))
    columns = (
        Column("part"), Column("value", ">"), Column(""), Column("weight", ">"), Column(""),
        Column("multiplier", ">"), Column(""), Column("contribution", ">"),
    )
    lines += ["    " + line for line in format_table(columns, rows)]
    product = " × ".join(f"{name} {_fmt(value)}" for name, value in factors.items()) or "1 (no multipliers)"
    lines.append(f"    multiplier {_fmt(multiplier)} = {product}")
    note = expl.get("notes", {}).get("note")
    if note:
        lines.append(f"    note: {note}")
    return lines


def cmd_explain(args: argparse.Namespace) -> int:
    response = _run_recall(args)
    columns = (
        Column("stage"), Column("ms", ">"), Column("in", ">"), Column("out", ">"),
        Column("score kind (direction)"), Column("skip reason"),
    )
    rows = []
    for trace in response.traces:
        kind = f"{trace['score_kind']} ({trace['score_direction'].replace('_is_better', '')})"
        rows.append((trace["name"], f"{trace['elapsed_ms']:.2f}", trace["count_in"], trace["count_out"], kind,
                     trace["skip_reason"] if trace["skipped"] else ""))
    for line in format_table(columns, rows):
        print(line)
    print()
    print(f"{len(response.selected)} memories by score, highest first (order: position in the selection)")
    for i, mem in enumerate(by_score(response.selected), start=1):
        lines = _explain_memory(mem)
        print(f"#{i} {lines[0]}")
        for line in lines[1:]:
            print(line)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from memory_recall.service import serve

    settings = _settings(args)
    serve(
        args.host or settings.service.host,
        args.port if args.port is not None else settings.service.port,  # 0: any free port
        args.data_dir,
        args.token,
        settings,
        token_file=args.token_file,
        log_level=args.log_level,
    )
    return 0


def _passthrough(command: str, argv: list[str]) -> int:
    """``bench`` and ``eval`` own their argument parsers (and --help)."""
    if command == "bench":
        from memory_recall.bench import main as sub_main
    else:
        from memory_recall.eval.runner import main as sub_main
    return int(sub_main(argv) or 0)


def cmd_demo(args: argparse.Namespace) -> int:
    from memory_recall.demo import run_demo

    return run_demo(args)


# ---------------------------------------------------------------------------------------------------------------


class _VersionAction(argparse.Action):
    """``--version``: the installed distribution's version, looked up only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show the version and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"{parser.prog} {_version()}")  # stdout, as argparse's own version action
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="memory-recall", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", help="store directory (default: $MEMORY_RECALL_DATA_DIR or per-user)")
        p.add_argument("--config", help="TOML settings file (default: $MEMORY_RECALL_CONFIG)")
        p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")

    def add(name: str, fn: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        common(p)
        p.set_defaults(func=fn)
        return p

    p = add("demo", cmd_demo, "ingest the bundled demo chat and recall for its last user turn")
    p.add_argument("--no-embed", action="store_true", help="skip embeddings (lexical recall only)")

    p = add(
        "ingest", cmd_ingest,
        "ingest chat messages (chat JSON or a LoCoMo file) into the store; a chat without user or assistant "
        "messages is reported as 'nothing to ingest' (exit 0) and no chat is written",
    )
    p.add_argument("file", help="chat JSON ({chat_id, messages}) or LoCoMo JSON (list of conversations)")
    p.add_argument("--chat", help="chat id (default: the file's chat_id / each LoCoMo sample_id)")
    p.add_argument("--no-embed", action="store_true", help="skip embeddings")

    p = add("import", cmd_import, "import an ST-BME graph export into a chat (replaces its graph)")
    p.add_argument("file")
    p.add_argument("--chat", required=True)
    p.add_argument("--no-embed", action="store_true", help="skip embeddings")

    p = add("export", cmd_export, "export a chat's graph as ST-BME JSON")
    p.add_argument("--chat", required=True)
    p.add_argument("--out", help="output file in an existing directory (default: stdout)")

    p = add("stats", cmd_stats, "list chats, or show one chat's counts (version: the store's write counter)")
    p.add_argument("--chat")

    p = add("serve", cmd_serve, "run the HTTP service for chat hosts (OpenAPI docs at /docs)")
    p.add_argument("--host", help="bind address (default 127.0.0.1; other addresses need a token)")
    p.add_argument("--port", type=port_number, help="port, 0-65535 (default 8765; 0: any free port)")
    secret = p.add_mutually_exclusive_group()
    secret.add_argument(
        "--token-file", metavar="PATH",
        help="file holding the bearer token clients must send (default $MEMORY_RECALL_SERVICE__TOKEN_FILE)",
    )
    secret.add_argument(
        "--token",
        help="the bearer token itself: visible to every user in ps; prefer --token-file or "
        "$MEMORY_RECALL_SERVICE__TOKEN (default)",
    )
    p.add_argument(
        "--log-level", default="info", choices=("critical", "error", "warning", "info", "debug", "trace"),
        help="log level of uvicorn and memory-recall (default info; query and message text only at debug)",
    )

    for name, fn, help_ in (
        ("recall", cmd_recall, "recall memories for an input text and print them by score, highest first "
         "(order: position in the selection), then the injection block; read-only unless --persist"),
        ("explain", cmd_explain, "recall, then print every stage's trace and each memory's score as arithmetic: "
         "value × weight × multiplier = contribution, the contributions adding up to the score; read-only "
         "unless --persist"),
    ):
        p = add(name, fn, help_)
        p.add_argument("--chat", required=True)
        p.add_argument("--input", required=True, help="the user's message to recall for")
        p.add_argument("--recent", action="append", help="a recent context line '[user]: …' (repeatable)")
        p.add_argument("--region", help="active region")
        p.add_argument("--owner", action="append",
                       help="active scene owner key, e.g. character:erin (repeatable; must be a key of the chat's "
                            "knowledge state)")
        p.add_argument("--user-owner", help="the user persona whose POV memories the block shows, e.g. user:wren")
        p.add_argument(
            "--persist", action="store_true",
            help="write the access reinforcement a host's recall writes (default: change nothing in the store)",
        )
        if name == "recall":
            p.add_argument("--json", action="store_true", help="print the whole result as JSON")

    # Listed for --help; dispatched before parsing (they own their arguments).
    sub.add_parser("bench", help="recall benchmark on synthetic graphs (memory-recall bench --help)")
    sub.add_parser("eval", help="offline recall evaluation: eval locomo PATH … | eval fixtures")

    providers = sub.add_parser("providers", help="embedding and LLM providers")
    psub = providers.add_subparsers(dest="providers_command", required=True, metavar="{check}")
    p = psub.add_parser("check", help="report what is configured and whether each endpoint answers")
    common(p)
    p.set_defaults(func=cmd_providers_check)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("memory-recall")
    except PackageNotFoundError:
        return "unknown"


def _pin_blas() -> None:
    """One BLAS thread: byte-identical recalls on any core count (:mod:`memory_recall.blas`). numpy is imported
    first because threadpoolctl limits only the BLAS libraries already loaded."""
    import numpy  # noqa: F401

    from memory_recall.blas import pin_single_thread

    pin_single_thread()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``memory-recall`` console script; returns the exit status (2: a misuse, one line)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "numpy" in sys.modules:  # a host program loaded BLAS already: pinned before anything of ours runs
        _pin_blas()
    try:
        if argv and argv[0] in ("bench", "eval"):
            _pin_blas()
            return _passthrough(argv[0], argv[1:])
        # --version and --help exit in here, before anything heavy is imported.
        args = _parser().parse_args(argv)
        _pin_blas()
        command_settings(args)  # loaded and validated before any command touches the store
        return int(args.func(args))
    except MemoryRecallError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Output piped into e.g. `head`, which stopped reading: not an error of ours.
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
