"""Run one function over many items in worker processes: completion order for progress, input order for results.

At most a small window of items is in flight, so when a worker process dies (a segfault, `os._exit`, the OOM
killer) only those few are suspects; each suspect is then run alone in a fresh process and only the one that kills
its process again is reported as crashed. Everything else still gets its real result.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Callable, Generic, Iterator, Sequence, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

# Cyclic garbage is rare in a port (libcst trees are acyclic) while the collector's passes over large trees cost
# about a fifth of the CPU time; the workers run without it and collect every COLLECT_EVERY items.
COLLECT_EVERY = 64
_done_here = 0


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@contextmanager
def collector_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _start_worker() -> None:
    gc.freeze()  # what the worker inherited is never scanned (and its pages stay shared)
    gc.disable()


class _Call(Generic[Item, Result]):
    """The picklable work unit, calling `function(item)` and collecting garbage now and then."""

    def __init__(self, function: Callable[[Item], Result]) -> None:
        self.function = function

    def __call__(self, item: Item) -> Result:
        global _done_here
        try:
            return self.function(item)
        finally:
            _done_here += 1
            if _done_here % COLLECT_EVERY == 0:
                gc.collect()


def _context() -> multiprocessing.context.BaseContext:
    # fork: workers start with the parent's imports (libcst, the analysis) instead of importing them again
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else None)


def run_here(
    function: Callable[[Item], Result],
    items: Sequence[Item],
    crashed: Callable[[Item, str], Result],
    finished: Callable[[int, Result], None],
) -> list[Result]:
    """The same contract as `run_in_processes`, in this process and in input order."""
    call = _Call(function)
    results: list[Result] = []
    with collector_paused():
        for index, item in enumerate(items):
            try:
                result = call(item)
            except Exception as error:  # that item only, as in a worker
                result = crashed(item, f"{type(error).__name__}: {error}")
            results.append(result)
            finished(index, result)
    return results


def run_in_processes(
    function: Callable[[Item], Result],
    items: Sequence[Item],
    workers: int,
    crashed: Callable[[Item, str], Result],
    finished: Callable[[int, Result], None],
    order: Sequence[int] | None = None,
) -> list[Result]:
    """Call `function` on every item across `workers` processes.

    `finished(index, result)` is called in the parent as each item completes; `order` is the order to start items in
    (longest first balances the load); an item whose worker process dies, or whose call raises, gets
    `crashed(item, why)`.
    """
    results: dict[int, Result] = {}
    pending = list(order if order is not None else range(len(items)))
    pending.reverse()  # popped from the end
    call = _Call(function)
    window = max(2, 2 * workers)

    def record(index: int, result: Result) -> None:
        results[index] = result
        finished(index, result)

    while pending:
        suspects = _run_window(call, items, workers, window, pending, record, crashed)
        for index in suspects:  # a worker died: rerun each unfinished item alone to find the one that kills it
            if _run_window(call, items, 1, 1, [index], record, crashed):
                record(index, crashed(items[index], "the worker process died"))
    return [results[index] for index in range(len(items))]


def _run_window(
    call: _Call[Item, Result],
    items: Sequence[Item],
    workers: int,
    window: int,
    pending: list[int],
    record: Callable[[int, Result], None],
    crashed: Callable[[Item, str], Result],
) -> list[int]:
    """Run `pending` keeping `window` items in flight, and return the suspects of a broken pool.

    `pending` is consumed from its end. On a broken pool the indexes in flight at that moment are returned, the rest
    left in `pending`.
    """
    with ProcessPoolExecutor(max_workers=workers, mp_context=_context(), initializer=_start_worker) as pool:
        flying: dict[Future[Result], int] = {}
        try:
            while pending or flying:
                while pending and len(flying) < window:
                    flying[pool.submit(call, items[pending[-1]])] = pending[-1]
                    pending.pop()
                done, _ = wait(flying, return_when=FIRST_COMPLETED)
                for future in done:
                    error = future.exception()
                    if isinstance(error, BrokenProcessPool):
                        raise error
                    index = flying.pop(future)
                    if error is None:
                        record(index, future.result())
                    else:  # raised inside the call: that item only
                        record(index, crashed(items[index], f"{type(error).__name__}: {error}"))
        except BrokenProcessPool:
            return sorted(flying.values())
    return []
