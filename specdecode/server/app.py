"""The OpenAI-compatible HTTP API (FastAPI) over an Engine, which a worker thread owns.

Every user mistake is an OpenAI-style error JSON with status 400 (401 bad key, 404 unknown route,
405 wrong method, 413 / 415 / 429 / 503 from admission.py), never a 500; only a failing engine step
is a 500, for the requests it fails, and the server keeps serving. A request's response starts once
it holds a KV slot, so a refusal while it waits is still an HTTP status. A request whose client goes
away (waiting, streaming or not) is aborted at once: its slot and KV are free before the next step."""
from __future__ import annotations

import asyncio
import logging
import secrets
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from ..config import ServerConfig
from ..engine.engine import Engine
from ..errors import InvalidRequestError, SpecDecodeError
from .admission import ApiError, allowed_hosts, check_capacity, check_host, check_json, clip, read_body
from .metrics import CONTENT_TYPE, ServerMetrics
from .schemas import (BaseRequest, ChatRequest, CompletionRequest, ResponseBuilder, error_body, error_response,
                      sse, usage)
from .streams import StreamWithCleanup, until_disconnect, until_done
from .worker import EngineWorker, RequestHandle

log = logging.getLogger("specdecode.server")


def _describe(e: ValidationError) -> str:
    err = e.errors(include_url=False)[0]
    if err["type"] == "json_invalid":
        return f"the body is not valid JSON ({err['msg'].removeprefix('Invalid JSON: ')})"
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else f"the body must be a JSON object ({err['msg']})"


def _spec(handle: RequestHandle) -> dict:
    return handle.seq.stats.to_dict()


MAX_BODY_BYTES = ServerConfig.max_body_bytes


def create_app(engine: Engine, model_names: list[str], api_key: str | None = None,
               config: ServerConfig | None = None) -> FastAPI:
    """``model_names[0]`` is the name /v1/models lists; requests may use any of them. ``config``: the
    serve command's settings, whose Host allow-list follows the address it binds; without one, the
    defaults and no Host check (an app that another front end serves: tests, bench-serve, replicas)."""
    hosts = allowed_hosts(config, api_key) if config is not None else None
    config = config or ServerConfig()
    worker = EngineWorker(engine, config.queue_timeout)
    metrics = ServerMetrics(worker)
    tokenizer = engine.tokenizer
    vocab, num_slots, ctx = engine.model.cfg.vocab_size, engine.kv.num_slots, engine.max_model_len
    # The routes below reach the engine through the worker only, never by closing over it: FastAPI keeps
    # every route's function in a module-level cache, so an app's closures outlive it, and the worker lets
    # go of its engine when it stops (a process that serves engine after engine, as bench-serve does,
    # would otherwise keep all of them and their KV caches).
    max_piece = tokenizer.max_piece_chars  # a scan of the vocabulary (~0.1 s): at start, not in the first request

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker.start(asyncio.get_running_loop())
        try:
            yield
        finally:  # uvicorn gets here after in-flight requests finished or its grace period ended
            await asyncio.to_thread(worker.stop)

    async def host_allowed(request: Request) -> None:  # every route, /health too
        check_host(request.headers.get("host"), hosts)

    app = FastAPI(title="specdecode", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(host_allowed)])
    app.state.worker, app.state.metrics = worker, metrics

    @app.exception_handler(ApiError)
    async def _api_error(request, e: ApiError):
        metrics.errors.labels(str(e.status)).inc()
        return error_response(e.status, e.message, e.type, e.code, e.headers)

    @app.exception_handler(SpecDecodeError)
    async def _user_error(request, e: SpecDecodeError):
        metrics.errors.labels("400").inc()
        return error_response(400, str(e))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, e: RequestValidationError):
        metrics.errors.labels("400").inc()
        return error_response(400, str(e.errors()[0].get("msg", "invalid request")))

    @app.exception_handler(HTTPException)
    async def _http_error(request, e: HTTPException):
        metrics.errors.labels(str(e.status_code)).inc()
        code = {401: "invalid_api_key", 404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        return error_response(e.status_code, str(e.detail), code=code, headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def _internal_error(request, e: Exception):
        log.exception("internal error")
        metrics.errors.labels("500").inc()
        return error_response(500, "internal server error", "internal_error")

    async def check_key(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key.encode()):
            raise HTTPException(401, "missing or incorrect API key (send 'Authorization: Bearer <key>')",
                                headers={"WWW-Authenticate": "Bearer"})

    async def json_body(request: Request) -> None:
        check_json(request.headers.get("content-type"))

    def admit() -> None:
        if not worker.alive:
            raise ApiError(503, "the engine is not running", "server_error")
        check_capacity(worker.in_flight, num_slots, config.max_queue, worker.draining)

    auth = [Depends(check_key)]
    post = auth + [Depends(json_body)]

    @app.get("/health")
    async def health():
        if not worker.alive:
            return error_response(503, "the engine is not running", "server_error")
        return {"status": "ok"}

    @app.get("/v1/models", dependencies=auth)
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "specdecode",
                                            "max_model_len": ctx} for name in model_names]}

    @app.get("/metrics", dependencies=auth)
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/reset_prefix_cache", dependencies=auth)
    async def reset_prefix_cache():
        """vLLM's route: later requests find no cached prompt (a benchmark's levels start cold)."""
        if not worker.alive:
            raise ApiError(503, "the engine is not running", "server_error")
        return {"reset": await worker.call(lambda: worker.engine.reset_prefix_cache())}

    async def parse(request: Request, schema: type[BaseModel]):
        admit()  # a full server refuses before reading, parsing and tokenizing
        try:
            req = schema.model_validate_json(await read_body(request, config.max_body_bytes))
        except ValidationError as e:
            raise ApiError(400, _describe(e)) from None
        req.check_supported()
        if req.model not in model_names:
            raise ApiError(400, f"model {clip(req.model)!r} is not served here (use {model_names[0]!r})",
                           code="model_not_found")
        return req

    def check_length(chars: int) -> None:
        """Refuses a prompt too long for the context before tokenizing it. A token covers at most
        max_piece_chars characters; the factor 4 leaves room for normalization that merges code points."""
        if chars > 4 * ctx * max_piece:
            raise InvalidRequestError(f"the prompt has {chars} characters, far more than a context of {ctx} "
                                      "tokens holds")

    @app.post("/v1/chat/completions", dependencies=post)
    async def chat_completions(request: Request):
        req = await parse(request, ChatRequest)
        check_length(sum(len(m.get("content") or "") for m in req.template_messages()))

        def encode() -> list[int]:  # templating and tokenizing a long prompt take a while: off the loop
            text = tokenizer.apply_chat_template(req.template_messages(), add_generation_prompt=True)
            return tokenizer.encode(text, add_special_tokens=False)  # the template wrote any BOS it wants
        ids = await asyncio.to_thread(encode)
        return await generate(request, req, ids, ResponseBuilder(True, req.model, tokenizer), "chat")

    @app.post("/v1/completions", dependencies=post)
    async def completions(request: Request):
        req = await parse(request, CompletionRequest)
        prompt = req.single_prompt()
        check_length(len(prompt))
        ids = list(prompt) if isinstance(prompt, list) else await asyncio.to_thread(tokenizer.encode, prompt)
        if any(not 0 <= t < vocab for t in ids):
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})")
        return await generate(request, req, ids, ResponseBuilder(False, req.model, tokenizer), "completions")

    async def generate(request: Request, req: BaseRequest, ids: list[int], rb: ResponseBuilder, endpoint: str):
        if not ids:
            raise InvalidRequestError("the prompt is empty")
        if len(ids) >= ctx:  # can never fit: refuse now rather than queue it
            raise InvalidRequestError(f"the prompt has {len(ids)} tokens but the context holds {ctx}")
        want = req.requested_max_tokens()
        params = req.sampling_params(ctx - len(ids) if want is None else want)
        if len(ids) + params.max_tokens > ctx:
            raise InvalidRequestError(f"max_tokens {params.max_tokens} plus the prompt's {len(ids)} tokens exceed "
                                      f"the context of {ctx} tokens")
        admit()  # again: others were taken while this one was tokenized
        handle = worker.submit(ids, params)
        if not await started(request, handle):
            return Response(status_code=499)  # the client left while it waited
        if req.stream:
            return StreamWithCleanup(stream(handle, rb, req.include_usage, endpoint), lambda: worker.abort(handle))
        return await complete(request, handle, rb, endpoint)

    async def started(request: Request, handle: RequestHandle) -> bool:
        """Waits until the request holds a KV slot (True) or its client has gone (False); raises
        the error it got instead (refused, timed out in the queue, failed)."""
        first = asyncio.create_task(handle.events.get())
        gone = asyncio.create_task(until_disconnect(request))
        try:
            await asyncio.wait({first, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not first.done():
                first.cancel()
                worker.abort(handle)
        if not first.done() or first.cancelled():
            return False
        kind, value = first.result()
        if kind == "error":
            raise value
        return True

    async def complete(request: Request, handle: RequestHandle, rb: ResponseBuilder, endpoint: str):
        done = asyncio.create_task(until_done(handle))
        gone = asyncio.create_task(until_disconnect(request))
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
        metrics.observe(endpoint, seq, handle.queue_seconds)
        return rb.full(seq.text, seq.finish_reason, usage(len(seq.prompt_ids), len(seq.output_ids)), _spec(handle),
                       seq.logprobs)

    async def stream(handle: RequestHandle, rb: ResponseBuilder, include_usage: bool, endpoint: str):
        if rb.chat:
            yield sse(rb.chunk(role=True, with_usage=include_usage))
        sent = 0  # log probabilities already streamed (the worker thread appends to seq.logprobs)

        def new_logprobs() -> list | None:
            nonlocal sent
            lps = handle.seq.logprobs
            if lps is None:
                return None
            out = lps[sent:]  # a snapshot: the list only grows
            sent += len(out)
            return out
        while True:
            kind, value = await handle.events.get()
            if kind == "delta":
                yield sse(rb.chunk(value, with_usage=include_usage, logprobs=new_logprobs()))
            elif kind == "error":  # headers are gone: report in the stream, as OpenAI and vLLM do
                if isinstance(value, SpecDecodeError):
                    message = str(value)
                else:  # internal detail stays in the log (the worker logged it), not in the response
                    message = "generation failed (internal error)"
                yield sse(error_body(message, "internal_error"))
                break
            else:
                seq = handle.seq
                metrics.observe(endpoint, seq, handle.queue_seconds)
                final = rb.chunk(None, seq.finish_reason, with_usage=include_usage, logprobs=new_logprobs())
                final["spec"] = _spec(handle)
                yield sse(final)
                if include_usage:
                    yield sse(rb.usage_chunk(usage(len(seq.prompt_ids), len(seq.output_ids)), final["spec"]))
                break
        yield "data: [DONE]\n\n"

    return app
