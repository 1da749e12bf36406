"""Hostile-input run against the real service: ``--requests`` generated requests over every OpenAPI operation.

Starts ``memory-recall serve`` as a child process on a free 127.0.0.1 port with a temporary data directory that
holds one pre-filled chat, then sends requests built by the generators of ``tests/service/fuzz_requests.py``
(hypothesis, seeded), split exactly: every operation gets the same number of requests; ``1 - --hostile`` of
them are schema/JSON/bytes/empty ones (``request_for``), the rest hostile variants in equal parts
(``hostile_request``: control characters incl. NUL, very long strings, raw ``NaN``/``Infinity`` tokens, deep
nesting, wrong content types, path-like and empty chat ids). The pre-filled chat id is never generated; fuzz
writes go to other chat ids.

After the run: the server process must be alive, ``/v1/health`` must answer 200 and the pre-filled chat's export
(sha256 of its bytes) must be unchanged. Prints per-operation request and status counts; exits 1 on any 5xx,
connection failure, dead server or digest change. For each 5xx the request and the server log lines written
while it ran (the traceback) are printed and written to ``--out``.

    python scripts/fuzz_service.py [--requests 10000] [--seed 0] [--hostile 0.3] [--out fuzz.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "service")]

import httpx  # noqa: E402
from fuzz_requests import HOSTILE_KINDS, chat_id_strategy, hostile_request, operations, request_for  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from service_live import free_port  # noqa: E402

#: The chat that must come out unchanged; never drawn by the generators.
KEEP_CHAT = "keep-prefilled-chat"
#: Where generated writes with a valid chat id go.
FUZZ_CHAT = "fz"
STARTUP_S = 120.0


class Service:
    """``memory-recall serve`` in a child process; its stdout+stderr go to ``log`` (read back for tracebacks)."""

    def __init__(self, data_dir: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._log_fh = log.open("wb")
        cmd = [sys.executable, "-c", "import sys; from memory_recall.cli import main; sys.exit(main())",
               "serve", "--data-dir", str(data_dir), "--port", str(self.port), "-q"]
        self.proc = subprocess.Popen(cmd, stdout=self._log_fh, stderr=subprocess.STDOUT)

    def wait_ready(self, client: httpx.Client) -> None:
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                if client.get("/v1/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError("service did not answer /v1/health in time")

    def log_size(self) -> int:
        self._log_fh.flush()
        return self.log.stat().st_size

    def log_since(self, offset: int) -> str:
        with self.log.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", "replace")

    def stop(self) -> int | None:
        """Ctrl-C stop (SIGINT: the service finishes in-flight writes); the exit code, None if it had to be killed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        self._log_fh.close()
        return self.proc.returncode


def prefill(client: httpx.Client) -> None:
    messages = [
        {"floor": i, "role": "user" if i % 2 == 0 else "assistant", "speaker": "Ann" if i % 2 == 0 else "Bob",
         "text": f"Ann asks Bob about the old lighthouse, visit {i}."}
        for i in range(6)
    ]
    for chat in (KEEP_CHAT, FUZZ_CHAT):
        r = client.post(f"/v1/chats/{chat}/events", json={"type": "message_added", "messages": messages})
        r.raise_for_status()
        r = client.post("/v1/recall", json={"chat_id": chat, "messages": messages[:5], "target_user_floor": 4})
        r.raise_for_status()


def _body_chat(body: bytes) -> Any:
    """The top-level ``chat_id`` of a JSON object body, else None."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return value.get("chat_id") if isinstance(value, dict) else None


def digest(client: httpx.Client) -> str:
    r = client.get(f"/v1/chats/{KEEP_CHAT}/export")
    r.raise_for_status()
    return hashlib.sha256(r.content).hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000, help="requests to send (default 10000)")
    ap.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    ap.add_argument("--hostile", type=float, default=0.3, help="share of hostile variants (default 0.3)")
    ap.add_argument("--out", type=Path, help="write the full report as JSON here")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="fuzz-service-"))
    service = Service(tmp / "data", tmp / "server.log")
    client = httpx.Client(base_url=service.url, timeout=120)
    per_op: dict[str, Counter[int]] = {}
    per_kind: dict[str, Counter[int]] = {}
    per_kind_op: dict[str, Counter[int]] = {}
    failures: list[dict[str, Any]] = []
    transport_errors: list[dict[str, Any]] = []
    sent = 0
    started = time.monotonic()
    cpu0 = time.process_time()
    try:
        service.wait_ready(client)
        prefill(client)
        before = digest(client)
        spec = client.get("/openapi.json").json()
        ops = operations(spec)
        for m, p, _ in ops:
            per_op[f"{m} {p}"] = Counter()
        ids = chat_id_strategy(FUZZ_CHAT, exclude=KEEP_CHAT)

        # Exact spread: one hypothesis run per (operation, kind) with its quota of requests; "generated" gets
        # (1 - hostile) of the requests, each hostile kind an equal part of the rest.
        kinds = ["generated", *HOSTILE_KINDS]
        cells = [(o, k) for o in range(len(ops)) for k in kinds]
        n_hostile = round(args.requests * args.hostile)
        shares = {"generated": args.requests - n_hostile, **{k: 0 for k in HOSTILE_KINDS}}
        for i in range(n_hostile):
            shares[HOSTILE_KINDS[i % len(HOSTILE_KINDS)]] += 1
        quota = {c: shares[c[1]] // len(ops) + (1 if c[0] < shares[c[1]] % len(ops) else 0) for c in cells}

        def send(o: int, k: str, data: st.DataObject) -> None:
            nonlocal sent
            if quota[(o, k)] <= 0 or transport_errors:
                return
            method, path, op = ops[o]
            if k == "generated":
                url, kwargs = request_for(data, method, path, op, spec, chat_ids=ids, body_chat=FUZZ_CHAT,
                                          protect=KEEP_CHAT)
                kind = k
            else:
                _, url, kwargs = hostile_request(data, method, path, op, spec, chat_ids=ids, body_chat=FUZZ_CHAT,
                                                 kind=k)
                kind = f"hostile:{k}"
            # The generators never address KEEP_CHAT (path or top-level body chat_id; the string may still appear
            # elsewhere in a body: hypothesis draws constants of this module). Guards the digest check.
            body = kwargs.get("content", b"")
            if f"/chats/{KEEP_CHAT}/" in f"{url}/" or _body_chat(body) == KEEP_CHAT:
                raise AssertionError(f"generator addressed the protected chat: {method} {url}")
            op_key = f"{method} {path}"
            offset = service.log_size()
            quota[(o, k)] -= 1
            sent += 1
            try:
                r = client.request(method, url, **kwargs)
            except httpx.TransportError as exc:
                transport_errors.append({"op": op_key, "url": url, "kind": kind, "error": repr(exc),
                                         "body_head": body[:300].decode("utf-8", "replace")})
                return
            per_op[op_key][r.status_code] += 1
            per_kind.setdefault(kind, Counter())[r.status_code] += 1
            per_kind_op.setdefault(f"{kind} {op_key}", Counter())[r.status_code] += 1
            if r.status_code >= 500:
                time.sleep(0.05)  # let the server flush the traceback it logs for this request
                failures.append({
                    "op": op_key, "method": method, "url": url, "kind": kind, "status": r.status_code,
                    "headers": kwargs.get("headers", {}), "body_len": len(body),
                    "body_head": body[:500].decode("utf-8", "replace"), "response": r.text[:500],
                    "server_log": service.log_since(offset)[-6000:],
                })

        def cell_test(o: int, k: str) -> Callable[[st.DataObject], None]:
            def test(data: st.DataObject) -> None:
                send(o, k, data)
            return test

        rounds = 0
        for ci, (o, k) in enumerate(cells):
            r_seed = 0
            # A run ends early when hypothesis has tried every distinct request of a small space (GET /v1/health
            # with no body has one): the next round, another seed, repeats them until the quota is met.
            while quota[(o, k)] > 0 and not transport_errors:
                # Generate phase only, no shrinking, no example database: each example is one request.
                run = settings(max_examples=quota[(o, k)], deadline=None, database=None, phases=[Phase.generate],
                               suppress_health_check=list(HealthCheck))(given(data=st.data())(cell_test(o, k)))
                seed(args.seed * 1_000_000 + ci * 1000 + r_seed)(run)()
                r_seed += 1
                rounds += 1
        elapsed = time.monotonic() - started
        alive = service.proc.poll() is None
        try:
            health = client.get("/v1/health").status_code
            after = digest(client)
        except httpx.TransportError as exc:
            health, after = -1, f"unreachable: {exc!r}"
    finally:
        client.close()
        exit_code = service.stop()

    statuses = sorted({s for c in per_op.values() for s in c})
    name_w = max(len(k) for k in per_op)
    header = f"{'operation':<{name_w}} {'requests':>8} " + " ".join(f"{s:>5}" for s in statuses)
    print(header)
    print("-" * len(header))
    for key, counts in per_op.items():
        print(f"{key:<{name_w}} {sum(counts.values()):>8} " + " ".join(f"{counts[s]:>5}" for s in statuses))
    total: Counter[int] = Counter()
    for counts in per_op.values():
        total.update(counts)
    print("-" * len(header))
    print(f"{'total':<{name_w}} {sum(total.values()):>8} " + " ".join(f"{total[s]:>5}" for s in statuses))
    print()
    print(f"{'request kind':<22} {'requests':>8} " + " ".join(f"{s:>5}" for s in statuses))
    for kind in sorted(per_kind):
        counts = per_kind[kind]
        print(f"{kind:<22} {sum(counts.values()):>8} " + " ".join(f"{counts[s]:>5}" for s in statuses))
    n5xx = sum(n for s, n in total.items() if s >= 500)
    print()
    print(f"requests sent {sent}, wall {elapsed:.1f} s, client CPU {time.process_time() - cpu0:.1f} s, "
          f"hypothesis rounds {rounds}, seed {args.seed}")
    print(f"5xx: {n5xx}; transport errors: {len(transport_errors)}; server alive after run: {alive}; "
          f"/v1/health after run: {health}; server exit code on SIGINT: {exit_code}")
    print(f"export digest of {KEEP_CHAT!r}: before {before[:16]}…, after {after[:16]}… "
          f"({'unchanged' if before == after else 'CHANGED'})")
    for f in failures[:20]:
        print(f"\n5xx {f['status']} {f['method']} {f['url'][:200]} [{f['kind']}] body {f['body_len']} B: "
              f"{f['body_head'][:200]!r}\n  response: {f['response'][:200]}\n  server log:\n{f['server_log']}")
    for e in transport_errors:
        print(f"\ntransport error on {e['op']} {e['url'][:200]} [{e['kind']}]: {e['error']}")
    ok = n5xx == 0 and not transport_errors and alive and health == 200 and before == after
    if args.out:
        args.out.write_text(json.dumps({
            "requests": sent, "seed": args.seed, "hostile_share": args.hostile, "wall_s": round(elapsed, 1),
            "per_operation": {k: {str(s): n for s, n in sorted(c.items())} for k, c in per_op.items()},
            "per_kind": {k: {str(s): n for s, n in sorted(c.items())} for k, c in sorted(per_kind.items())},
            "per_kind_operation": {
                k: {str(s): n for s, n in sorted(c.items())} for k, c in sorted(per_kind_op.items())
            },
            "failures_5xx": failures, "transport_errors": transport_errors, "alive": alive, "health": health,
            "digest_before": before, "digest_after": after, "ok": ok,
        }, indent=1, ensure_ascii=False), encoding="utf-8")
    print("\nOK" if ok else "\nFAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
