"""``replog console``: the web console over the cluster of ``-s`` (``common/console/``), on
``--listen`` (default 127.0.0.1:8080) until SIGINT or SIGTERM. Read-only unless
``--admin-password-file`` names a file holding the admin password (mode 0600), or
``--acl-file`` the brokers' ACL (a login is then an admin account's access key and secret
key); with ``aclEnable`` brokers, ``--key``/``--server-key`` are the key it reads (and changes)
with."""

from __future__ import annotations

import argparse
import os
import stat

from common.cli.cluster import StopSignals
from common.cli.output import EXIT_OK, UsageError, curve_args, emit_json, out
from common.client import Admin
from common.core.errors import BrokerError, ConfigError

DEFAULT_LISTEN = "127.0.0.1:8080"


def read_password(path: str) -> str:
    """The admin password: the file's first line; refused when group or others may read it."""
    try:
        st = os.stat(path)
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise UsageError(f"--admin-password-file {path}: group or others may read it "
                             f"(mode {stat.S_IMODE(st.st_mode):o}): chmod 600 {path}")
        with open(path, encoding="utf-8") as f:
            password = f.readline().rstrip("\r\n")
    except OSError as e:
        raise UsageError(f"--admin-password-file {path}: {e.strerror or e}") from None
    if len(password) < 12:
        raise UsageError(f"--admin-password-file {path}: the password must be at least 12 "
                         "characters")
    return password


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--listen {text!r}: give HOST:PORT (e.g. 127.0.0.1:8080)")
    return host or "127.0.0.1", int(port)


def cmd_console(args: argparse.Namespace) -> int:
    from common.broker.security import AclHolder, Security
    from common.console.actions import Actions
    from common.console.collector import Collector
    from common.console.server import Console

    host, port = parse_listen(args.listen)
    if args.admin_password_file and args.acl_file:
        raise UsageError("give --admin-password-file or --acl-file, not both")
    password = read_password(args.admin_password_file) if args.admin_password_file else None
    security = Security()
    acl_current = None
    if args.acl_file:
        try:
            holder = AclHolder(os.path.expanduser(args.acl_file))
        except ConfigError as e:
            raise UsageError(f"--acl-file: {e}") from None
        security = Security(True, acl=holder)  # its thread reloads the file as a broker does
        acl_current = lambda: holder.current  # the snapshot in force at each login
    if args.refresh_ms < 500:
        raise UsageError("--refresh-ms must be at least 500")
    if args.max_connections < 1:
        raise UsageError("--max-connections must be at least 1")
    keys = curve_args(args)
    admin = Admin(args.servers, timeout_ms=args.timeout_ms, retries=0, **keys)
    actions = Actions(admin, {"timeout_ms": args.timeout_ms, **keys})
    try:
        try:
            console = Console(Collector(admin, args.refresh_ms / 1000), actions, host, port,
                              password, acl_current, allowed_hosts=args.allow_host,
                              max_connections=args.max_connections)
        except OSError as e:
            raise BrokerError("SYSTEM_ERROR", f"replog console: cannot listen on "
                              f"{host}:{port}: {e.strerror or e}", False) from None
        console.start()
        security.start()
        try:
            url = f"http://{console.address}/"
            if args.json:
                emit_json({"url": url, "servers": admin.servers,
                           "writable": console.sessions.writable,
                           "login": console.sessions.mode})
            else:
                out.print(f"replog console on {url} over {', '.join(admin.servers)}"
                          f"{'' if console.sessions.writable else ' (read-only)'} "
                          "(Ctrl-C stops)",
                          soft_wrap=True)
            with StopSignals() as stop:
                while not stop.wait(1.0):
                    pass
        finally:
            security.stop()
            console.stop()
    finally:
        actions.close()
        admin.close()
    return EXIT_OK

