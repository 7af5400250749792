"""Profile documents read in worker processes (mediator/reading.py, issue 28 item 2): the same
document or the same error as a read in the server's process, a deadline that kills the worker,
a worker lost and replaced, more documents than workers."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from eva.parser import ProfileError, parse
from mediator.reading import ReaderFailed, Readers, ReadersBusy, ReadTimeout

T = TypeVar("T")
A = 'class A = type == "a"\nclass B = type == "b"\n'
SLOW = "class C = " + "(" * 300_000 + "x == 1" + ")" * 300_000 + "\nprofile P = C\n"
"""A document lark reads in about 3 s (brackets nested 300,000 deep around a predicate)."""


def run(body: Callable[[Readers], Awaitable[T]], seconds: float = 10.0, workers: int = 2) -> T:
    async def main() -> T:
        readers = Readers(seconds, workers)
        try:
            return await body(readers)
        finally:
            await readers.close()
    return asyncio.run(main())


def error_of(text: str) -> str:
    with pytest.raises(ProfileError) as info:
        parse(text, "profile")
    return str(info.value)


@pytest.mark.parametrize("text", [
    A + "profile P = ((first_dup(A); last_dup(B))_5min)_all_pairs\n",
    A + "profile P per data.k evaluate end_of_interval = (first_dup(A) | first_dup(B))_unique_pairs",
    "class inflow = type == \"a\"\nprofile P = inflow" + " " * 100_000,
    "class C = " + "(" * 60 + "x in [1, 2.5, \"é\", true, null]" + ")" * 60 + "\nprofile P = C",
])
def test_a_document_read_in_a_worker_is_the_one_read_here(text: str) -> None:
    doc = run(lambda readers: readers.read(text))
    assert doc == parse(text, "profile")
    assert [(p.line, p.column) for p in doc.profiles] == [
        (p.line, p.column) for p in parse(text, "profile").profiles]


@pytest.mark.parametrize("text", [
    A + "profile P = ((first_dup(A); last_dup(B))_5min)",
    A + "profile P = A" + " " * 100_000 + "{",
    'class A = type == "' + '\\"' * 50_000,
    "profile P = " + "(" * 100_000,
    A + "profile P = Z",
])
def test_an_error_read_in_a_worker_is_the_one_read_here(text: str) -> None:
    async def read(readers: Readers) -> str:
        with pytest.raises(ProfileError) as info:
            await readers.read(text)
        return str(info.value)
    assert run(read) == error_of(text)


def test_a_document_that_reads_longer_than_the_deadline_is_refused_and_its_worker_killed() -> None:
    async def body(readers: Readers) -> tuple[float, Any, Any]:
        await readers.read(A)  # a worker started
        (worker,) = readers._idle
        start = time.monotonic()
        with pytest.raises(ReadTimeout):
            await readers.read(SLOW)
        took = time.monotonic() - start
        await asyncio.wait_for(worker.process.wait(), 5)  # killed, not left reading
        return took, worker.process.returncode, await readers.read(A + "profile P = A")
    took, code, doc = run(body, seconds=0.5)
    assert 0.5 <= took < 2.0 and code == -signal.SIGKILL
    assert [p.name for p in doc.profiles] == ["P"]  # a fresh worker reads the next


def test_a_worker_killed_from_outside_is_replaced() -> None:
    async def body(readers: Readers) -> Any:
        await readers.read(A)
        (worker,) = readers._idle
        os.kill(worker.process.pid, signal.SIGKILL)
        await worker.process.wait()
        return await readers.read(A + "profile P = A")
    assert [p.name for p in run(body).profiles] == ["P"]


def test_a_worker_that_dies_while_reading_fails_that_call_only() -> None:
    async def body(readers: Readers) -> Any:
        await readers.read(A)
        (worker,) = readers._idle
        reading = asyncio.create_task(readers.read(SLOW))
        await asyncio.sleep(0.3)
        os.kill(worker.process.pid, signal.SIGKILL)
        with pytest.raises(ReaderFailed):
            await reading
        return await readers.read(A + "profile P = A")
    assert [p.name for p in run(body).profiles] == ["P"]


def test_more_documents_than_workers_wait_for_one_as_long_as_the_deadline() -> None:
    async def body(readers: Readers) -> tuple[int, list[Any]]:
        small = [readers.read(A + f"profile P{i} = A") for i in range(6)]
        read = await asyncio.gather(*small)  # one worker, six documents: each waits its turn
        first = asyncio.create_task(readers.read(SLOW))
        await asyncio.sleep(0.1)
        # Behind it: a second slow one, then a quick one that the second keeps waiting past
        # its deadline.
        second = asyncio.create_task(readers.read(SLOW))
        await asyncio.sleep(0.1)
        waiting = await asyncio.gather(first, second, readers.read(A), return_exceptions=True)
        return len(read), [type(r) for r in waiting]
    count, outcomes = run(body, seconds=1.0, workers=1)
    assert count == 6
    assert outcomes == [ReadTimeout, ReadTimeout, ReadersBusy]


def test_a_call_that_goes_away_stops_its_reading() -> None:
    async def body(readers: Readers) -> Any:
        await readers.read(A)
        (worker,) = readers._idle
        reading = asyncio.create_task(readers.read(SLOW))
        await asyncio.sleep(0.3)
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        await asyncio.wait_for(worker.process.wait(), 5)
        return worker.process.returncode
    assert run(body) == -signal.SIGKILL
