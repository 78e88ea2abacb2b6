"""What a request must pass before it reaches the engine, and the one-line OpenAI-style error it gets
otherwise:

- the Host allow-list (400): a server on a loopback address with no API key answers only Host
  headers naming this machine, so a web page cannot reach it through DNS rebinding;
- a JSON content type on POST (415): a browser sends a cross-origin ``text/plain`` or form POST
  without asking first, never an ``application/json`` one;
- the body size (413), refused before the body is read whole;
- capacity: at most --max-num-seqs requests running and --max-queue waiting (429 beyond), none
  waiting longer than --queue-timeout (503), none taken while the server drains (503), each
  refusal with a Retry-After header."""
from __future__ import annotations

import ipaddress

from starlette.requests import Request

from ..config import ServerConfig

RETRY_AFTER_S = 5  # what a refused client is told to wait: about one slot's turnover on a CPU
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


class ApiError(Exception):
    """An HTTP error with an OpenAI-style body (create_app's handler renders it)."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.headers = status, message, type_, code, headers


def clip(value: str, n: int = 64) -> str:
    """A client's string as an error message quotes it: never the megabyte it may be."""
    return value if len(value) <= n else value[:n] + "..."


def _busy(status: int, message: str, code: str) -> ApiError:
    return ApiError(status, message, "rate_limit_error" if status == 429 else "server_error", code,
                    {"Retry-After": str(RETRY_AFTER_S)})


def queue_full(max_queue: int) -> ApiError:
    return _busy(429, f"the server is at capacity ({max_queue} requests already waiting): retry later", "queue_full")


def queue_timeout(seconds: float) -> ApiError:
    return _busy(503, f"no capacity freed up within {seconds:g} s: retry later", "queue_timeout")


def shutting_down() -> ApiError:
    return _busy(503, "the server is shutting down", "shutting_down")


def check_capacity(in_flight: int, slots: int, max_queue: int, draining: bool) -> None:
    """``in_flight``: requests taken and not yet answered, running (up to ``slots``) or waiting."""
    if draining:
        raise shutting_down()
    if in_flight >= slots + max_queue:
        raise queue_full(max_queue)


# -- Host ----------------------------------------------------------------------------------------
def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(cfg: ServerConfig, api_key: str | None) -> frozenset[str] | None:
    """The Host names to answer, None for any."""
    if cfg.allowed_hosts is not None:
        names = {h.strip().lower() for h in cfg.allowed_hosts}
        return None if "*" in names else frozenset(names)
    if is_loopback(cfg.host) and not api_key:
        return frozenset(LOCAL_NAMES + (cfg.host.strip("[]").lower(),))
    return None


def host_name(header: str) -> str:
    """'Example.com:8000' -> 'example.com', '[::1]:8000' -> '::1'."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    if h.count(":") > 1:  # a bare IPv6 address
        return h
    name, colon, port = h.rpartition(":")
    return (name if colon and port.isdigit() else h).rstrip(".")


def check_host(header: str | None, allowed: frozenset[str] | None) -> None:
    if allowed is not None and host_name(header or "") not in allowed:
        raise ApiError(400, f"Host {clip(header or '')!r} is not served here (the server's --allowed-hosts)",
                       code="invalid_host")


# -- the body ------------------------------------------------------------------------------------
def check_json(content_type: str | None) -> None:
    media = (content_type or "").split(";")[0].strip().lower()
    if media != "application/json":
        raise ApiError(415, f"the body must be sent as Content-Type: application/json (got {media or 'none'!r})",
                       code="unsupported_media_type")


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed ``max_bytes``."""
    too_big = ApiError(413, f"the request body exceeds {max_bytes} bytes", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)
