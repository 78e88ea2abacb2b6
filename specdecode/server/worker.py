"""The engine's own thread: the only code that touches the Engine once the server runs.

Request handlers (on the asyncio loop) never call the engine: they post commands (add, abort) that
the worker applies between steps, so the engine needs no locks and a handler never blocks the loop
for the length of a forward pass. Results go back per request through an asyncio.Queue, filled on
the loop via call_soon_threadsafe, one batch per engine step.

Events a handle receives: ("running", None) once it holds a KV slot, or ("error", exc) instead
(refused at admission, timed out in the queue, shut out by a drain); then ("delta", text)...; then
("done", None) or ("error", exc). After "done" or "error" the worker no longer touches the handle."""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from typing import Any, Callable

from ..engine.engine import Engine, release_threads
from ..engine.sequence import Sequence
from ..sampling_params import SamplingParams
from .admission import ApiError, queue_timeout, shutting_down

log = logging.getLogger("specdecode.server")


class RequestHandle:
    def __init__(self, prompt_ids: list[int], params: SamplingParams):
        self.prompt_ids, self.params = prompt_ids, params
        self.events: asyncio.Queue = asyncio.Queue()
        self.seq: Sequence | None = None  # set by the worker on admission
        self.t_submit = time.monotonic()
        self.started = False  # holds (or held) a KV slot: worker thread only
        self.t_started: float | None = None
        self.ended = False  # its last event was delivered: event loop only

    @property
    def queue_seconds(self) -> float | None:
        """How long it waited for a KV slot."""
        return None if self.t_started is None else self.t_started - self.t_submit


class EngineWorker:
    def __init__(self, engine: Engine, queue_timeout: float = 0.0):
        """``queue_timeout``: seconds a request may wait for a KV slot before it is refused (0: no limit)."""
        self.engine, self.queue_timeout = engine, queue_timeout
        self._cv = threading.Condition()
        self._cmds: list[tuple[str, RequestHandle]] = []
        self._calls: list[tuple[Callable[[], Any], concurrent.futures.Future]] = []
        self._stopping = False
        self._active: dict[int, RequestHandle] = {}  # seq_id -> handle (worker thread only)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.step_seconds = 0.0
        self.aborted = 0  # requests aborted before they finished (client gone, shutdown)
        self.in_flight = 0  # requests submitted and not yet ended (event loop only)
        self._abort_at: float | None = None  # shutdown: abort what still runs at this time.monotonic()

    # -- called on the event loop ------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        release_threads()  # from here on only the worker thread runs parallel work
        self._thread = threading.Thread(target=self._run, name="specdecode-engine", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> RequestHandle:
        handle = RequestHandle(prompt_ids, params)
        self.in_flight += 1
        self._post("add", handle)
        return handle

    def abort(self, handle: RequestHandle) -> None:
        """Frees the request's slot and KV before the next step; a no-op once it finished."""
        self._post("abort", handle)

    def call(self, fn: Callable[[], Any]) -> asyncio.Future:
        """Runs ``fn()`` on the worker thread between two steps (the engine is not thread-safe);
        await the result."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            if self._stopping:  # the thread takes no more work: nobody would run it
                fut.set_exception(ApiError(503, "the engine is not running", "server_error"))
            else:
                self._calls.append((fn, fut))
                self._cv.notify()
        return asyncio.wrap_future(fut)

    def drain(self, grace: float) -> None:
        """Shutdown has begun: no new requests are taken; those still running after ``grace``
        seconds are aborted, so their responses end properly (finish_reason "abort") rather than
        being cut off, and those still waiting for a slot are refused (503)."""
        with self._cv:
            self._abort_at = time.monotonic() + grace
            self._cv.notify()

    def stop(self, timeout: float = 30.0) -> None:
        """Aborts whatever is still in flight and ends the thread (after the current step); once it has
        ended, lets go of the engine (``engine`` is then None), which the app's routes outlive."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self.engine = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def draining(self) -> bool:
        return self._abort_at is not None or self._stopping

    def _post(self, cmd: str, handle: RequestHandle) -> None:
        with self._cv:
            self._cmds.append((cmd, handle))
            self._cv.notify()

    # -- the worker thread -------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._cmds or self._calls or self._stopping or self.engine.has_work()):
                    self._cv.wait()
                cmds, self._cmds = self._cmds, []
                calls, self._calls = self._calls, []
                stopping = self._stopping
            for fn, fut in calls:
                try:
                    fut.set_result(fn())
                except Exception as e:
                    fut.set_exception(e)
            out: list[tuple[RequestHandle, tuple]] = []
            for cmd, handle in cmds:
                self._apply(cmd, handle, out)
            if stopping or (self._abort_at is not None and time.monotonic() >= self._abort_at):
                for handle in list(self._active.values()):
                    self._end(handle, out, shutting_down())
            elif self.queue_timeout:
                now = time.monotonic()
                for handle in list(self._active.values()):
                    if not handle.started and now - handle.t_submit > self.queue_timeout:
                        self._end(handle, out, queue_timeout(self.queue_timeout))
            if stopping:
                self._deliver(out)
                return
            if self.engine.has_work():
                self._step(out)
            self._deliver(out)

    def _apply(self, cmd: str, handle: RequestHandle, out: list) -> None:
        if cmd == "add":
            try:
                handle.seq = self.engine.add_request(handle.prompt_ids, handle.params)
            except Exception as e:  # a SpecDecodeError becomes a 400 in the handler
                out.append((handle, ("error", e)))
                return
            self._active[handle.seq.seq_id] = handle
        elif handle.seq is not None and handle.seq.seq_id in self._active:
            self.engine.abort(handle.seq)
            self.aborted += 1
            del self._active[handle.seq.seq_id]
            out.append((handle, ("done", None)))

    def _end(self, handle: RequestHandle, out: list, refusal: ApiError) -> None:
        """Aborts a request: a running one's response ends (finish_reason "abort"); one still waiting
        for a slot has sent nothing yet, and gets ``refusal`` instead."""
        self.engine.abort(handle.seq)
        del self._active[handle.seq.seq_id]
        if handle.started:
            self.aborted += 1
            out.append((handle, ("done", None)))
        else:
            out.append((handle, ("error", refusal)))

    def _step(self, out: list) -> None:
        t0 = time.perf_counter()
        try:
            results = self.engine.step()
        except Exception as e:
            # A failure the engine could not pin on one request (it ends only those it can): fail
            # the requests in flight, keep serving the next ones. The prefix cache may describe
            # half-written slots now, so it starts over.
            log.exception("engine step failed; aborting %d request(s)", len(self._active))
            for handle in list(self._active.values()):
                out.append((handle, ("error", e)))
                self.engine.abort(handle.seq)
            self._active.clear()
            self.engine.reset_prefix_cache()
            return
        self.steps += 1
        self.step_seconds += time.perf_counter() - t0
        waiting = {s.seq_id for s in self.engine.waiting}
        for handle in self._active.values():  # before their first delta: the handler waits for this
            if not handle.started and handle.seq.seq_id not in waiting:
                handle.started, handle.t_started = True, time.monotonic()
                out.append((handle, ("running", None)))
        for r in results:
            handle = self._active.get(r.seq.seq_id)
            if handle is not None and r.error is not None:  # the engine ended it (and logged why)
                del self._active[r.seq.seq_id]
                out.append((handle, ("error", r.error)))
            elif handle is not None and r.delta:
                out.append((handle, ("delta", r.delta)))
        for seq_id, handle in list(self._active.items()):
            if handle.seq.finished:
                del self._active[seq_id]
                out.append((handle, ("done", None)))

    def _deliver(self, out: list) -> None:
        if not out:
            return
        try:
            self._loop.call_soon_threadsafe(self._put_all, out)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def _put_all(self, out: list) -> None:
        for handle, event in out:
            if event[0] in ("done", "error") and not handle.ended:
                handle.ended = True
                self.in_flight -= 1
            handle.events.put_nowait(event)
