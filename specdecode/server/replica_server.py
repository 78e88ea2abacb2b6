"""Runs the replicas application (replicas.py) on Ray: starts a local Ray instance or joins a cluster,
deploys, serves until SIGINT or SIGTERM, and takes the application down again."""
from __future__ import annotations

import logging
import os
import re
import signal
import threading

import ray
from ray import serve

from ..config import EngineConfig, ReplicaConfig, ServerConfig
from ..errors import SpecDecodeError
from ..store import resolve_model
from .replica_metrics import MetricsBoard
from .replicas import ENGINES, build_app

log = logging.getLogger("specdecode.server")

APP, BOARD = "specdecode", "specdecode-metrics"
TREE = "LlmPrefixTreeActor"  # the prefix tree of the engines' router (Ray Serve LLM names it so)


class ReplicaServer:
    """Starts (or joins) Ray, runs the application, and takes it down again."""

    def __init__(self, cfg: EngineConfig, rcfg: ReplicaConfig, names: list[str], api_key: str | None = None,
                 server: ServerConfig = ServerConfig(), log_level: str = "info"):
        """``server``: the endpoint (host, port) and every replica's app settings (limits, shutdown)."""
        self.cfg, self.rcfg, self.names, self.api_key = cfg, rcfg, names, api_key
        self.server, self.log_level = server, log_level
        self.local = rcfg.ray_address is None

    @property
    def url(self) -> str:
        return f"http://{self.server.host}:{self.server.port}"

    def start(self, own_signals: bool = False) -> "ReplicaServer":
        """``own_signals``: SIGINT and SIGTERM interrupt the start (and then take the application
        down), rather than reach the handlers ray.init installs, which abort the process."""
        level = self.log_level.upper()
        if self.local:  # a wrong model is one line before Ray starts; a known one is pulled once, for all
            for model in (self.cfg.model, self.cfg.spec.model_draft):
                if model is not None:
                    resolve_model(model)
        ray.init(address=self.rcfg.ray_address or "local", include_dashboard=False if self.local else None,
                 logging_level=level, configure_logging=False)
        if own_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.default_int_handler)
        try:
            if self.local:
                self._check_resources()
            # detached: the replicas' metrics outlive this process, as the application does on a cluster
            board = ray.remote(num_cpus=0)(MetricsBoard).options(
                name=BOARD, namespace="serve", lifetime="detached", get_if_exists=True).remote()
            serve.start(http_options={"host": self.server.host, "port": self.server.port},
                        logging_config={"log_level": level})
            app = build_app(self.cfg, self.rcfg, self.server, self.names, self.api_key, board)
            serve.run(app, name=APP, route_prefix="/", logging_config={"log_level": level})
        except RuntimeError as e:  # a replica failed to start
            reason = _failure() or str(e)
            self.stop()
            raise SpecDecodeError(f"the engine replicas did not start: {reason}") from None
        except BaseException:
            self.stop()
            raise
        return self

    def _check_resources(self) -> None:
        have = ray.cluster_resources()
        for what, each, flag in (("CPU", self.rcfg.replica_cpus, "--replica-cpus"),
                                 ("GPU", self.rcfg.replica_gpus, "--replica-gpus")):
            need = self.rcfg.replicas * each
            if need > have.get(what, 0.0) + 1e-9:
                raise SpecDecodeError(f"--replicas {self.rcfg.replicas} x {flag} {each:g} needs {need:g} {what}s, "
                                      f"but this machine has {have.get(what, 0.0):g}: lower {flag} (fractions "
                                      f"are fine) or join a cluster with --ray-address")

    def stop(self) -> None:
        if not ray.is_initialized():
            return
        try:
            if self.local:
                serve.shutdown()
            else:  # a shared cluster may serve other applications: take down only what was ours
                try:
                    serve.delete(APP)
                finally:
                    for name, namespace in ((BOARD, "serve"), (TREE, f"serve::{APP}::{ENGINES}")):
                        try:
                            ray.kill(ray.get_actor(name, namespace=namespace))
                        except ValueError:  # never created: the application did not start
                            pass
        finally:
            ray.shutdown()

    def __enter__(self) -> "ReplicaServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _failure() -> str | None:
    """The last line of a failed deployment's message: the exception its replicas raised."""
    try:
        for dep in serve.status().applications[APP].deployments.values():
            lines = [x.strip() for x in dep.message.splitlines() if x.strip()]
            if dep.status == "DEPLOY_FAILED" and lines:  # "specdecode.errors.ModelFileError: <what>"
                return re.sub(r"^specdecode\.errors\.\w+: ", "", lines[-1])
    except Exception:  # no status: the caller has the deployment's own message
        pass
    return None


def serve_replicas(cfg: EngineConfig, rcfg: ReplicaConfig, names: list[str], **kw) -> int:
    """The serve command with --replicas: runs until SIGINT or SIGTERM. ``kw``: ReplicaServer's options."""
    stop = threading.Event()
    srv = ReplicaServer(cfg, rcfg, names, **kw).start(own_signals=True)
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        where = "a local Ray instance" if srv.local else f"the Ray cluster at {rcfg.ray_address}"
        log.info("serving %s with %d engine replicas on %s at %s (pid %d)", names[0], rcfg.replicas, where,
                    srv.url, os.getpid())
        while not stop.wait(0.5):
            pass
        log.info("shutting down: in-flight requests get %gs to finish", srv.server.shutdown_timeout)
    finally:
        srv.stop()
    return 0
