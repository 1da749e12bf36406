"""memory_recall.allocator: ``memory-recall serve`` fixes glibc's mmap threshold (flat memory under writes)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")

# Frees a 4 MiB mmapped block (raising glibc's dynamic threshold to 4 MiB), then allocates 1 MiB and prints
# whether that block got its own mapping: it does only while the threshold is fixed below 1 MiB.
_PROBE = """
import ctypes
class _Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
def probe():
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    libc.mallinfo2.restype = _Info
    libc.free(libc.malloc(4 << 20))
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(1 << 20)
    mapped = libc.mallinfo2().hblkhd - before >= 1 << 20
    libc.free(block)
    print("MAPPED", mapped)
"""


def _run(body: str, env: dict[str, str] | None = None) -> list[str]:
    out = subprocess.run([sys.executable, "-c", _PROBE + body], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if line.startswith(("MAPPED", "TUNED"))]


def _glibc() -> bool:
    import ctypes

    return hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


@pytest.mark.skipif(not _glibc(), reason="glibc only")
class TestTuneAllocator:
    def test_the_threshold_rises_by_default(self) -> None:
        # The control: without tuning, glibc's dynamic threshold puts the 1 MiB block in the heap.
        assert _run("probe()\n") == ["MAPPED False"]

    def test_the_threshold_stays_fixed_after_a_large_block_is_freed(self) -> None:
        body = "from memory_recall.allocator import tune_allocator\nprint('TUNED', tune_allocator())\nprobe()\n"
        assert _run(body) == ["TUNED True", "MAPPED True"]

    def test_a_threshold_set_in_the_environment_wins(self) -> None:
        body = "from memory_recall.allocator import tune_allocator\nprint('TUNED', tune_allocator())\nprobe()\n"
        assert _run(body, {"MALLOC_MMAP_THRESHOLD_": str(8 << 20)}) == ["TUNED False", "MAPPED False"]

    def test_serve_tunes_the_allocator_before_the_server_starts(self, tmp_path: object) -> None:
        # uvicorn.run replaced by the probe: what the allocator is like when the server would start serving.
        body = (
            "import uvicorn\n"
            "uvicorn.run = lambda *a, **k: probe()\n"
            "from memory_recall.settings import RecallSettings\n"
            "from memory_recall.service.app import serve\n"
            f"serve('127.0.0.1', 0, {str(tmp_path)!r}, None, RecallSettings())\n"
        )
        assert _run(body, {"MEMORY_RECALL_CONFIG": ""}) == ["MAPPED True"]
