"""``replog proxy``: RocketMQ 5's gRPC protocol over a replog cluster, in a process of its own
(RocketMQ's proxy in Cluster mode; a broker with ``grpcServerPort`` serves the same in its
own process). It takes the broker's keys (``-c FILE``, ``--set``, ``REPLOG_<key>``):
``grpcServerPort``, ``grpcBindAddress``, ``maxMessageSize``; the flags win. Runs until SIGINT
or SIGTERM."""

from __future__ import annotations

import argparse

from common.cli.cluster import StopSignals
from common.cli.output import EXIT_OK, UsageError, emit_json, out
from common.client import parse_servers
from common.core.config import ConfigError, load_config
from common.core.errors import BrokerError

DEFAULT_GRPC_PORT = 8081  # RocketMQ's proxy's


def cmd_proxy(args: argparse.Namespace) -> int:
    from common.proxy.server import GrpcProxy  # grpc is imported by this command only

    if args.curve_key or args.server_key:
        raise UsageError("replog proxy does not authenticate yet: it cannot reach brokers "
                         "that run with aclEnable")
    try:
        cfg = load_config(args.config, args.set)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    port = args.grpc_port or cfg.grpcServerPort or DEFAULT_GRPC_PORT
    if not 0 < port <= 65535:
        raise UsageError(f"--grpc-port {port}: give 1..65535")
    servers = parse_servers(args.servers)
    proxy = GrpcProxy(servers, args.listen or cfg.grpcBindAddress or "0.0.0.0", port,
                      args.max_body_size or cfg.maxMessageSize)
    try:
        proxy.start()
    except OSError as e:
        raise BrokerError("SYSTEM_ERROR", f"replog proxy: {e}", False) from None
    try:
        ready = {"grpc": proxy.address, "servers": servers}
        if args.json:
            emit_json(ready)
        else:
            out.print(f"serving RocketMQ 5's gRPC protocol on {proxy.address} over "
                      f"{', '.join(servers)} (Ctrl-C stops)", soft_wrap=True)
        with StopSignals() as stop:
            while not stop.wait(1.0):
                pass
    finally:
        proxy.stop()
    return EXIT_OK
