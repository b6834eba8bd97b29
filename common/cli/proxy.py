"""``replog proxy``: RocketMQ 5's gRPC protocol over a replog cluster, in a process of its own
(RocketMQ's proxy in Cluster mode; a broker with ``grpcServerPort`` serves the same in its
own process). It takes the broker's keys (``-c FILE``, ``--set``, ``REPLOG_<key>``):
``grpcServerPort``, ``grpcBindAddress``, ``maxMessageSize``, ``tlsCertPath``/``tlsKeyPath``,
and for brokers that run with ``aclEnable`` the same ``aclEnable`` and ``aclFile`` (each call
is signed by an account of that file and checked against it, reloaded as a broker reloads
it, at once on SIGHUP) with ``--key`` (the proxy's own admin account, ``grpcClientKeyFile`` otherwise) and
``--server-key``; the flags win. Runs until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import os
import signal

from common.cli.cluster import StopSignals
from common.cli.output import EXIT_OK, UsageError, curve_args, emit_json, out
from common.client import parse_servers
from common.core.config import ConfigError, load_config
from common.core.errors import BrokerError
from common.core.keys import KeyFileError, client_keys

DEFAULT_GRPC_PORT = 8081  # RocketMQ's proxy's


def cmd_proxy(args: argparse.Namespace) -> int:
    # grpc is imported by this command only
    from common.broker.security import AclHolder, Security
    from common.proxy.auth import GrpcAuth
    from common.proxy.server import GrpcProxy, load_tls, require_front_end_account

    key = args.curve_key
    try:
        # --key is the proxy's own key: its client key, and the CURVE key the broker keys ask
        cfg = load_config(args.config, args.set,
                          **({"grpcClientKeyFile": key, "curveSecretKeyFile": key} if key else {}))
        tls = load_tls(cfg.tlsCertPath, cfg.tlsKeyPath) if cfg.tlsCertPath else None
        security = Security()
        curve = auth = None
        key = key or cfg.grpcClientKeyFile
        if cfg.aclEnable:
            if tls is None:
                raise ConfigError("config key 'tlsCertPath': with aclEnable the gRPC port "
                                  "runs TLS only: give tlsCertPath and tlsKeyPath")
            if not key or not args.server_key:
                raise UsageError("with aclEnable give --key (the proxy's admin account's "
                                 ".key_secret) and --server-key (the brokers' .key)")
            acl = AclHolder(os.path.expanduser(cfg.aclFile))
            security = Security(True, acl=acl, reload_interval_ms=cfg.aclReloadIntervalMs)
            try:
                curve = client_keys(key, curve_args(args)["server_key"])
            except KeyFileError as e:
                raise UsageError(f"--key/--server-key: {e}") from None
            assert curve is not None
            require_front_end_account(curve.public, acl.current, "--key")
            auth = GrpcAuth(lambda: acl.current, security.audit.refused)
        elif args.curve_key or args.server_key:
            raise UsageError("--key and --server-key are for brokers that run with aclEnable: "
                             "give the proxy the same aclEnable and aclFile (-c or --set)")
    except ConfigError as e:
        hint = (" (replog proxy: --key and --server-key)" if "KeyFile" in str(e) else "")
        raise UsageError(f"{e}{hint}") from None
    port = args.grpc_port or cfg.grpcServerPort or DEFAULT_GRPC_PORT
    if not 0 < port <= 65535:
        raise UsageError(f"--grpc-port {port}: give 1..65535")
    servers = parse_servers(args.servers)
    proxy = GrpcProxy(servers, args.listen or cfg.grpcBindAddress or "0.0.0.0", port,
                      args.max_body_size or cfg.maxMessageSize, tls=tls, auth=auth,
                      curve=curve)
    security.start()
    previous = signal.signal(signal.SIGHUP, lambda *_: security.request_reload())
    try:
        try:
            proxy.start()
        except OSError as e:
            raise BrokerError("SYSTEM_ERROR", f"replog proxy: {e}", False) from None
        try:
            ready = {"grpc": proxy.address, "servers": servers, "tls": tls is not None,
                     "acl": auth is not None}
            if args.json:
                emit_json(ready)
            else:
                out.print(f"serving RocketMQ 5's gRPC protocol on {proxy.address}"
                          f"{' (TLS, ACL)' if auth else ' (TLS)' if tls else ''} over "
                          f"{', '.join(servers)} (Ctrl-C stops)", soft_wrap=True)
            with StopSignals() as stop:
                while not stop.wait(1.0):
                    pass
        finally:
            proxy.stop()
    finally:
        signal.signal(signal.SIGHUP, previous)
        security.stop()
    return EXIT_OK
