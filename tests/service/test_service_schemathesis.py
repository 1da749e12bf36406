"""Schemathesis (``--checks all``) over every operation of the HTTP service finds nothing.

The run: the ``st run`` command line against a real server on 127.0.0.1 (the ``live_server`` fixture: a store in
``tmp_path``, no embedder, nothing reached over the network), phases coverage, fuzzing and stateful, every check,
``--max-examples`` :data:`MAX_EXAMPLES` per operation and ``--generation-deterministic`` (the same cases every
run). The operations are split over two ``st`` processes that run at once (generation is CPU-bound in the
client; two cores halve the time). Its settings (:data:`CONFIG`) widen the statuses the checks accept by exactly
what the schema cannot state:

* 413 is a rejection, and a schema-valid body may be refused with it (the byte limit is not a schema rule);
* the ST-BME import may refuse a schema-valid body with a 422 naming the item
  (:class:`~memory_recall.service.schemas.StbmeImport` lists what its schema leaves out);
* error feedback (schemathesis rewriting the schema from 4xx messages) is off: the run checks the schema the
  service publishes.

The rules JSON Schema cannot state are kept by ``schemathesis_hooks.map_case`` in positive cases and are checked
here one by one (:class:`TestRulesOutsideTheSchema`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import httpx
import pytest

HERE = Path(__file__).resolve().parent
MAX_EXAMPLES = 5
#: Seconds each ``st`` process may take before the test fails (a clean run takes about a minute).
TIMEOUT_S = 600
CONFIG = """\
hooks = "schemathesis_hooks"

[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "413", "429", "5xx"]

[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]

[phases.fuzzing]
error-feedback = { enabled = false }

[[operations]]
include-path = "/v1/chats/{chat_id}/import"
checks.positive_data_acceptance.expected-statuses = ["2xx", "404", "413", "422"]
"""


def _operations(client: httpx.Client) -> list[tuple[str, str]]:
    """``(operationId, "METHOD /path")`` of every operation the service publishes, in document order."""
    doc = client.get("/openapi.json").json()
    return [
        (op["operationId"], f"{method.upper()} {path}")
        for path, methods in doc["paths"].items()
        for method, op in methods.items()
    ]


#: Operations whose coverage phase draws the most cases (their bodies have the most fields): one per process.
_HEAVY = ("POST /v1/recall", "POST /v1/chats/{chat_id}/records/{floor}/rerecall")


def _halves(operations: list[tuple[str, str]]) -> list[list[str]]:
    """The operation ids in two groups of about equal work (the heavy ones apart), document order within."""
    groups: list[list[str]] = [[], []]
    heavy = [op_id for op_id, label in operations if label in _HEAVY]
    light = [op_id for op_id, label in operations if label not in _HEAVY]
    for i, op_id in enumerate(heavy):
        groups[i % 2].append(op_id)
    for i, op_id in enumerate(light):
        groups[i % 2].append(op_id)
    return groups


def _st(url: str, config: Path, report: Path, operation_ids: list[str]) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run", f"{url}/openapi.json",
        "--checks", "all", "--phases", "coverage,fuzzing,stateful", "--max-examples", str(MAX_EXAMPLES),
        "--generation-deterministic", "--workers", "1", "--no-color", "--request-timeout", "60",
        "--report", "junit", "--report-junit-path", str(report),
    ]
    for operation_id in operation_ids:
        command += ["--include-operation-id", operation_id]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=config.parent
    )


def _junit(report: Path) -> dict[str, list[str]]:
    """Test case name → the tags of its failure/error/skipped children (empty: passed)."""
    root = ET.parse(report).getroot()
    return {case.attrib["name"]: [child.tag for child in case] for case in root.iter("testcase")}


def test_schemathesis_finds_nothing(live_server: Any, tmp_path: Path) -> None:
    server, client = live_server()
    operations = _operations(client)
    assert len(operations) == 20  # every route of memory_recall.service.app (the module docstring's table)
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG, encoding="utf-8")
    groups = _halves(operations)
    reports = [tmp_path / f"junit{i}.xml" for i in range(2)]
    runs = [_st(server.url, config, report, group) for report, group in zip(reports, groups, strict=True)]
    outputs = []
    for run in runs:
        try:
            out, _ = run.communicate(timeout=TIMEOUT_S)
        finally:
            run.kill()
        outputs.append(out)
    for run, out in zip(runs, outputs, strict=True):
        assert run.returncode == 0, out[-20_000:]
    results: dict[str, list[str]] = {}
    for report in reports:
        cases = _junit(report)
        assert cases.pop("Stateful tests", []) == []  # the stateful phase's own entry, when it ran
        results.update(cases)
    # Every operation ran, and none failed, erred or was skipped.
    assert results == {label: [] for _, label in operations}, "\n".join(o[-5_000:] for o in outputs)


# -------------------------------------------------------------------------------------------------------------
# The rules the schema states only in words (schemathesis_hooks repairs positive cases for them)
# -------------------------------------------------------------------------------------------------------------


def _message(floor: Any, role: str = "user", text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"floor": floor, "role": role, "text": text, **extra}


class TestRulesOutsideTheSchema:
    @pytest.fixture
    def client(self, live_server: Any) -> httpx.Client:
        _, client = live_server()
        r = client.post("/v1/chats/c1/events", json={"type": "message_added", "messages": [_message(0), _message(1)]})
        assert r.status_code == 200
        return client

    def test_an_integral_float_is_no_integer(self, client: httpx.Client) -> None:
        r = client.post("/v1/chats/c1/events", json={"type": "message_deleted", "floor": 1.0})
        assert r.status_code == 422
        assert r.json()["error"] == "body.message_deleted.floor: Input should be a valid integer"

    def test_recall_messages_in_floor_order_each_once(self, client: httpx.Client) -> None:
        body = {"chat_id": "c1", "messages": [_message(1), _message(0)]}
        r = client.post("/v1/recall", json=body)
        assert (r.status_code, r.json()["error"]) == (
            422, "body.messages: Value error, messages must be in floor order (messages[1] has floor 0 < 1)"
        )
        body = {"chat_id": "c1", "messages": [_message(0), _message(0)]}
        r = client.post("/v1/recall", json=body)
        assert (r.status_code, r.json()["error"]) == (
            422, "body.messages: Value error, floor 0 appears twice (messages[1])"
        )

    def test_target_floor_is_a_user_message(self, client: httpx.Client) -> None:
        body = {"chat_id": "c1", "messages": [_message(0, "assistant")], "target_user_floor": 0}
        r = client.post("/v1/recall", json=body)
        assert (r.status_code, r.json()["error"]) == (
            422, "body.target_user_floor: floor 0 is a assistant message, not a user floor"
        )

    def test_sync_floors_are_0_to_n_minus_1(self, client: httpx.Client) -> None:
        r = client.post("/v1/chats/c1/sync", json={"messages": [_message(0), _message(2)]})
        assert (r.status_code, r.json()["error"]) == (
            422,
            "body.messages.1.floor: a whole chat of 2 message(s) holds floors 0 to 1; got 2 (floor 1 is missing)",
        )

    def test_a_batch_of_added_messages_holds_each_floor_once(self, client: httpx.Client) -> None:
        r = client.post("/v1/chats/c1/events", json={"type": "message_added", "messages": [_message(2), _message(2)]})
        assert (r.status_code, r.json()["error"]) == (422, "body.messages.1.floor: floor 2 repeats messages[0]")

    def test_seq_range_starts_at_or_before_its_end(self, client: httpx.Client) -> None:
        r = client.post("/v1/chats/c1/nodes", json={"nodes": [{"id": "n1", "type": "event", "seq_range": [5, 4]}]})
        assert (r.status_code, r.json()["error"]) == (
            422, "body.nodes.0: Value error, seq_range start 5 is after its end 4"
        )

    def test_an_edge_joins_two_nodes(self, client: httpx.Client) -> None:
        r = client.post("/v1/chats/c1/edges", json={"edges": [{"id": "e1", "from_id": "msg:0", "to_id": "msg:0"}]})
        assert (r.status_code, r.json()["error"]) == (422, "body.edges.0: Value error, from_id and to_id must differ")
