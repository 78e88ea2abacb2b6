"""``specdecode serve --replicas N``: N engine replicas as one Ray Serve application behind one
OpenAI-compatible endpoint (docs/replicas.md); replica_server.py starts it.

Ray Serve does the distributed work: it places the replicas, restarts a failed one, queues and
routes requests, and runs the HTTP proxies. Two deployments:
- ``EngineReplica`` (N replicas): an engine, its worker thread and its speculation controller, behind
  the single-process server's own app (create_app), which answers every HTTP request in-process
  (asgi_call.py). Streaming, API keys, error codes and limits are therefore the same code.
- ``Ingress`` (one replica, no CPU of its own): reads a request, sends it to an engine replica through
  a DeploymentHandle and passes the answer back. Ray Serve LLM's prefix-aware router picks the
  replica: a prompt goes where prompts sharing its prefix went (so the prefix cache pays), unless
  that replica is busier than the least busy one by more than a threshold. A replica that dies before
  its answer began is replaced by another one for that request; a stream it had begun ends with an
  OpenAI-style error event. ``/metrics`` gathers every replica's metrics, labelled by replica.

This module imports Ray; nothing imports it unless ``--replicas`` is given."""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, replace

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.config import RequestRouterConfig
from ray.serve.exceptions import ReplicaUnavailableError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..config import EngineConfig, ReplicaConfig, ServerConfig
from .admission import ApiError, read_body
from .app import create_app
from .metrics import CONTENT_TYPE as METRICS_TYPE
from .asgi_call import HttpCall, Lifespan, call, get
from .replica_metrics import PUSH_PERIOD, IngressMetrics
from .schemas import error_body, error_response, sse

log = logging.getLogger("specdecode.server")


def _prefix_router():
    """Ray Serve LLM's prefix-aware router, from the module that defines it: its public re-export
    (ray.serve.llm.request_router) imports the whole of Ray Serve LLM, which needs the ray[llm] extra
    (vLLM). Importing it also points the root logger at Ray Serve LLM's JSON output; the root logger
    is this process's own, so that is undone."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        from ray.llm._internal.serve.routing_policies.prefix_aware import prefix_aware_router
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return prefix_aware_router.PrefixCacheAffinityRouter


PrefixCacheAffinityRouter = _prefix_router()
ENGINES = "EngineReplica"  # the engines' deployment
ATTEMPTS = 3  # replicas tried for a request whose replica went away before answering
ROUTING_CHARS = 4096  # leading characters of a prompt the router matches (bounds its prefix tree's work)
INGRESS_MAX_ONGOING = 4096  # the ingress only relays: the engine replicas bound the work
LOST = "generation failed: the engine replica serving this request went away; send the request again"
_GONE = (RayActorError, ReplicaUnavailableError)  # the replica died or was removed


@dataclass(frozen=True)
class RoutedCall:
    """What the ingress sends an engine replica; ``prompt`` is the text the prefix-aware router matches."""
    call: HttpCall
    prompt: str


def routing_text(path: str, body: bytes) -> str:
    """The leading part of a request's prompt as text (chat messages in order, a completion's prompt,
    token ids as numbers); "" for any other request, or one whose body does not parse."""
    if path not in ("/v1/chat/completions", "/v1/completions"):
        return ""
    try:
        obj = json.loads(body)
    except ValueError:
        return ""
    if not isinstance(obj, dict):
        return ""
    if path.endswith("/chat/completions"):
        msgs = obj.get("messages")
        text = "".join(f"<{m.get('role')}>{json.dumps(m.get('content'), ensure_ascii=False)}"
                       for m in msgs if isinstance(m, dict)) if isinstance(msgs, list) else ""
    else:
        prompt = obj.get("prompt")
        text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    return text[:ROUTING_CHARS]


class EngineReplica:
    """One engine behind the single-process server's app; requests arrive as ``forward`` calls."""

    async def __init__(self, cfg: EngineConfig, server: ServerConfig, names: list[str], api_key: str | None, board):
        from ..llm import LLM

        self.app = create_app(LLM(engine_config=cfg).engine, names, api_key=api_key, config=server)
        self.lifespan = await Lifespan(self.app).start()  # on the loop that runs forward()
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.api_key = api_key
        self.board = board
        self.reporter = asyncio.create_task(self._report())

    async def forward(self, req: RoutedCall):
        first = True
        async for piece in call(self.app, req.call):
            if first:
                piece["replica"], first = self.replica, False
            yield piece

    async def _report(self) -> None:
        while True:
            try:
                status, text = await get(self.app, "/metrics", self.api_key)
                if status == 200:
                    await self.board.report.remote(self.replica, text.decode())
            except Exception:  # a report lost is replaced by the next one
                log.debug("metrics report failed", exc_info=True)
            await asyncio.sleep(PUSH_PERIOD)

    async def check_health(self) -> None:
        """Ray Serve replaces a replica whose engine thread has died."""
        if (await get(self.app, "/health"))[0] != 200:
            raise RuntimeError("the engine is not running")

    async def __del__(self):
        if hasattr(self, "reporter"):  # (not when __init__ failed)
            self.reporter.cancel()
            await self.lifespan.stop()  # stops the engine's worker, which aborts what still runs


class Ingress:
    def __init__(self, engines, server: ServerConfig, board):
        self.engines = engines.options(stream=True)
        self.server, self.board = server, board
        self.metrics = IngressMetrics()

    async def __call__(self, request: Request) -> Response:
        try:  # the whole body is held here: refuse an oversized one as the replica would
            body = await read_body(request, self.server.max_body_bytes)
        except ApiError as e:
            return error_response(e.status, e.message, e.type, e.code, e.headers)
        http = HttpCall(request.method, request.url.path, request.scope.get("query_string", b""),
                        tuple(request.scope["headers"]), body)
        req = RoutedCall(http, routing_text(http.path, http.body))
        for attempt in range(ATTEMPTS):
            # The router reads the prompt from positional arguments only, and needs one there: a
            # request without a prompt goes as a keyword, and is balanced on load alone.
            gen = self.engines.forward.remote(req) if req.prompt else self.engines.forward.remote(req=req)
            try:
                first = await gen.__anext__()
            except _GONE:
                log.warning("an engine replica went away before answering; sending the request again")
                self.metrics.retries.inc()
                await asyncio.sleep(0.1 * attempt)
                continue
            except asyncio.CancelledError:  # the client went away: so does the request
                gen.cancel()
                raise
            except Exception:
                log.exception("relaying a request to an engine replica failed")
                return error_response(500, "internal server error", "internal_error")
            if (http.method, http.path, first["status"]) == ("GET", "/metrics", 200):
                # a replica's app let the scrape in (API key, Host): the answer covers every replica
                return Response(self.metrics.render(await self.board.reports.remote()), media_type=METRICS_TYPE)
            return self._respond(first, gen)
        return error_response(503, "no engine replica could take the request; retry later", "server_error",
                              headers={"Retry-After": "1"})

    def _respond(self, first: dict, gen) -> Response:
        headers = [(k.lower(), v) for k, v in first["headers"]] + [("x-specdecode-replica", first["replica"])]
        if first["more"]:
            is_sse = any(k == "content-type" and v.startswith("text/event-stream") for k, v in headers)
            resp = StreamingResponse(self._rest(first["body"], gen, is_sse), first["status"])
            headers = [(k, v) for k, v in headers if k != "content-length"]
        else:
            resp = Response(first["body"], first["status"])
        resp.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        return resp

    async def _rest(self, body: bytes, gen, is_sse: bool):
        yield body
        finished = False
        try:
            async for piece in gen:
                yield piece
            finished = True
        except _GONE:
            finished = True
            log.warning("an engine replica went away mid-stream; the stream ends with an error")
            self.metrics.lost_streams.inc()
            if is_sse:  # as the single-process server reports a failure once the headers are gone
                yield sse(error_body(LOST, "internal_error")) + "data: [DONE]\n\n"
        finally:
            if not finished:  # the client went away: abort the request on its replica
                gen.cancel()


def build_app(cfg: EngineConfig, rcfg: ReplicaConfig, server: ServerConfig, names: list[str], api_key: str | None,
              board):
    """The Ray Serve application: the ingress bound to ``rcfg.replicas`` engine replicas, each running
    the server's app with ``server``'s settings. ``board``: a MetricsBoard actor."""
    if cfg.threads is None:  # a replica computes on the CPUs Ray reserved for it
        cfg = replace(cfg, threads=max(1, int(rcfg.replica_cpus)))
    router = RequestRouterConfig(
        request_router_class=PrefixCacheAffinityRouter,
        request_router_kwargs={"imbalanced_threshold": rcfg.imbalance(cfg.max_num_seqs), "do_eviction": True})
    # A replica takes what its own app admits (running, waiting) and one more, which its app refuses
    # (429, Retry-After) as the single-process server would: Ray Serve's queue stays short.
    engines = serve.deployment(EngineReplica).options(
        name=ENGINES, num_replicas=rcfg.replicas, max_ongoing_requests=cfg.max_num_seqs + server.max_queue + 1,
        ray_actor_options={"num_cpus": rcfg.replica_cpus, "num_gpus": rcfg.replica_gpus},
        graceful_shutdown_timeout_s=server.shutdown_timeout, request_router_config=router)
    ingress = serve.deployment(Ingress).options(num_replicas=1, ray_actor_options={"num_cpus": 0},
                                                max_ongoing_requests=INGRESS_MAX_ONGOING)
    return ingress.bind(engines.bind(cfg, server, names, api_key, board), server, board)
