"""``replog proxy``: RocketMQ 5's gRPC protocol over a replog cluster, in a process of its own
(RocketMQ's proxy in Cluster mode; a broker with ``grpcServerPort`` serves the same in its
own process). Runs until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse

from common.cli.cluster import StopSignals
from common.cli.output import EXIT_OK, UsageError, emit_json, out
from common.client import parse_servers
from common.core.errors import BrokerError


def cmd_proxy(args: argparse.Namespace) -> int:
    from common.proxy.server import GrpcProxy  # grpc is imported by this command only

    if args.curve_key or args.server_key:
        raise UsageError("replog proxy does not authenticate yet: it cannot reach brokers "
                         "that run with aclEnable")
    if not 0 < args.grpc_port <= 65535:
        raise UsageError(f"--grpc-port {args.grpc_port}: give 1..65535")
    servers = parse_servers(args.servers)
    proxy = GrpcProxy(servers, args.listen, args.grpc_port, args.max_body_size)
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
