"""``kvtier serve``: the control-plane HTTP service (uvicorn)
(its load benchmark, ``kvtier bench service``, is in bench/cmd_service.py).

``kvtier serve`` binds the socket first, then prints where it listens (with
``--json``: one JSON line on stdout, flushed, so a supervisor can read the
real port of ``--port 0``), then serves until SIGINT/SIGTERM.  Logs go to
stderr.  A non-loopback ``--host`` without a token is refused (exit 2).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from kvtier.util.cmd import CliError, add_json_flag
from kvtier.util.preset_args import add_node_flag


def register(groups: Any) -> None:
    p = groups.top.add_parser("serve", help="run the control-plane HTTP service (forecasts, decisions)",
                              description="Serve tool-wait forecasts and pause decisions over HTTP "
                                          "(OpenAPI at /docs, Prometheus at /metrics).")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; "
                   "non-loopback needs --token)")
    p.add_argument("--port", type=int, default=8731, help="TCP port (0: any free port; default 8731)")
    p.add_argument("--data-dir", default="kvtier-data", help="state directory (LMDB; default ./kvtier-data)")
    p.add_argument("--data-root", default=os.environ.get("KVTIER_DATA_ROOT"),
                   help="if set, --data-dir must resolve inside it (default $KVTIER_DATA_ROOT)")
    p.add_argument("--token", default=None,
                   help="bearer token required on every POST (default $KVTIER_TOKEN; none: open)")
    p.add_argument("--policy", default="breakeven", help="default pause policy (default breakeven)")
    add_node_flag(p, purpose="the hardware preset decisions are priced on unless a request names one")
    p.add_argument("--lost-after", type=float, default=7 * 24 * 3600.0, metavar="S",
                   help="trajectories paused longer than S before a restart are reported lost (default 7 days)")
    p.add_argument("--max-body", type=int, default=64 * 1024, metavar="BYTES",
                   help="largest accepted request body (default 65536)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn and service log level, on stderr (default info)")
    p.add_argument("--engine-events", action="append", default=[], metavar="NAME=ZMQ",
                   help="feed the prefix directory from an engine's KV event stream (its --kv-events-config "
                        "endpoint, e.g. w1=tcp://127.0.0.1:5557; needs kvtier[router]); repeatable")
    add_json_flag(p)
    p.set_defaults(handler=_serve)


def _engine_events(items: list[str]) -> dict[str, str]:
    """``NAME=ZMQ`` flags -> {name: endpoint}.  Raises CliError."""
    import re

    from kvtier.tiering.routing.config import check_events_endpoint
    out: dict[str, str] = {}
    for item in items:
        name, sep, ep = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9_.:@+\-/]{1,128}", name):
            raise CliError(f"--engine-events wants NAME=ZMQ_ENDPOINT (NAME: letters, digits, _.:@+-/), got {item!r}")
        if name in out:
            raise CliError(f"--engine-events: {name} is given twice")
        try:
            out[name] = check_events_endpoint(ep)
        except ValueError as exc:
            raise CliError(f"--engine-events {exc}") from None
    return out



def _serve(args: argparse.Namespace) -> int:
    from kvtier.tiering.service.app import ServiceConfig, create_app
    from kvtier.tiering.service.security import check_bind, check_data_dir
    from kvtier.tiering.service.server import bind_socket, serve_foreground, url_of

    token = _token(args.token)
    if not (0 <= args.port <= 65535):
        raise CliError(f"--port must be in 0..65535, got {args.port}")
    check_bind(args.host, token)                      # ValueError -> exit 2
    from kvtier.tiering.policy.policies import POLICY_NAMES
    if args.policy not in POLICY_NAMES:
        raise CliError(f"unknown policy {args.policy!r}; known: {', '.join(POLICY_NAMES)}")
    feeds = _engine_events(args.engine_events)
    data_dir = check_data_dir(args.data_dir, args.data_root)
    from kvtier.tiering.service.state import check_data_dir_free
    check_data_dir_free(data_dir)                     # another service on it -> exit 2
    extra: dict[str, Any] = {}
    if args.node:
        from kvtier.tiering.model.presets import get_node
        extra["hardware"] = get_node(args.node)
    config = ServiceConfig.make(data_dir, token=token, max_body_bytes=args.max_body, policy=args.policy,
                                lost_after_s=args.lost_after, **extra)
    app = create_app(config)
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        raise CliError(f"cannot bind {args.host}:{args.port}: {exc.strerror or exc}") from None
    subscriber = None
    if feeds:
        from kvtier.tiering.service.prefix_api import subscribe_engines
        try:
            subscriber = subscribe_engines(app, feeds)
        except ValueError as exc:
            sock.close()
            raise CliError(f"--engine-events: {exc}") from None
    url = url_of(sock)
    info = {"url": url, "docs": url + "/docs", "metrics": url + "/metrics", "data_dir": str(data_dir),
            "auth": config.token is not None, "policy": args.policy, "pid": os.getpid()}
    if feeds:
        info["engine_events"] = feeds

    def ready() -> None:
        # Printed once the state is open and the socket accepts.
        if args.json:
            sys.stdout.write(json.dumps(info) + "\n")
        else:
            from rich.table import Table

            from kvtier.util.console import make_console
            t = Table(title="kvtier serve", show_header=False)
            for k, v in info.items():
                t.add_row(k, str(v))
            make_console().print(t)
        sys.stdout.flush()

    try:
        serve_foreground(app, sock, log_level=args.log_level, on_ready=ready)
    except RuntimeError as exc:
        raise CliError(str(exc)) from None
    finally:
        if subscriber is not None:
            subscriber.stop()
        sock.close()
    return 0


def _token(flag: str | None) -> str | None:
    """The bearer token from ``--token``, else ``$KVTIER_TOKEN`` (unset or empty: no token).

    Raises CliError naming the source when the token is empty (``--token ""`` used to start an
    open server whose start-up line said "auth": true), whitespace only, padded with whitespace
    (clients strip what they present, so nobody could authenticate), or shorter than 16 characters."""
    from kvtier.tiering.service.security import check_token

    if flag is not None:
        if not flag:
            raise CliError("--token is empty: give a token of at least 16 characters, or leave --token out")
        token, source = flag, "--token"
    else:
        token, source = os.environ.get("KVTIER_TOKEN") or None, "KVTIER_TOKEN"
    try:
        check_token(token)
    except ValueError as exc:
        raise CliError(f"{source}: {exc}") from None
    return token
