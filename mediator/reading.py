"""Profile documents read off the server's event loop, in worker processes, with a deadline
(issue 28, item 2).

Reading a client's document — :func:`eva.parser.parse`: the direct reader or lark, then the
checks of :mod:`eva.validate` — is pure Python. It is linear in the text, but a document of the
worst shape (brackets nested hundreds of thousands deep, which only lark reads) still takes
about 10 s a MiB. On the event loop that stalled every other client, Publish and the health
probe for as long; in a thread it still did, through the GIL and the garbage collector's passes
over the parse tree (health answered in up to 0.44 s while a thread read a 1 MiB document). So a
document is read in a worker process (a Python running :func:`_serve`): the loop writes the text
down the worker's stdin and reads the answer from its stdout — the document, pickled, or the
error's message and position — and the worker's GIL and garbage are its own.

A worker that has not answered within the deadline (``limits.read_time``) is killed and the
call refused (:class:`ReadTimeout`); the next document gets a fresh worker. At most ``workers``
documents are read at once; a further one waits for a worker, as long as the deadline at most
(:class:`ReadersBusy`). Workers are started on first use (about 0.12 s: an interpreter, lark,
the parser's tables) and kept; a worker that has read a large document is replaced, since its
heap stays as large as that document needed. A worker is a fresh interpreter, never a fork of
the server with its gRPC threads, in a session of its own (a ^C at the terminal is the server's
to handle), and it ends when its stdin closes — also when the server is killed.

The protocol, both ways: an 8-byte big-endian length, then that many bytes — the document's
UTF-8 in, the pickled answer out (:func:`_answer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pickle
import signal
import struct
import sys
import traceback
from typing import Any

from eva import ast
from eva.parser import ProfileError, parse

log = logging.getLogger("evamed.reading")

WORKERS = 2
"""Documents read at once (worker processes)."""
RECYCLE_BYTES = 256 * 1024
"""A worker that has read a document larger than this is replaced: reading takes about 120
bytes of memory per byte of text, which its heap keeps."""
THREAD_BYTES = 64 * 1024
"""An answer larger than this is unpickled in a thread, not on the loop (a document of many
profiles: tens of milliseconds)."""
FILENAME = "profile"
"""The name errors give the document (``profile:LINE:COLUMN: error: …``)."""
_LENGTH = struct.Struct(">Q")
_READY = b"ready\n"
"""What a worker writes once it has started (before its first answer)."""
START_TIME = 30.0
"""Seconds a worker may take to start (an interpreter, lark, the parser's tables: about 0.12 s,
seconds on a loaded machine) — not counted in a document's ``limits.read_time``, which is the
document's own reading time: a start-up slowed by load must not refuse a small document."""
_PATH = "EVAMED_READER_PATH"
_BOOT = (f"import json, os, sys; sys.path[:] = json.loads(os.environ.pop({_PATH!r})); "
         f"from {__name__} import _serve; _serve()")
"""What a worker runs: with the server's ``sys.path`` (as multiprocessing's spawn does), it
imports the same code as the server, however the server found its own."""


class ReadTimeout(Exception):
    """The document was not read within the deadline; its worker was killed."""


class ReadersBusy(Exception):
    """Every worker stayed busy with other documents for the whole deadline."""


class ReaderFailed(Exception):
    """The worker stopped while reading the document (killed from outside, out of memory)."""


class ReaderBug(Exception):
    """The parser raised what it never should (a bug): ``kind`` names the exception, ``trace``
    is its traceback in the worker."""

    def __init__(self, kind: str, trace: str) -> None:
        super().__init__(kind)
        self.kind = kind
        self.trace = trace


# ------------------------------------------------------------------ in the worker


def _answer(text: str) -> tuple[Any, ...]:
    """What a worker sends back for a document: ``("doc", document)``, ``("error", message,
    line, column)`` for a ProfileError, ``("deep",)`` for a RecursionError, or ``("bug",
    exception type, traceback)`` for anything else (a parser bug)."""
    try:
        return ("doc", parse(text, FILENAME))
    except ProfileError as exc:
        return ("error", exc.message, exc.line, exc.column)
    except RecursionError:
        return ("deep",)
    except Exception as exc:
        return ("bug", type(exc).__name__, traceback.format_exc())


def _pickled(answer: tuple[Any, ...]) -> bytes:
    try:
        return pickle.dumps(answer, pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # RecursionError: deeper than the checks let through (a bug)
        return pickle.dumps(("bug", type(exc).__name__, traceback.format_exc()))


def _serve() -> None:
    """A worker's loop: documents in on stdin, answers out on stdout, until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    given = sys.stdin.buffer
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what else writes to stdout (a stray print) goes to stderr, not the answers
    parse("# the parser's tables built before the first document\n", FILENAME)
    answers.write(_READY)  # started: the deadline of the first document counts from here
    answers.flush()
    while True:
        head = given.read(_LENGTH.size)
        if len(head) < _LENGTH.size:
            return
        (size,) = _LENGTH.unpack(head)
        data = given.read(size)
        if len(data) < size:
            return
        answer = _pickled(_answer(data.decode("utf-8", "surrogatepass")))
        answers.write(_LENGTH.pack(len(answer)) + answer)
        answers.flush()


# ------------------------------------------------------------------ in the server


class _Worker:
    """One worker process, started by :meth:`start`."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls) -> _Worker:
        """A started worker, once it says it is ready (ReaderFailed if it does not, within
        START_TIME)."""
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _BOOT, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, env={**os.environ, _PATH: json.dumps(sys.path)},
            start_new_session=True)
        worker = cls(process)
        assert process.stdout is not None
        try:
            said = await asyncio.wait_for(process.stdout.readexactly(len(_READY)), START_TIME)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as exc:
            said = repr(exc).encode()
        if said != _READY:
            await worker.stop()
            raise ReaderFailed(f"a worker to read the document did not start ({said!r})")
        return worker

    async def ask(self, data: bytes) -> tuple[Any, ...]:
        """Send a document, wait for the answer."""
        given, answers = self.process.stdin, self.process.stdout
        assert given is not None and answers is not None
        try:
            given.write(_LENGTH.pack(len(data)))
            given.write(data)
            await given.drain()
            (size,) = _LENGTH.unpack(await answers.readexactly(_LENGTH.size))
            answer = await answers.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise ReaderFailed(f"the worker reading the document stopped ({exc})") from None
        if size > THREAD_BYTES:
            loaded: tuple[Any, ...] = await asyncio.to_thread(pickle.loads, answer)
            return loaded
        loaded = pickle.loads(answer)
        return loaded

    def alive(self) -> bool:
        return self.process.returncode is None

    async def stop(self) -> None:
        """Kill the process (it may be reading still) and wait for it."""
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        await self.process.wait()


class Readers:
    """Documents read in worker processes, ``seconds`` at most each (see the module)."""

    def __init__(self, seconds: float, workers: int = WORKERS) -> None:
        self.seconds = seconds
        self._idle: list[_Worker] = []
        self._slots = asyncio.Semaphore(workers)
        self._stopping: set[asyncio.Task[None]] = set()
        self._busy: set[_Worker] = set()

    async def read(self, text: str) -> ast.Document:
        """The document of ``text``; ProfileError as :func:`eva.parser.parse` raises it
        (RecursionError, or ReaderBug for a parser bug), ReadTimeout, ReadersBusy or
        ReaderFailed."""
        data = text.encode("utf-8", "surrogatepass")
        try:
            await asyncio.wait_for(self._slots.acquire(), self.seconds)
        except TimeoutError:
            raise ReadersBusy from None
        try:
            worker = self._idle.pop() if self._idle else None
            if worker is None or not worker.alive():
                if worker is not None:
                    self._retire(worker)
                worker = await _Worker.start()
            self._busy.add(worker)
            try:
                answer = await asyncio.wait_for(worker.ask(data), self.seconds)
            except TimeoutError:
                self._retire(worker)
                raise ReadTimeout from None
            except BaseException:  # the call cancelled, or the worker gone: not reused
                self._retire(worker)
                raise
            self._busy.discard(worker)
            if len(data) > RECYCLE_BYTES:
                self._retire(worker)
            else:
                self._idle.append(worker)
        finally:
            self._slots.release()
        return _document(answer, text)

    def _retire(self, worker: _Worker) -> None:
        """Stop a worker in the background."""
        self._busy.discard(worker)
        task = asyncio.get_running_loop().create_task(worker.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def close(self) -> None:
        """Stop every worker (those reading too: their calls end with ReaderFailed)."""
        workers = [*self._idle, *self._busy]
        self._idle.clear()
        self._busy.clear()
        await asyncio.gather(*(w.stop() for w in workers), *self._stopping)


def _document(answer: tuple[Any, ...], text: str) -> ast.Document:
    """The document a worker's answer carries, or the exception it stands for."""
    kind = answer[0]
    if kind == "doc":
        doc: ast.Document = answer[1]
        return doc
    if kind == "error":
        _, message, line, column = answer
        raise ProfileError(message, line, column, text, FILENAME)
    if kind == "deep":
        raise RecursionError("the profile nests too deeply to be read")
    raise ReaderBug(answer[1], answer[2])


__all__ = ["WORKERS", "ReadTimeout", "ReaderBug", "ReaderFailed", "Readers", "ReadersBusy"]
