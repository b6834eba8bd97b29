"""The gRPC server: grpc.aio on an event loop of its own thread ("replog-grpc"), serving
``MessagingService`` (``service.py``) on ``host:port``.

``start`` returns once the port is bound (or raises: a port taken, no such address); ``stop``
stops taking calls, gives the calls under way ``GRACE_S`` to finish, waits out the blocking
client calls still running (a receive's long poll ends within a second), closes the clients
and joins the thread. With ``tls`` (``load_tls``: the PEM key and certificate chain of
``tlsKeyPath``/``tlsCertPath``) it serves TLS only; with ``auth`` every call is signed and
checked (``auth.py``), and the clients reach the brokers with ``curve``. Blocking client calls run on the loop's default executor, bounded to
``CALL_THREADS`` threads; a streaming call (telemetry) holds no thread while it waits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import stat
import threading
from pathlib import Path

import grpc
from rocketmq.grpc_protocol import service_pb2_grpc

from common.core.errors import ConfigError
from common.core.keys import ClientKeys, KeyFileError, load_secret
from common.core.logs import log_event
from common.format.acl import AclSnapshot
from common.proxy.auth import GrpcAuth
from common.proxy.local import LocalBroker
from common.proxy.service import MessagingService

log = logging.getLogger("replog.proxy")

GRACE_S = 2.0
CALL_THREADS = 32
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # a request or answer (a send of a 4 MiB body, a batch)
MAX_PEM_BYTES = 1024 * 1024


def load_tls(cert_path: str, key_path: str) -> tuple[bytes, bytes]:
    """(private key, certificate chain) PEM bytes for the gRPC port; ConfigError naming the
    key (``tlsCertPath``, ``tlsKeyPath``) when a file is missing, is not PEM, or the private
    key may be read by group or others."""
    out = []
    for key, path in (("tlsKeyPath", key_path), ("tlsCertPath", cert_path)):
        if not path:
            raise ConfigError(f"config key {key!r}: needed for TLS on the gRPC port (a PEM "
                              "file)")
        p = Path(os.path.expanduser(path))
        try:
            st = p.stat()
            if st.st_size > MAX_PEM_BYTES:
                raise ConfigError(f"config key {key!r}: {p}: {st.st_size} bytes, not a PEM file")
            data = p.read_bytes()
        except OSError as e:
            raise ConfigError(f"config key {key!r}: {p}: {e.strerror or e}") from None
        marker = b"PRIVATE KEY-----" if key == "tlsKeyPath" else b"-----BEGIN CERTIFICATE-----"
        if marker not in data:
            raise ConfigError(f"config key {key!r}: {p} is not a PEM "
                              f"{'private key' if key == 'tlsKeyPath' else 'certificate'}")
        if key == "tlsKeyPath" and stat.S_IMODE(st.st_mode) & 0o077:
            raise ConfigError(f"config key 'tlsKeyPath': {p} may be read by group or others "
                              f"(mode {stat.S_IMODE(st.st_mode):o}): chmod 600 {p}")
        out.append(data)
    return out[0], out[1]


def front_end_keys(key_path: str, acl: AclSnapshot, server_key: bytes | None,
                   server_keys: dict[str, bytes] | None = None) -> ClientKeys:
    """The key pair the front end reaches the brokers with (``grpcClientKeyFile``), pinning
    ``server_key`` (``server_keys`` per address), checked by ``require_front_end_account``."""
    try:
        own = load_secret(os.path.expanduser(key_path))
    except KeyFileError as e:
        raise ConfigError(f"config key 'grpcClientKeyFile': {e}") from None
    assert own.secret is not None
    require_front_end_account(own.public, acl, "config key 'grpcClientKeyFile'")
    return ClientKeys(own.public, own.secret, server_key, dict(server_keys or {}))


def require_front_end_account(public: bytes, acl: AclSnapshot, where: str) -> None:
    """The front end's account must be an enabled admin with no perm keys in ``acl``: the
    brokers see every call of the front end as that account, and the front end has already
    checked the caller's permissions; ConfigError naming ``where`` otherwise."""
    acct = acl.account(public.decode("ascii"))
    if acct is None or not acct.unrestricted or not acct.enabled:
        what = "is in no account" if acct is None else f"is account {acct.access_key}'s"
        raise ConfigError(f"{where}: its public key {what} of {acl.source}; it must be an "
                          "enabled admin account with no topicPerms, groupPerms or defaults "
                          "(the front end checks each caller's permissions itself)")


class GrpcProxy:
    def __init__(self, servers: list[str], host: str, port: int, max_body_size: int,
                 tls: tuple[bytes, bytes] | None = None, auth: GrpcAuth | None = None,
                 curve: ClientKeys | None = None, local: LocalBroker | None = None):
        self.servers, self.host, self.port = servers, host, port
        self.local = local  # in the broker: plain sends in-process (local.py)
        self.service: MessagingService | None = None  # while it serves (its counters)
        self.max_body_size = max_body_size
        self.tls, self.auth, self.curve = tls, auth, curve
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._started: concurrent.futures.Future[int] = concurrent.futures.Future()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="replog-grpc", daemon=True)
        self._thread.start()
        self.port = self._started.result(timeout=30)  # raises what the bind raised
        log_event(log, "grpc_listening", address=self.address, servers=",".join(self.servers),
                  tls=self.tls is not None, acl=self.auth is not None)

    def stop(self) -> None:
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(GRACE_S + 10)
            self._thread = None

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # noqa: BLE001 - handed to start(), or logged
            if not self._started.done():
                self._started.set_exception(e)
            else:
                log_event(log, "grpc_failed", logging.ERROR, error=repr(e))

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        executor = concurrent.futures.ThreadPoolExecutor(CALL_THREADS,
                                                         thread_name_prefix="replog-grpc-call")
        self._loop.set_default_executor(executor)
        service = MessagingService(self.servers, self.max_body_size, auth=self.auth,
                                   curve=self.curve, local=self.local)
        self.service = service
        server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)])
        try:
            service_pb2_grpc.add_MessagingServiceServicer_to_server(service, server)
            if self.tls is not None:
                port = server.add_secure_port(self.address,
                                              grpc.ssl_server_credentials([self.tls]))
            else:
                port = server.add_insecure_port(self.address)
            if port == 0:
                raise OSError(f"gRPC: cannot listen on {self.address}")
            await server.start()
            self._started.set_result(port)
            await self._stopping.wait()
            await server.stop(GRACE_S)
        finally:
            # the blocking calls under way end first (a receive within one slice), then the
            # clients they use are closed: never a client closed under a call
            service.stopping.set()
            executor.shutdown(wait=True, cancel_futures=True)
            service.close()
