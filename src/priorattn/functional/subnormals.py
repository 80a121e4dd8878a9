"""Flushing float32 subnormals to zero around the CPU kernels of the fast routes.

Attention weights far below a row's largest (a slope's distant keys, a steep GGD prior) land
between 2^-149 and 2^-126, float32's subnormals, which the CPU computes 5-80x slower than normal
numbers (docs/performance_log.md: the flash kernel's backward, and the blockwise route's products).
Such a weight is below 2^-126 of its row's largest, far under float32's resolution of any output,
so flushing it to zero changes no result at float32 precision (nor any float64 result the route
tests compare).

The flush mode is a per-thread control register (MXCSR's FTZ/DAZ bits on x86, FPCR.FZ on Arm),
and ``torch.set_flush_denormal`` sets only the calling thread's: the OpenMP workers that run half
of a 2-thread kernel keep their own mode. :func:`flushing_subnormals` therefore sets the mode on the
caller and on every worker of its OpenMP team by running C's ``fesetmode`` as an OpenMP parallel
region (``GOMP_parallel``, which GNU libgomp and LLVM's libomp both export) and restores each
thread's previous modes when the scope ends. The region's body is C, so workers never wait for
the GIL, and it costs a few microseconds. A worker the runtime starts inside the scope inherits the
caller's mode from the kernel (a new thread copies its creator's registers), so none is missed.
Without that runtime or without ``fegetmode``/``fesetmode`` (glibc >= 2.25) only the caller's mode
is set: one thread flushes, the workers of a multi-threaded run do not.

Each Python thread has its own OpenMP team and its own modes, so scopes on two threads do not see
each other; a scope entered where the caller already flushes (an enclosing scope, or a user's own
``torch.set_flush_denormal(True)``) changes nothing, so it neither clobbers nor ends that mode.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import NamedTuple

import torch

#: Names of the OpenMP runtimes that export ``GOMP_parallel`` (GNU, LLVM, Intel).
OPENMP_RUNTIMES = ("libgomp", "libomp", "libiomp5")
#: Bytes that hold any platform's ``femode_t`` (8 on x86-64, 4 on Arm).
MODE_BYTES = 64
#: The smallest normal double: half of it is subnormal, so it flushes to 0 where the mode is set.
SMALLEST_NORMAL = sys.float_info.min


class Team(NamedTuple):
    """C entry points that set floating-point control modes on an OpenMP team."""

    parallel: Callable[..., None]  # GOMP_parallel(fn, data, threads, flags): fn(data) on every thread
    get_mode: Callable[..., int]  # fegetmode(femode_t *)
    set_mode: int  # the address of fesetmode(const femode_t *), run by the parallel region


def flushes() -> bool:
    """Whether the calling thread flushes subnormals; the flush bits apply to Python's own float
    arithmetic as to torch's kernels, and this costs a tenth of a microsecond."""
    return SMALLEST_NORMAL * 0.5 == 0.0


def loaded_openmp() -> list[str]:
    """Paths of the OpenMP runtimes loaded in this process, torch's own first; none where
    ``/proc/self/maps`` does not exist (not Linux)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return []
    paths = {line.split()[-1] for line in maps.read_text().splitlines() if "/" in line}
    runtimes = [p for p in paths if os.path.basename(p).startswith(OPENMP_RUNTIMES)]
    torch_lib = os.path.dirname(torch.__file__)
    return sorted(runtimes, key=lambda p: not p.startswith(torch_lib))


@functools.cache
def openmp_team() -> Team | None:
    """The entry points of :class:`Team` from the OpenMP runtime torch loaded and the C library,
    or None where either is missing (then only the caller's mode is set)."""
    try:
        libc = ctypes.CDLL(None)
        get_mode, set_mode = libc.fegetmode, libc.fesetmode
    except (AttributeError, OSError):
        return None
    for path in loaded_openmp():
        try:  # RTLD_NOLOAD: only a runtime already loaded, never a second one
            parallel = ctypes.CDLL(path, mode=os.RTLD_NOLOAD).GOMP_parallel
        except (AttributeError, OSError):
            continue
        parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        parallel.restype = None
        get_mode.argtypes = [ctypes.c_void_p]
        return Team(parallel, get_mode, ctypes.cast(set_mode, ctypes.c_void_p).value)
    return None


def flushing_pays(device: torch.device) -> bool:
    """Whether to flush around work on ``device``: eagerly on the CPU, at any size and number of
    threads (a scope costs a few microseconds, docs/performance_log.md; a route call at least tens),
    and never while ``torch.compile`` traces (a scope is a side effect the graph would not keep)."""
    return device.type == "cpu" and not torch.compiler.is_compiling()


def flushing_subnormals(device: torch.device) -> AbstractContextManager[None]:
    """A scope in which the caller and its OpenMP workers flush subnormals, where that pays
    (:func:`flushing_pays`) and the caller does not flush already."""
    if not flushing_pays(device) or flushes():
        return nullcontext()
    team = openmp_team()
    return flushing_team(team) if team is not None else flushing_caller()


@contextmanager
def flushing_team(team: Team) -> Iterator[None]:
    """Every thread of the caller's team flushes inside, and takes the caller's previous modes
    after. The flushing modes are read back after ``torch.set_flush_denormal(True)``, so the
    bits are whatever torch sets on this CPU."""
    previous, flushing = ctypes.create_string_buffer(MODE_BYTES), ctypes.create_string_buffer(MODE_BYTES)
    team.get_mode(previous)
    torch.set_flush_denormal(True)
    team.get_mode(flushing)
    set_team_mode(team, flushing)
    try:
        yield
    finally:
        set_team_mode(team, previous)


def set_team_mode(team: Team, mode: ctypes.Array) -> None:
    """``fesetmode(mode)`` on the caller and every worker of a team of torch's current size: the
    threads that run torch's parallel regions, whose teams are never larger."""
    team.parallel(team.set_mode, ctypes.addressof(mode), torch.get_num_threads(), 0)


@contextmanager
def flushing_caller() -> Iterator[None]:
    """The caller alone flushes inside: without an OpenMP runtime to reach the workers."""
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
