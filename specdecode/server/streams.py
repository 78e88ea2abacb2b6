"""The pieces of a request's life the HTTP handlers await: the engine's events for it, the client's
disconnect, and a streamed response that aborts its request the moment the client goes away."""
from __future__ import annotations

from fastapi import Request
from fastapi.responses import StreamingResponse

from .worker import RequestHandle


class StreamWithCleanup(StreamingResponse):
    """Starlette cancels the body when the client disconnects; ``on_close`` then runs at once, not
    whenever the abandoned generator happens to be finalised."""

    def __init__(self, content, on_close):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


async def until_done(handle: RequestHandle) -> Exception | None:
    """Waits for the request's end: None when it finished, the exception when its step failed."""
    while True:
        kind, value = await handle.events.get()
        if kind == "done":
            return None
        if kind == "error":
            return value


async def until_disconnect(request: Request) -> None:
    # The body has been read, so the next message the server sends is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass
