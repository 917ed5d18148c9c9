"""The per-token KL's rows in blocks and on threads: each thread's scratch buffers kept between calls,
rows cut into blocks of about BLOCK_ELEMENTS, and big arrays mapped over a small thread pool (a forked
child makes its own). Neither the blocks nor the threads change a result (tests/kl/test_kl_math.py)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from typing import TypeVar

import numpy as np

__all__ = ["BLOCK_ELEMENTS", "PARALLEL_ELEMENTS", "WORKERS", "block_buffers", "blocks_of", "map_rows"]


#: Rows per block: 4 MiB of float32 exp values. Smaller blocks measured slower (per-block numpy calls
#: dominate); the buffers are kept per thread, so no call page-faults them in again.
BLOCK_ELEMENTS = 1 << 20
#: Below this many logits, threads cost more than they save.
PARALLEL_ELEMENTS = 1 << 21

_R = TypeVar("_R")
_POOL: tuple[int, ThreadPoolExecutor] | None = None  # (pid that made it, pool): a forked child makes its own
_POOL_LOCK = threading.Lock()


def _workers() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        n = os.cpu_count() or 1
    return max(1, min(4, n))


WORKERS = _workers()
_LOCAL = threading.local()


def block_buffers(v: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """This thread's block buffers (exp values, mask, one scratch row), kept between calls: fresh
    megabytes would be page-faulted in on every call, and page faults serialise threads."""
    shape = (_block_rows(v), v)
    cached: tuple[np.ndarray, np.ndarray, np.ndarray] | None = getattr(_LOCAL, "buffers", None)
    if cached is None or cached[0].shape != shape:
        cached = (np.empty(shape, np.float32), np.empty(shape, np.bool_), np.empty(v, np.float32))
        _LOCAL.buffers = cached
    return cached


def _block_rows(v: int) -> int:
    return max(1, BLOCK_ELEMENTS // v)


def blocks_of(r0: int, r1: int, v: int) -> list[tuple[int, int]]:
    step = _block_rows(v)
    return [(b, min(r1, b + step)) for b in range(r0, r1, step)]


def map_rows(fn: Callable[[int, int], _R], t: int, v: int) -> list[_R]:
    """fn over row chunks, on threads when the array is big enough to pay for them; results in order.

    Two chunks per worker: rows cost unequal amounts (capped rows sort thousands of tokens).
    """
    workers = WORKERS if t * v >= PARALLEL_ELEMENTS else 1
    n_chunks = max(1, min(t, 2 * workers)) if workers > 1 else 1
    bounds = [round(i * t / n_chunks) for i in range(n_chunks + 1)]
    chunks = list(pairwise(bounds))
    if len(chunks) == 1:
        return [fn(*chunks[0])]
    return list(_pool().map(lambda c: fn(*c), chunks))


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid():  # a fork's copy has no threads behind it
            _POOL = (os.getpid(), ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="mlxgate-kl"))
        return _POOL[1]
