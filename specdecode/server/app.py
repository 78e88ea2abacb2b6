"""The OpenAI-compatible HTTP API (FastAPI) over an Engine, which a worker thread owns.

Every user mistake is an OpenAI-style error JSON with status 400 (401 bad key, 404 unknown route,
405 wrong method), never a 500; only a failing engine step is a 500, and the server keeps serving.
A request whose client goes away (streaming or not) is aborted at once: its slot and KV are free
before the next engine step."""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from ..engine.engine import Engine
from ..errors import InvalidRequestError, SpecDecodeError
from .metrics import CONTENT_TYPE, ServerMetrics
from .schemas import BaseRequest, ChatRequest, CompletionRequest, ResponseBuilder, error_body, usage
from .worker import EngineWorker, RequestHandle

log = logging.getLogger("specdecode.server")


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code = status, message, type_, code


def _error(status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
           headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code), status_code=status, headers=headers)


def _describe(e: ValidationError) -> str:
    err = e.errors(include_url=False)[0]
    if err["type"] == "json_invalid":
        return f"the body is not valid JSON ({err['msg'].removeprefix('Invalid JSON: ')})"
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else f"the body must be a JSON object ({err['msg']})"


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _spec(handle: RequestHandle) -> dict:
    return handle.seq.stats.to_dict()


class _StreamWithCleanup(StreamingResponse):
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


MAX_BODY_BYTES = 8 * 2**20  # a request body larger than this is refused (413) before it is parsed


def create_app(engine: Engine, model_names: list[str], api_key: str | None = None,
               max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """``model_names[0]`` is the name /v1/models lists; requests may use any of them."""
    worker = EngineWorker(engine)
    metrics = ServerMetrics(worker)
    tokenizer = engine.tokenizer
    vocab = engine.model.cfg.vocab_size

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker.start(asyncio.get_running_loop())
        try:
            yield
        finally:  # uvicorn gets here after in-flight requests finished or its grace period ended
            await asyncio.to_thread(worker.stop)

    app = FastAPI(title="specdecode", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.worker, app.state.metrics, app.state.engine = worker, metrics, engine

    @app.exception_handler(ApiError)
    async def _api_error(request, e: ApiError):
        metrics.errors.labels(str(e.status)).inc()
        return _error(e.status, e.message, e.type, e.code)

    @app.exception_handler(SpecDecodeError)
    async def _user_error(request, e: SpecDecodeError):
        metrics.errors.labels("400").inc()
        return _error(400, str(e))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, e: RequestValidationError):
        metrics.errors.labels("400").inc()
        return _error(400, str(e.errors()[0].get("msg", "invalid request")))

    @app.exception_handler(HTTPException)
    async def _http_error(request, e: HTTPException):
        metrics.errors.labels(str(e.status_code)).inc()
        code = {401: "invalid_api_key", 404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        return _error(e.status_code, str(e.detail), code=code, headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def _internal_error(request, e: Exception):
        log.exception("internal error")
        metrics.errors.labels("500").inc()
        return _error(500, "internal server error", "internal_error")

    async def check_key(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key.encode()):
            raise HTTPException(401, "missing or incorrect API key (send 'Authorization: Bearer <key>')",
                                headers={"WWW-Authenticate": "Bearer"})

    auth = [Depends(check_key)]

    @app.get("/health")
    async def health():
        if not worker.alive:
            return _error(503, "the engine is not running", "server_error")
        return {"status": "ok"}

    @app.get("/v1/models", dependencies=auth)
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "specdecode",
                                            "max_model_len": engine.max_model_len} for name in model_names]}

    @app.get("/metrics", dependencies=auth)
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    async def read_body(request: Request) -> bytes:
        """The body, refused with 413 as soon as it is known to exceed max_body_bytes."""
        too_big = ApiError(413, f"the request body exceeds {max_body_bytes} bytes", code="request_too_large")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body_bytes:
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)

    async def parse(request: Request, schema: type[BaseModel]):
        try:
            req = schema.model_validate_json(await read_body(request))
        except ValidationError as e:
            raise ApiError(400, _describe(e)) from None
        req.check_supported()
        if req.model not in model_names:
            raise ApiError(400, f"model {req.model!r} is not served here (use {model_names[0]!r})",
                           code="model_not_found")
        return req

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat_completions(request: Request):
        req = await parse(request, ChatRequest)

        def encode() -> list[int]:  # templating and tokenizing a long prompt take a while: off the loop
            text = tokenizer.apply_chat_template(req.template_messages(), add_generation_prompt=True)
            return tokenizer.encode(text, add_special_tokens=False)  # the template wrote any BOS it wants
        ids = await asyncio.to_thread(encode)
        return await generate(request, req, ids, ResponseBuilder(True, req.model), "chat")

    @app.post("/v1/completions", dependencies=auth)
    async def completions(request: Request):
        req = await parse(request, CompletionRequest)
        prompt = req.single_prompt()
        ids = list(prompt) if isinstance(prompt, list) else await asyncio.to_thread(tokenizer.encode, prompt)
        if any(not 0 <= t < vocab for t in ids):
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})")
        return await generate(request, req, ids, ResponseBuilder(False, req.model), "completions")

    async def generate(request: Request, req: BaseRequest, ids: list[int], rb: ResponseBuilder, endpoint: str):
        ctx = engine.max_model_len
        if not ids:
            raise InvalidRequestError("the prompt is empty")
        if len(ids) >= ctx:  # can never fit: refuse now rather than queue it
            raise InvalidRequestError(f"the prompt has {len(ids)} tokens but the context holds {ctx}")
        want = req.requested_max_tokens()
        params = req.sampling_params(ctx - len(ids) if want is None else want)
        if len(ids) + params.max_tokens > ctx:
            raise InvalidRequestError(f"max_tokens {params.max_tokens} plus the prompt's {len(ids)} tokens exceed "
                                      f"the context of {ctx} tokens")
        if not worker.alive:
            raise ApiError(503, "the engine is not running", "server_error")
        handle = worker.submit(ids, params)
        try:
            kind, value = await handle.events.get()
        except asyncio.CancelledError:
            worker.abort(handle)
            raise
        if kind == "error":
            raise value
        if req.stream:
            return _StreamWithCleanup(stream(handle, rb, req.include_usage, endpoint), lambda: worker.abort(handle))
        return await complete(request, handle, rb, endpoint)

    async def complete(request: Request, handle: RequestHandle, rb: ResponseBuilder, endpoint: str):
        done = asyncio.create_task(_until_done(handle))
        gone = asyncio.create_task(_until_disconnect(request))
        try:
            await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not done.done():  # client disconnected, or this handler was cancelled
                done.cancel()
                worker.abort(handle)
        if not done.done() or done.cancelled():
            return Response(status_code=499)  # nobody is listening
        if done.result() is not None:
            raise done.result()
        seq = handle.seq
        metrics.observe(endpoint, seq)
        return rb.full(seq.text, seq.finish_reason, usage(len(seq.prompt_ids), len(seq.output_ids)), _spec(handle))

    async def stream(handle: RequestHandle, rb: ResponseBuilder, include_usage: bool, endpoint: str):
        if rb.chat:
            yield _sse(rb.chunk(role=True, with_usage=include_usage))
        while True:
            kind, value = await handle.events.get()
            if kind == "delta":
                yield _sse(rb.chunk(value, with_usage=include_usage))
            elif kind == "error":  # headers are gone: report in the stream, as OpenAI and vLLM do
                if isinstance(value, SpecDecodeError):
                    message = str(value)
                else:  # internal detail stays in the log (the worker logged it), not in the response
                    message = "generation failed (internal error)"
                yield _sse(error_body(message, "internal_error"))
                break
            else:
                seq = handle.seq
                metrics.observe(endpoint, seq)
                final = rb.chunk(None, seq.finish_reason, with_usage=include_usage)
                final["spec"] = _spec(handle)
                yield _sse(final)
                if include_usage:
                    yield _sse(rb.usage_chunk(usage(len(seq.prompt_ids), len(seq.output_ids)), final["spec"]))
                break
        yield "data: [DONE]\n\n"

    return app


async def _until_done(handle: RequestHandle) -> Exception | None:
    while True:
        kind, value = await handle.events.get()
        if kind == "done":
            return None
        if kind == "error":
            return value


async def _until_disconnect(request: Request) -> None:
    # The body has been read, so the next message the server sends is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass
