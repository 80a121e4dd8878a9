"""The scope in which the fast routes' CPU kernels flush float32 subnormals: the caller and every
OpenMP worker of its team flush inside, and take their previous modes back after."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from factories import flushes

import priorattn
from priorattn.functional import subnormals
from priorattn.functional.subnormals import flushing_subnormals
from priorattn.priors import GOAT, ALiBi

CPU = torch.device("cpu")
needs_team = pytest.mark.skipif(subnormals.openmp_team() is None, reason="no OpenMP runtime to reach")


@pytest.fixture
def two_threads():
    """Two torch threads: half of a large elementwise op runs on an OpenMP worker."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def unflushed() -> int:
    """How many of a million subnormal products (2^-140) stay non-zero: 0 where every thread that
    computes a part flushes, all where none does."""
    products = torch.full((1 << 20,), 2.0**-100) * 2.0**-40
    return int(products.count_nonzero())


@needs_team
def test_the_caller_and_every_worker_flush_inside_and_take_their_mode_back_after(two_threads):
    everything = 1 << 20
    assert unflushed() == everything  # torch.set_flush_denormal alone would flush only half
    with flushing_subnormals(CPU):
        assert flushes() and unflushed() == 0
    assert not flushes() and unflushed() == everything


@needs_team
def test_the_mode_is_restored_after_an_exception(two_threads):
    with pytest.raises(ValueError, match="inside"), flushing_subnormals(CPU):
        raise ValueError("inside")
    assert not flushes() and unflushed() == 1 << 20


@needs_team
def test_a_nested_scope_leaves_flushing_to_the_enclosing_one(two_threads):
    with flushing_subnormals(CPU):
        with flushing_subnormals(CPU):
            assert unflushed() == 0
        assert flushes() and unflushed() == 0
    assert not flushes()


def test_a_users_own_flushing_is_kept():
    torch.set_flush_denormal(True)
    try:
        with flushing_subnormals(CPU):
            assert flushes()
        assert flushes()
    finally:
        torch.set_flush_denormal(False)


@needs_team
def test_scopes_on_two_python_threads_keep_to_their_own_team(two_threads):
    """Each Python thread has its own OpenMP team: a scope on one does not reach the other's."""
    inside, entered, done, counts = threading.Event(), threading.Event(), threading.Event(), {}

    def scoped():
        torch.set_num_threads(2)
        with flushing_subnormals(CPU):
            entered.set()
            done.wait(timeout=30)
            counts["scoped"] = unflushed()
        inside.set()

    def plain():
        torch.set_num_threads(2)
        entered.wait(timeout=30)
        counts["plain"] = unflushed()
        done.set()

    workers = [threading.Thread(target=scoped), threading.Thread(target=plain)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert inside.is_set() and counts == {"scoped": 0, "plain": 1 << 20}


def test_without_an_openmp_runtime_only_the_caller_flushes(monkeypatch):
    monkeypatch.setattr(subnormals, "openmp_team", lambda: None)
    with flushing_subnormals(CPU):
        assert flushes()
    assert not flushes()


def test_nothing_flushes_while_compiling_or_off_the_cpu(monkeypatch):
    """A scope is a side effect a compiled graph would not keep; other devices have their own."""
    assert not subnormals.flushing_pays(torch.device("meta"))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with flushing_subnormals(CPU):
        assert not flushes()


def test_the_runtime_reached_is_torchs_own_where_torch_ships_one():
    torch_lib = os.path.dirname(torch.__file__)
    shipped = [path for path in subnormals.loaded_openmp() if path.startswith(torch_lib)]
    if not shipped:
        pytest.skip("torch runs on a system OpenMP runtime here")
    assert subnormals.loaded_openmp()[0] == shipped[0] and subnormals.openmp_team() is not None


def test_routes_called_inside_a_scope_match_those_outside():
    """Work that calls a route inside a scope (the routes' own scopes nest in it) gets the same
    results, and the scope's mode lasts until it ends."""
    q = torch.randn(1, 2, 30, 8)

    def both_routes():
        prior = GOAT(2, 2)
        return [priorattn.attention(q, q, q, prior=prior, causal=True, backend=b) for b in ("sdpa", "memeff")]

    with flushing_subnormals(CPU):
        inside = both_routes()
        assert flushes()
    for got, expected in zip(inside, both_routes()):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_a_forked_process_flushes_in_its_own_scope():
    """A forked child sets and restores its own mode. The child runs one torch thread: libgomp cannot
    start a team of several in a child forked from a parent that used one (it hangs, with or without
    the scope), and the suite runs on the machine's threads."""
    import multiprocessing

    q = torch.randn(1, 2, 50, 8)
    expected = priorattn.attention(q, q, q, prior=ALiBi(2), causal=True, backend="sdpa")
    with multiprocessing.get_context("fork").Pool(1) as pool:
        out = pool.apply_async(scoped_route, (q,))
        got, during, after = out.get(timeout=60)
    assert torch.equal(got, expected) and (during, after) == (True, False)


def scoped_route(q):
    """In a forked child: the route's output, and whether the caller flushed in and after a scope."""
    torch.set_num_threads(1)
    with flushing_subnormals(CPU):
        during = flushes()
    out = priorattn.attention(q, q, q, prior=ALiBi(2), causal=True, backend="sdpa")
    return out, during, flushes()
