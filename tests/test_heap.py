"""memory_recall.heap: large long-lived buffers in their own mappings, the service's cap on glibc's arenas."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mapped_buffers import mapping_of

from memory_recall import heap

glibc = pytest.mark.skipif(not heap._glibc(), reason="glibc only (mallopt, malloc_info)")


def test_a_small_buffer_stays_an_ordinary_array() -> None:
    arr = heap.mapped_empty((10, 4), np.float32)
    assert arr.shape == (10, 4) and arr.dtype == np.float32 and arr.base is None and arr.flags.owndata


def test_a_large_buffer_gets_its_own_zeroed_writable_mapping() -> None:
    rows = heap.MAPPED_MIN_BYTES // (384 * 4) + 1
    arr = heap.mapped_empty((rows, 384), np.float32)
    mapping = mapping_of(arr)
    assert isinstance(mapping, mmap.mmap) and len(mapping) == rows * 384 * 4
    assert arr.shape == (rows, 384) and arr.dtype == np.float32 and arr.flags.c_contiguous and arr.flags.writeable
    assert not arr.any()
    arr[-1, -1] = 2.5
    view = arr[:3]
    assert view.base is arr.base and float(arr[-1, -1]) == 2.5
    assert heap.mapped_empty((1 << 17,), np.int64).base is not None  # exactly the bound: mapped


def test_mapped_zeros_is_zeros_mapped_from_its_bound() -> None:
    small = heap.mapped_zeros((10, 4), np.float32)
    assert small.shape == (10, 4) and small.dtype == np.float32 and small.flags.owndata and not small.any()
    low = heap.mapped_zeros((10, 4), np.int64, min_bytes=320)  # 320 bytes: exactly the bound given
    mapping = mapping_of(low)
    assert isinstance(mapping, mmap.mmap) and len(mapping) == 320 and low.shape == (10, 4) and not low.any()
    low[3, 2] = 7
    assert int(low.sum()) == 7
    assert mapping_of(heap.mapped_zeros((10, 4), np.int64, min_bytes=321)) is None
    empty = heap.mapped_zeros((0, 6), np.int64, min_bytes=0)  # nothing to map
    assert empty.shape == (0, 6) and mapping_of(empty) is None
    assert isinstance(mapping_of(heap.mapped_empty((10, 4), np.int64, min_bytes=320)), mmap.mmap)


def test_a_mapped_buffer_is_private_anonymous_memory() -> None:
    """Counted in the process's anonymous RSS (a shared anonymous mapping would be shmem, outside it)."""
    rows = 4 * heap.MAPPED_MIN_BYTES // (384 * 4)
    arr = heap.mapped_empty((rows, 384), np.float32)
    arr[:] = 1.0  # every page touched
    start = arr.ctypes.data
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            inside = lo <= start < hi
            if inside:
                assert head[1][3] == "p", line  # private
        elif head[:1] == ["Anonymous:"] and inside:
            assert int(head[1]) >= arr.nbytes // 1024
            return
    raise AssertionError("the buffer's mapping is not in /proc/self/smaps")



def _vm_flags(address: int) -> list[str]:
    """The ``VmFlags`` of the mapping of this process that holds ``address`` (``/proc/self/smaps``)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            inside = lo <= address < hi
        elif head[:1] == ["VmFlags:"] and inside:
            return head[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not Path("/proc/self/smaps").exists() or not hasattr(mmap, "MADV_HUGEPAGE"),
                    reason="Linux's smaps and madvise(MADV_HUGEPAGE)")
def test_a_mapping_from_the_huge_page_bound_on_asks_for_huge_pages() -> None:
    """Filling a fresh mapping costs a page fault per page: a large one asks for huge pages (``hg`` in its
    ``VmFlags``), a smaller one keeps small pages, so its untouched spare rows stay out of the RSS."""
    large = heap.mapped_empty((heap.HUGE_PAGE_MIN_BYTES // 8,), np.int64)
    small = heap.mapped_empty((heap.HUGE_PAGE_MIN_BYTES // 8 - 1,), np.int64)
    assert mapping_of(large) is not None and mapping_of(small) is not None
    assert "hg" in _vm_flags(large.ctypes.data)
    assert "hg" not in _vm_flags(small.ctypes.data)


def test_limit_arenas_refuses_a_negative_count_and_keeps_the_default_for_zero() -> None:
    with pytest.raises(ValueError, match="^arenas: 0 .* got -1$"):
        heap.limit_arenas(-1)
    assert heap.limit_arenas(0) is False


@pytest.mark.parametrize("env", [{"MALLOC_ARENA_MAX": "4"}, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}])
def test_limit_arenas_leaves_the_users_environment_setting(monkeypatch: pytest.MonkeyPatch,
                                                            env: dict[str, str]) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert heap.limit_arenas(2) is False


_HEAPS = """
import ctypes, os, sys, tempfile, threading
from memory_recall import heap
applied = heap.limit_arenas(int(sys.argv[1]))
go = threading.Barrier(6)
def work():
    go.wait()  # all six threads alive at once: each asks for an arena of its own
    keep = [bytearray(200_000) for _ in range(20)]
    go.wait()
threads = [threading.Thread(target=work) for _ in range(6)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
path = os.path.join(tempfile.mkdtemp(), "info.xml")
fp = libc.fopen(path.encode(), b"w"); libc.malloc_info(0, fp); libc.fclose(fp)
print(applied, open(path).read().count("<heap nr="))
"""


@glibc
@pytest.mark.parametrize(("arenas", "applied"), [(0, False), (1, True), (2, True)])
def test_limit_arenas_caps_the_heaps_threads_get(arenas: int, applied: bool) -> None:
    """Six threads allocating at once: glibc's default gives each an arena of its own besides the main heap; with
    the cap they share ``arenas`` heaps (the main one among them)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_ARENA_MAX", "GLIBC_TUNABLES")}
    out = subprocess.run([sys.executable, "-c", _HEAPS, str(arenas)], capture_output=True, text=True, timeout=60,
                         env=env)
    assert out.returncode == 0, out.stderr
    was_applied, heaps = out.stdout.split()
    assert was_applied == str(applied)
    # Uncapped: the main heap and one arena per thread (glibc allows eight per core, so 7 on any machine).
    assert int(heaps) == (arenas or 1 + 6)


@pytest.mark.parametrize("interval", [0, -1.0, float("nan")])
def test_a_trimmer_needs_a_positive_interval(interval: float) -> None:
    with pytest.raises(ValueError, match=r"^interval_s: a positive number of seconds, got "):
        heap.HeapTrimmer(interval)


_TRIM = """
import sys, time
from memory_recall import heap

def anon_mib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024

# 48 MiB of 64 KiB blocks in the heap (below glibc's mmap threshold), each followed by a small block that stays:
# freeing the large ones leaves their pages inside the heap, between live blocks, where free() cannot give them
# back.
big = []
pins = []
for _ in range(768):
    b = bytearray(64 * 1024)
    big.append(b)
    pins.append(bytearray(64))
filled = anon_mib()
del big
freed = anon_mib()
trimmer = heap.HeapTrimmer(0.05)
assert trimmer.start() and not trimmer.start()  # a second start does nothing
time.sleep(0.3)
idle = (trimmer.trims, anon_mib())  # nothing noted: no trim
trimmer.note()
deadline = time.monotonic() + 20
while trimmer.trims == 0 and time.monotonic() < deadline:
    time.sleep(0.01)
trimmed = anon_mib()
time.sleep(0.3)
after = trimmer.trims  # one trim per note
trimmer.stop()
alive = any(t.name == "heap-trimmer" for t in __import__("threading").enumerate())
print(f"{filled} {freed} {idle[0]} {idle[1]} {trimmed} {after} {alive} {trimmer.seconds > 0}")
"""


@glibc
def test_the_trimmer_gives_freed_heap_pages_back_once_per_note() -> None:
    """A heap whose freed pages sit between live blocks: RSS stays up after the free, and drops by them at the
    first tick after :meth:`HeapTrimmer.note` (never without one); :meth:`stop` ends the thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", _TRIM], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    filled, freed, idle_trims, idle, trimmed, trims, alive, timed = out.stdout.split()
    assert float(filled) - float(freed) < 8, out.stdout  # free() kept the pages
    assert (int(idle_trims), abs(float(idle) - float(freed)) < 4) == (0, True), out.stdout
    assert float(freed) - float(trimmed) > 40, out.stdout  # most of the 48 MiB returned
    assert (int(trims), alive, timed) == (1, "False", "True"), out.stdout


_USAGE = r"""
import sys
from memory_recall import heap
before = heap.heap_usage()
rss_before = heap.anonymous_rss()
blocks = [bytes([i % 251]) * 16384 for i in range(2000)]  # 2,000 heap blocks of 16,432 bytes (below mmap's bound)
held = heap.heap_usage()
rss_held = heap.anonymous_rss()
del blocks
after = heap.heap_usage()
mib = 2 ** 20
print(f"{(held.in_use - before.in_use) / mib} {(after.in_use - before.in_use) / mib} {(rss_held - rss_before) / mib}"
      f" {int(held.heaps >= held.in_use - held.mapped)} {int(0 <= held.free <= held.heaps)}")
"""


@pytest.mark.skipif(not heap._glibc() or not hasattr(heap._glibc(), "mallinfo2"), reason="glibc 2.33+ (mallinfo2)")
def test_heap_usage_counts_the_blocks_a_process_holds_and_frees() -> None:
    """2,000 blocks of 16 KiB: the allocator's memory in use rises by their chunks (31.3 MiB) and falls back when
    they are freed; the anonymous RSS rises with them; the heaps hold what is in use outside mappings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", _USAGE], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    held, after, rss, heaps_hold, free_inside = out.stdout.split()
    assert 31.2 < float(held) < 31.6, out.stdout
    assert abs(float(after)) < 0.2, out.stdout
    assert float(rss) > 30, out.stdout
    assert (heaps_hold, free_inside) == ("1", "1"), out.stdout


def test_anonymous_rss_is_this_processs_rss_anon() -> None:
    status = Path("/proc/self/status")
    if not status.exists():
        assert heap.anonymous_rss() is None
        return
    rss = heap.anonymous_rss()
    kib = next(int(line.split()[1]) for line in status.read_text().splitlines() if line.startswith("RssAnon:"))
    assert rss is not None and abs(rss - kib * 1024) < 4 << 20  # read a moment apart
