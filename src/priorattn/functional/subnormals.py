"""A thread that flushes float32 subnormals to zero, for the CPU kernels of the fast routes.

Attention weights far below a row's largest (a slope's distant keys, a steep GGD prior) land
between 2^-149 and 2^-126, float32's subnormals, which the CPU computes 5-80x slower than normal
numbers (docs/benchmarks.md: the flash kernel's backward, and the blockwise route's products).
Such a weight is below 2^-126 of its row's largest, far under float32's resolution of any output,
so flushing it to zero changes no result at float32 precision (nor any float64 result the route
tests compare). The mode is per thread and OpenMP workers take it from the thread that starts
them, so the routes run their kernels on a thread of their own that flushes: its workers flush
too, while the caller's threads keep their own mode.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

THREAD_NAME = "priorattn-flush"


@functools.cache
def flushing_thread(process: int) -> ThreadPoolExecutor:
    """The flushing thread of process ``process``: a forked child does not have its parent's thread.
    Callers on several threads take turns."""
    return ThreadPoolExecutor(1, THREAD_NAME, initializer=torch.set_flush_denormal, initargs=(True,))


def flushing_pays(device: torch.device) -> bool:
    """Whether handing work on ``device`` to the flushing thread saves time: eagerly on the CPU
    (``torch.compile`` traces no threads) with one torch thread. With several, each hand-over leaves
    the other thread's OpenMP team spinning on the same cores, which cost more than flushing saved
    (the tiny model's training step on 2 threads, against NoPE: GGD 0.56x with the hand-over, 0.89x
    without; GOAT 0.90x against 0.92x; docs/benchmarks.md)."""
    return device.type == "cpu" and not torch.compiler.is_compiling() and torch.get_num_threads() == 1


def on_flushing_thread(device: torch.device, work: Callable[..., Any], *args: Any) -> Any:
    """``work(*args)`` on :func:`flushing_thread`, the caller waiting for it, where that pays
    (:func:`flushing_pays`); directly otherwise, and when the caller is that thread (work that calls
    a route again would otherwise wait for itself)."""
    if not flushing_pays(device) or threading.current_thread().name.startswith(THREAD_NAME):
        return work(*args)
    return flushing_thread(os.getpid()).submit(work, *args).result()
