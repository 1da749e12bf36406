"""memory_recall.blas: the service and the CLI run BLAS on one thread (byte-identical recalls on any core count)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_THREADS = (
    "from threadpoolctl import threadpool_info\n"
    "def blas_threads():\n"
    "    return max(i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas')\n"
)


def _run(body: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", _THREADS + body], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [line.split()[1] for line in out.stdout.splitlines() if line.startswith("BLAS-THREADS ")]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: BLAS already runs one thread")
@pytest.mark.parametrize(
    "start",
    [
        "from memory_recall.settings import RecallSettings\n"
        "from memory_recall.service.app import create_app\n"
        "create_app(RecallSettings())\n",
        "from memory_recall.cli import main\nmain(['--help'])\n",
        "from memory_recall.blas import pin_single_thread\npin_single_thread()\npin_single_thread()\n",
    ],
    ids=["service", "cli", "api-idempotent"],
)
def test_entry_points_pin_blas_to_one_thread(start: str) -> None:
    body = (
        "import numpy\n"
        "print('BLAS-THREADS', blas_threads())\n"
        "try:\n"
        + "".join(f"    {line}\n" for line in start.splitlines())
        + "except SystemExit:\n"
        "    pass\n"
        "print('BLAS-THREADS', blas_threads())\n"
    )
    before, after = _run(body)
    assert int(before) > 1
    assert after == "1"
