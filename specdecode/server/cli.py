"""``specdecode serve``: arguments and the command."""
from __future__ import annotations

import argparse
import logging
import os
from dataclasses import fields
from pathlib import Path

from ..args import add_engine_args, add_model_args, add_spec_args, engine_config
from ..config import ReplicaConfig, ServerConfig
from ..errors import SpecDecodeError

LOOPBACK = ("127.0.0.1", "localhost", "::1")
_SRV = {f.name: f.default for f in fields(ServerConfig)}


def add_serve_parser(sub) -> None:
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (continuous batching, speculative decoding)")
    add_model_args(s)
    add_engine_args(s)
    add_spec_args(s)
    s.add_argument("--host", default=_SRV["host"], help="address to listen on (default: this machine only)")
    s.add_argument("--port", type=int, default=_SRV["port"])
    s.add_argument("--api-key", default=os.environ.get("SPECDECODE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on every endpoint but /health "
                        "(default: $SPECDECODE_API_KEY; unset = no key)")
    s.add_argument("--served-model-name", action="append",
                   help="model name clients send (repeatable: the first is listed, all are accepted; "
                        "default: the --model name, without directory or .gguf)")
    s.add_argument("--shutdown-timeout", type=float, default=_SRV["shutdown_timeout"],
                   help="on SIGINT/SIGTERM, seconds in-flight requests get to finish before they are aborted "
                        "(a second SIGINT quits at once)")
    s.add_argument("--max-queue", type=int, default=_SRV["max_queue"],
                   help="requests that may wait for a slot besides the --max-num-seqs running ones; more are "
                        "refused with 429 and Retry-After")
    s.add_argument("--queue-timeout", type=float, default=_SRV["queue_timeout"],
                   help="seconds a request may wait for a slot before it is refused with 503 (0: no limit)")
    s.add_argument("--allowed-hosts", type=_host_list, default=_SRV["allowed_hosts"],
                   help="comma-separated Host names the server answers ('*': any; default: localhost, "
                        "127.0.0.1 and ::1 when --host is a loopback address and there is no --api-key, else any)")
    s.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    add_replica_args(s)
    s.set_defaults(func=cmd_serve)


_REP = {f.name: f.default for f in fields(ReplicaConfig)}


def add_replica_args(s: argparse.ArgumentParser) -> None:
    """Several engine replicas on Ray Serve (server/replicas.py, docs/replicas.md)."""
    s.add_argument("--replicas", type=int, default=_REP["replicas"],
                   help="run N engine replicas on Ray Serve behind this one endpoint (default: one engine "
                        "in this process, no Ray)")
    s.add_argument("--ray-address", default=_REP["ray_address"],
                   help="with --replicas: join this Ray cluster (auto, HOST:PORT) instead of starting a local one")
    s.add_argument("--replica-cpus", type=float, default=_REP["replica_cpus"],
                   help="CPUs Ray reserves for each replica (fractions allowed)")
    s.add_argument("--replica-gpus", type=float, default=_REP["replica_gpus"], help="GPUs for each replica")
    s.add_argument("--replica-max-imbalance", dest="max_imbalance", type=int, default=_REP["max_imbalance"],
                   help="requests follow their prompt's prefix to one replica unless it has this many more in "
                        "flight than the least busy one (default: --max-num-seqs)")


def replica_config(a: argparse.Namespace) -> ReplicaConfig:
    return ReplicaConfig(**{k: getattr(a, k) for k in _REP})


def serve_with_replicas(a: argparse.Namespace, cfg, rcfg: ReplicaConfig, scfg: ServerConfig, names: list[str]) -> int:
    try:
        from .replica_server import serve_replicas
    except ImportError as e:  # no Ray, or another version without the request-router API
        if (e.name or "").split(".")[0] != "ray":
            raise
        raise SpecDecodeError("--replicas runs on Ray Serve 2.60: pip install 'ray[serve]==2.60.0' "
                              "(or ./install.sh replicas)") from None
    return serve_replicas(cfg, rcfg, names, api_key=a.api_key, server=scfg, log_level=a.log_level)


def _host_list(value: str) -> tuple[str, ...]:
    return tuple(h.strip() for h in value.split(","))


def server_config(a: argparse.Namespace) -> ServerConfig:
    return ServerConfig(**{k: getattr(a, k) for k in _SRV if hasattr(a, k)})


def served_name(model: str) -> str:
    p = Path(model)
    return p.stem if p.suffix == ".gguf" else p.name


def startup_line(names: list[str], cfg) -> str:
    """What the server runs, logged once it has loaded: the settings a user reads its figures by."""
    import torch

    from ..kernels import native_kernels
    from ..runtime.cpus import cpu_name
    native = native_kernels()
    return (f"serving {', '.join(names)}: --spec-type {cfg.spec.spec_type}, {cfg.max_num_seqs} slots, "
            f"{torch.get_num_threads()} threads, kernels {native.isa if native else 'none (PyTorch)'} on {cpu_name()}")


def cmd_serve(a: argparse.Namespace) -> int:
    from ..llm import LLM
    from .app import create_app
    from .background import make_server

    logging.basicConfig(level=a.log_level.upper(), format="%(levelname)s:     %(name)s: %(message)s")
    cfg = engine_config(a)  # validates the options before the (slow) model load
    scfg = server_config(a)
    rcfg = replica_config(a)
    if a.host not in LOOPBACK and not a.api_key:
        logging.getLogger("specdecode.server").warning("listening on %s without --api-key: anyone who can reach "
                                                       "this address can use the model", a.host)
    names = a.served_model_name or [served_name(cfg.model)]
    if rcfg.replicas is not None:
        return serve_with_replicas(a, cfg, rcfg, scfg, names)
    llm = LLM(engine_config=cfg)
    logging.getLogger("specdecode.server").info(startup_line(names, cfg))
    app = create_app(llm.engine, names, api_key=a.api_key, config=scfg)
    make_server(app, a.shutdown_timeout, host=a.host, port=a.port, log_level=a.log_level).run()
    return 0
