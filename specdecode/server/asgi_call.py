"""One HTTP request through an ASGI app in this process, and the app's lifespan, without a socket.

An engine replica on Ray Serve answers every request with the very app the single-process server runs
(create_app): status codes, error bodies, API keys, limits and streaming are then the same code in
both set-ups, not a copy that drifts."""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import AsyncIterator

from .schemas import error_body

log = logging.getLogger("specdecode.server")

_END = object()  # the app returned
_tasks: set[asyncio.Task] = set()  # apps still finishing after their caller left (strong references)


@dataclass(frozen=True)
class HttpCall:
    """An HTTP request as plain, picklable data."""
    method: str
    path: str
    query: bytes = b""
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: bytes = b""


def head(status: int, headers: list[tuple[str, str]], body: bytes, more: bool) -> dict:
    """The first piece of a response: status, headers and the first part of the body (all of it when
    ``more`` is false)."""
    return {"status": status, "headers": headers, "body": body, "more": more}


def _internal_error() -> dict:
    body = json.dumps(error_body("internal server error", "internal_error")).encode()
    return head(500, [("content-type", "application/json"), ("content-length", str(len(body)))], body, False)


async def call(app, req: HttpCall) -> AsyncIterator[dict | bytes]:
    """Yields the response's ``head`` once the app has sent the first non-empty part of its body (or
    all of it), then the remaining parts as bytes. Closing the iterator before the end is the client
    disconnecting: the app sees ``http.disconnect`` and aborts the request, as it does under uvicorn."""
    sent: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    body_given = False

    async def receive() -> dict:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": req.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if gone.is_set():
            raise OSError("the client disconnected")  # what a server's send does: the app stops writing
        sent.put_nowait(message)

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": req.method, "scheme": "http", "path": req.path, "raw_path": req.path.encode(),
             "root_path": "", "query_string": req.query, "headers": list(req.headers),
             "client": None, "server": None, "state": {}}

    async def run() -> None:
        try:
            await app(scope, receive, send)
        except Exception:  # the app has already answered 500 if it could; its log says why
            log.debug("ASGI app raised", exc_info=True)
        finally:
            sent.put_nowait(_END)

    task = asyncio.create_task(run())
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    start = None
    try:
        while True:
            msg = await sent.get()
            if msg is _END:
                if start is None:
                    yield _internal_error()
                return
            if msg["type"] == "http.response.start":
                start = msg
                continue
            if msg["type"] != "http.response.body" or start is None:
                continue
            body, more = msg.get("body", b""), msg.get("more_body", False)
            if start is not True:
                if not body and more:
                    continue
                yield head(start["status"], [(k.decode("latin-1"), v.decode("latin-1"))
                                             for k, v in start.get("headers", [])], body, more)
                start = True
            elif body:
                yield body
            if not more:
                return
    finally:
        gone.set()


async def get(app, path: str, api_key: str | None = None) -> tuple[int, bytes]:
    """The status and body of a GET the process makes of its own app (health, metrics): from this
    machine, so a Host allow-list for loopback serving lets it through."""
    headers = ((b"host", b"localhost"),) + (((b"authorization", f"Bearer {api_key}".encode()),) if api_key else ())
    status, body = 500, b""
    async for piece in call(app, HttpCall("GET", path, headers=headers)):
        if isinstance(piece, dict):
            status, body = piece["status"], piece["body"]
        else:
            body += piece
    return status, body


class Lifespan:
    """The app's ASGI lifespan (create_app's starts and stops the engine's worker thread) on the
    event loop that will serve its requests."""

    def __init__(self, app):
        self.app = app
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._outbox: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None

    async def _expect(self, kind: str) -> None:
        msg = await self._outbox.get()
        if msg["type"] != f"lifespan.{kind}.complete":
            raise RuntimeError(f"the app's {kind} failed: {msg.get('message', '')}")

    async def start(self) -> "Lifespan":
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        self._task = asyncio.create_task(self.app(scope, self._inbox.get, self._outbox.put))
        await self._inbox.put({"type": "lifespan.startup"})
        await self._expect("startup")
        return self

    async def stop(self) -> None:
        if self._task is None or self._task.done():
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        await self._expect("shutdown")
        await self._task
