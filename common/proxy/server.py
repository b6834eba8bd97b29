"""The gRPC server: grpc.aio on an event loop of its own thread ("replog-grpc"), serving
``MessagingService`` (``service.py``) on ``host:port``.

``start`` returns once the port is bound (or raises: a port taken, no such address); ``stop``
stops taking calls, gives the calls under way ``GRACE_S`` to finish, waits out the blocking
client calls still running (a receive's long poll ends within a second), closes the clients
and joins the thread. Blocking client calls run on the loop's default executor, bounded to
``CALL_THREADS`` threads; a streaming call (telemetry) holds no thread while it waits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading

import grpc
from rocketmq.grpc_protocol import service_pb2_grpc

from common.core.logs import log_event
from common.proxy.service import MessagingService

log = logging.getLogger("replog.proxy")

GRACE_S = 2.0
CALL_THREADS = 32
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # a request or answer (a send of a 4 MiB body, a batch)


class GrpcProxy:
    def __init__(self, servers: list[str], host: str, port: int, max_body_size: int):
        self.servers, self.host, self.port = servers, host, port
        self.max_body_size = max_body_size
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
        log_event(log, "grpc_listening", address=self.address, servers=",".join(self.servers))

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
        service = MessagingService(self.servers, self.max_body_size)
        server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)])
        try:
            service_pb2_grpc.add_MessagingServiceServicer_to_server(service, server)
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
