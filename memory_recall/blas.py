"""One BLAS thread for the process, so recall output does not depend on the machine's core count.

OpenBLAS splits a matrix-vector product's rows among its threads without keeping its kernels' row alignment,
so the float32 bits of e.g. ``E @ q`` change with the thread count (measured at 2,500–50,000 rows × 384). The
vector prefilter's whole-graph product is already thread-invariant
(:func:`~memory_recall.pipeline.vector_prefilter.query_similarities` runs it as small single-threaded GEMMs);
smaller products elsewhere (residual recall, the DPP kernel) are not. The service and the CLI therefore call
:func:`pin_single_thread` at start; a Python caller who wants byte-identical results across machines calls it
too. Recalls run concurrently on their own threads (and a recall's products are small), so one BLAS thread
costs little throughput.
"""

from __future__ import annotations

import threading

from threadpoolctl import threadpool_limits

__all__ = ["pin_single_thread"]

_lock = threading.Lock()
_pinned: threadpool_limits | None = None


def pin_single_thread() -> None:
    """Limit every BLAS library loaded in the process to one thread (idempotent; process-wide, not undone)."""
    global _pinned
    with _lock:
        if _pinned is None:
            # threadpool_limits applies on construction; kept referenced so it is never restored.
            _pinned = threadpool_limits(limits=1, user_api="blas")
