"""``kvtier route``: the prefix-load router in front of OpenAI-compatible engines
(tiering/routing/; docs/routing.md).

``kvtier route --engine URL[=ZMQ_ENDPOINT] ... --port P`` binds the socket first, prints where it
listens (``--json``: one JSON line, flushed), then serves until SIGINT/SIGTERM.  ``--dry-run``
prints the configuration (engines, tier weights, score) and exits without serving.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from kvtier.util.args import add_rate_flag, pos_float, pos_int, prob
from kvtier.util.cmd import CliError, add_json_flag
from kvtier.util.preset_args import add_model_flag, add_node_flag

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_NODE = "pcie5-x16"


def register(groups: Any) -> None:
    p = groups.top.add_parser(
        "route", help="route OpenAI requests across engines by prefix and load",
        description="An OpenAI-compatible proxy in front of engines: each request goes to the engine "
                    "maximising mu * match/S - (1 - mu) * (L/Lmax)^gamma, match read from the engines' "
                    "KV event streams, L from their /metrics (docs/routing.md).")
    p.add_argument("--engine", action="append", required=True, metavar="URL[=ZMQ]",
                   help="an engine's base URL, with its --kv-events-config endpoint as a subscriber "
                        "connects to it (http://127.0.0.1:8001=tcp://127.0.0.1:5557); repeat per engine")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8800, help="TCP port (0: any free port; default 8800)")
    p.add_argument("--policy", default="prefix-load",
                   choices=["prefix-load", "round-robin", "least-loaded", "sticky"],
                   help="how an engine is picked: figure 7's prefix-load score (default), round-robin, "
                        "least-loaded, or sticky (a trajectory stays on its first engine); docs/routing.md")
    p.add_argument("--mu", type=prob, default=0.5, help="the score's weight on the prefix (default 0.5)")
    p.add_argument("--gamma", type=pos_float, default=1.0, help="the load term's exponent (default 1)")
    p.add_argument("--load-max", type=pos_float, default=None, metavar="N",
                   help="L_max: the load that counts as full (default: the largest candidate load)")
    add_model_flag(p, default=DEFAULT_MODEL, purpose="the model the tier weights are priced for")
    add_node_flag(p, default=DEFAULT_NODE, purpose="one engine's hardware, for the tier weights")
    add_rate_flag(p, "--remote-gbps", type=pos_float, default=25.0, metavar="GB/S",
                  help="the shared tier's bandwidth to one engine, for its weight (default 25)")
    p.add_argument("--medium-weight", action="append", default=[], metavar="MEDIUM=W",
                   help="set a medium's weight in [0, 1] (e.g. STORAGE=0.5); repeatable")
    p.add_argument("--block-size", type=pos_int, default=16,
                   help="tokens per block until an engine's events tell its own (default 16)")
    p.add_argument("--hash-algo", default="sha256",
                   help="the engines' --prefix-caching-hash-algo (default sha256)")
    p.add_argument("--hash-seed", default=None,
                   help="the engines' PYTHONHASHSEED, if they run with one (default: vLLM's fixed seed)")
    p.add_argument("--poll-interval", type=pos_float, default=1.0, metavar="S",
                   help="seconds between /metrics polls (default 1)")
    p.add_argument("--max-body", type=pos_int, default=16 << 20, metavar="BYTES",
                   help="largest accepted request body (default 16 MiB)")
    p.add_argument("--dry-run", action="store_true", help="print the configuration and exit")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn log level, on stderr (default info)")
    add_json_flag(p)
    p.set_defaults(handler=_route)


def _medium_weights(items: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        name, sep, val = item.partition("=")
        try:
            w = float(val)
        except ValueError:
            w = float("nan")
        if not sep or not name.strip() or not (0.0 <= w <= 1.0):
            raise CliError(f"--medium-weight wants MEDIUM=W with W in [0, 1], got {item!r}")
        out[name.strip().upper()] = w
    return out


def config_of(args: argparse.Namespace):
    """The RouterConfig the flags describe.  Raises CliError."""
    from kvtier.tiering.model.presets import get_node, get_preset
    from kvtier.tiering.prefix.score import Weights
    from kvtier.tiering.routing.config import RouterConfig, parse_engine
    from kvtier.tiering.routing.hashing import BlockHasher
    from kvtier.tiering.routing.weights import TierWeights

    engines = []
    for text in args.engine:
        try:
            engines.append(parse_engine(text))
        except ValueError as exc:
            raise CliError(f"--engine {exc}") from None
    if not (0 <= args.port <= 65535):
        raise CliError(f"--port must be in 0..65535, got {args.port}")
    tiers = TierWeights.priced(get_preset(args.model), get_node(args.node), remote_gbps=args.remote_gbps,
                               overrides=_medium_weights(args.medium_weight))
    try:
        BlockHasher(args.hash_algo, args.hash_seed)
        return RouterConfig(tuple(engines), Weights(args.mu, args.gamma), tiers, load_max=args.load_max,
                            block_size=args.block_size, hash_algo=args.hash_algo, hash_seed=args.hash_seed,
                            poll_interval_s=args.poll_interval, max_body_bytes=args.max_body,
                            policy=args.policy)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def describe(cfg) -> dict:
    return {"engines": [{"engine": e.name, "url": e.url, "events": e.events} for e in cfg.engines],
            "policy": cfg.policy, "score": {"mu": cfg.weights.mu, "gamma": cfg.weights.gamma, "load_max": cfg.load_max},
            "tier_weights": {k: round(v, 4) for k, v in cfg.tiers.table().items()},
            "tier_weights_basis": cfg.tiers.basis, "block_size": cfg.block_size, "hash_algo": cfg.hash_algo}


def _route(args: argparse.Namespace) -> int:
    cfg = config_of(args)
    info = describe(cfg)
    if args.dry_run:
        _print(info, args.json)
        return 0
    from kvtier.tiering.routing.proxy import RouterApp
    from kvtier.tiering.service.server import bind_socket, serve_foreground, url_of
    app = RouterApp(cfg)
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        raise CliError(f"cannot bind {args.host}:{args.port}: {exc.strerror or exc}") from None
    info = {"url": url_of(sock), "pid": os.getpid(), **info}
    try:
        serve_foreground(app, sock, log_level=args.log_level, on_ready=lambda: _print(info, args.json))
    except RuntimeError as exc:
        raise CliError(str(exc)) from None
    finally:
        sock.close()
    return 0


def _print(info: dict, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(info) + "\n")
    else:
        for k, v in info.items():
            sys.stdout.write(f"{k}: {json.dumps(v)}\n")
    sys.stdout.flush()
