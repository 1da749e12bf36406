"""Command line: ``memory-recall <command>``.

Every command prints one clear line on a known error (``error: <field>: <reason>``) and exits with status 2;
unexpected errors still exit non-zero with a traceback, because they are bugs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from memory_recall.blas import pin_single_thread
from memory_recall.errors import InputError, MemoryRecallError

__all__ = ["main"]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _open_store(args: argparse.Namespace) -> Any:
    from memory_recall.store import Store, default_data_dir

    return Store.open(default_data_dir(args.data_dir))


def _settings(args: argparse.Namespace) -> Any:
    from memory_recall.settings import load_settings

    return load_settings(getattr(args, "config", None))


def _read_json(path: str) -> Any:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise InputError(str(p), "file not found") from None
    except OSError as exc:
        raise InputError(str(p), f"cannot read file: {exc.strerror}") from None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(str(p), f"not valid JSON: {exc}") from None


def _progress(desc: str, total: int, quiet: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="item", disable=quiet or total < 50, file=sys.stderr, leave=False)


def _embed(store: Any, chat_id: str, args: argparse.Namespace) -> str:
    """Embed every node of the chat that lacks a vector for the configured model; returns a summary."""
    if getattr(args, "no_embed", False):
        return "embedding skipped (--no-embed)"
    from memory_recall.providers.cache import embed_missing
    from memory_recall.providers.embedding import make_embedder

    embedder = make_embedder(_settings(args).embedding)
    if embedder is None:
        return "no embedder configured (install the 'local' extra): lexical recall only"
    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = _progress(f"embedding {chat_id}", total, args.quiet)
        bar.n = done
        bar.refresh()

    report = embed_missing(store, chat_id, embedder, progress=progress)
    if bar is not None:
        bar.close()
    return (
        f"embeddings ({embedder.model_id}): {report.embedded} embedded, {report.from_cache} from cache, "
        f"{report.up_to_date} already up to date"
    )


# ---------------------------------------------------------------------------------------------------------------
# commands
# ---------------------------------------------------------------------------------------------------------------


def cmd_ingest(args: argparse.Namespace) -> int:
    from memory_recall.ingest.messages import ingest_messages

    data = _read_json(args.file)
    chats = _chats_from_json(data, args)
    store = _open_store(args)
    try:
        for chat_id, messages in chats:
            started = time.perf_counter()
            report = ingest_messages(store, chat_id, messages, now_ms=_now_ms())
            took = time.perf_counter() - started
            stats = store.stats(chat_id)
            print(
                f"{chat_id}: {len(messages)} messages → {stats['node_count']} nodes, {stats['edge_count']} edges "
                f"(+{report.nodes_added} nodes, +{report.edges_added} edges in {took:.2f}s)"
            )
            print(f"{chat_id}: {_embed(store, chat_id, args)}")
    finally:
        store.close()
    return 0


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
    from pydantic import ValidationError

    messages = []
    for i, raw in enumerate(data["messages"]):
        try:
            messages.append(ChatMessage.model_validate(raw))
        except ValidationError as exc:
            raise first_validation_error(exc, f"messages[{i}]") from None
    return [(str(chat_id), messages)]


def cmd_import(args: argparse.Namespace) -> int:
    from memory_recall.ingest.stbme import import_stbme_report

    data = _read_json(args.file)
    report = import_stbme_report(data, now_ms=_now_ms())
    store = _open_store(args)
    try:
        store.replace_graph(args.chat, report.graph)
        for warning in report.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        print(f"{args.chat}: imported {len(report.graph.nodes)} nodes, {len(report.graph.edges)} edges")
        print(f"{args.chat}: {_embed(store, args.chat, args)}")
    finally:
        store.close()
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from memory_recall.ingest.stbme import export_stbme

    store = _open_store(args)
    try:
        if store.chat_version(args.chat) == 0:
            raise InputError("--chat", f"no chat {args.chat!r} in this store")
        exported = export_stbme(store.load_graph(args.chat))
    finally:
        store.close()
    text = json.dumps(exported, ensure_ascii=False, indent=2, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
        print(f"{args.chat}: wrote {len(exported['nodes'])} nodes, {len(exported['edges'])} edges to {args.out}")
    else:
        print(text)
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    store = _open_store(args)
    try:
        if args.chat:
            if store.chat_version(args.chat) == 0:
                raise InputError("--chat", f"no chat {args.chat!r} in this store")
            print(json.dumps(store.stats(args.chat), ensure_ascii=False, indent=2, sort_keys=True))
            return 0
        chats = store.list_chats()
        if not chats:
            print("no chats in this store")
            return 0
        print(f"{'chat':<32} {'version':>8} {'nodes':>8} {'edges':>8}")
        for info in chats:
            print(f"{info.chat_id:<32} {info.version:>8} {info.node_count:>8} {info.edge_count:>8}")
    finally:
        store.close()
    return 0


def cmd_providers_check(args: argparse.Namespace) -> int:
    from memory_recall.providers.check import check_providers

    statuses = check_providers(_settings(args))
    for status in statuses:
        print(status.line())
    return 0


def _recent_messages(lines: Sequence[str], text: str) -> list[Any]:
    """``[user]: …`` / ``[assistant]: …`` context lines plus the input as the newest user message."""
    from memory_recall.model.chat import ChatMessage

    out = []
    for floor, line in enumerate(lines):
        role, _, body = line.partition(":")
        role = role.strip().strip("[]").lower()
        if role not in ("user", "assistant") or not body.strip():
            raise InputError(f"--recent[{floor}]", "expected '[user]: text' or '[assistant]: text'")
        out.append(ChatMessage(floor=floor, role="user" if role == "user" else "assistant", text=body.strip()))
    out.append(ChatMessage(floor=len(lines), role="user", text=text))
    return out


def _run_recall(args: argparse.Namespace) -> Any:
    """Recall ``args.input`` for ``args.chat`` through the controller (nothing is persisted: no target floor).

    Returns the controller's RecallResponse."""
    from memory_recall.controller import RecallController, RecallRequest
    from memory_recall.providers.embedding import make_embedder
    from memory_recall.providers.llm import make_llm

    settings = _settings(args)
    if not args.input.strip():
        raise InputError("--input", "must not be empty")
    store = _open_store(args)
    try:
        if store.chat_version(args.chat) == 0:
            raise InputError("--chat", f"no chat {args.chat!r} in this store")
        controller = RecallController(
            store, settings, embedder=make_embedder(settings.embedding), llm=make_llm(settings.llm)
        )
        request = RecallRequest(
            chat_id=args.chat,
            messages=_recent_messages(args.recent or (), args.input),
            query_text=args.input,
            active_region=args.region or "",
            active_owner_keys=list(args.owner) if args.owner else None,
        )
        return controller.run_recall(request)
    finally:
        store.close()


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
    print(f"{'#':>3}  {'score':>7}  {'type':<11} {'node':<28} label")
    for mem in response.selected:
        label = str(mem["label"]).replace("\n", " ")
        print(f"{mem['rank']:>3}  {_fmt(mem['score']):>7}  {mem['type']:<11} {mem['node_id']:<28} {label[:80]}")
    if response.injection_text:
        print()
        print(response.injection_text)
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    response = _run_recall(args)
    print(f"{'stage':<18} {'ms':>8} {'in':>6} {'out':>6}  {'score':<22} skip / notes")
    for trace in response.traces:
        kind = f"{trace['score_kind']} ({trace['score_direction'].replace('_is_better', '')})"
        extra = trace["skip_reason"] if trace["skipped"] else ""
        print(
            f"{trace['name']:<18} {trace['elapsed_ms']:>8.2f} {trace['count_in']:>6} {trace['count_out']:>6}  "
            f"{kind:<22} {extra}"
        )
    print()
    for mem in response.selected:
        expl = mem["explanation"]
        print(
            f"#{mem['rank']} {mem['node_id']} ({mem['type']}, {mem['origin']}): "
            f"score {_fmt(expl['score'])} [{expl['score_kind']}]"
        )
        for part in expl["parts"]:
            print(
                f"    {part['name']:<12} value {_fmt(part['value']):>8} × weight {_fmt(part['weight']):>8} "
                f"= {_fmt(part['contribution'])}"
            )
        if expl["multipliers"]:
            mult = ", ".join(f"{k} {_fmt(v)}" for k, v in expl["multipliers"].items())
            print(f"    multipliers: {mult}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from memory_recall.service import serve

    settings = _settings(args)
    serve(
        args.host or settings.service.host,
        args.port or settings.service.port,
        args.data_dir,
        args.token or settings.service.token or None,
        settings,
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memory-recall", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
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

    p = add("ingest", cmd_ingest, "ingest chat messages (chat JSON or a LoCoMo file) into the store")
    p.add_argument("file", help="chat JSON ({chat_id, messages}) or LoCoMo JSON (list of conversations)")
    p.add_argument("--chat", help="chat id (default: the file's chat_id / each LoCoMo sample_id)")
    p.add_argument("--no-embed", action="store_true", help="skip embeddings")

    p = add("import", cmd_import, "import an ST-BME graph export into a chat (replaces its graph)")
    p.add_argument("file")
    p.add_argument("--chat", required=True)
    p.add_argument("--no-embed", action="store_true", help="skip embeddings")

    p = add("export", cmd_export, "export a chat's graph as ST-BME JSON")
    p.add_argument("--chat", required=True)
    p.add_argument("--out", help="output file (default: stdout)")

    p = add("stats", cmd_stats, "list chats, or show one chat's counts")
    p.add_argument("--chat")

    p = add("serve", cmd_serve, "run the HTTP service for chat hosts (OpenAPI docs at /docs)")
    p.add_argument("--host", help="bind address (default 127.0.0.1; other addresses need a token)")
    p.add_argument("--port", type=int, help="port (default 8765)")
    p.add_argument("--token", help="bearer token clients must send (default $MEMORY_RECALL_SERVICE__TOKEN)")
    p.add_argument(
        "--log-level", default="info", choices=("critical", "error", "warning", "info", "debug", "trace"),
        help="log level of uvicorn and memory-recall (default info; query and message text only at debug)",
    )

    for name, fn, help_ in (
        ("recall", cmd_recall, "recall memories for an input text and print them (and the injection block)"),
        ("explain", cmd_explain, "recall, then print every stage's trace and each memory's score breakdown"),
    ):
        p = add(name, fn, help_)
        p.add_argument("--chat", required=True)
        p.add_argument("--input", required=True, help="the user's message to recall for")
        p.add_argument("--recent", action="append", help="a recent context line '[user]: …' (repeatable)")
        p.add_argument("--region", help="active region")
        p.add_argument("--owner", action="append", help="active scene owner key, e.g. character:erin (repeatable)")
        if name == "recall":
            p.add_argument("--json", action="store_true", help="print the whole result as JSON")

    # Listed for --help; dispatched before parsing (they own their arguments).
    sub.add_parser("bench", help="recall benchmark on synthetic graphs (memory-recall bench --help)")
    sub.add_parser("eval", help="offline recall evaluation: eval locomo PATH … | eval fixtures")

    providers = sub.add_parser("providers", help="embedding and LLM providers")
    psub = providers.add_subparsers(dest="providers_command", required=True)
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``memory-recall`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    pin_single_thread()  # byte-identical recalls on any core count (memory_recall.blas)
    try:
        if argv and argv[0] in ("bench", "eval"):
            return _passthrough(argv[0], argv[1:])
        args = _parser().parse_args(argv)
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
