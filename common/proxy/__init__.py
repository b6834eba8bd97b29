"""RocketMQ 5's gRPC protocol (``apache.rocketmq.v2.MessagingService``): the front end the
official Apache RocketMQ clients speak, served over replog (docs/architecture.md, "The gRPC
front end").

It is RocketMQ's proxy in its Cluster mode: each RPC is translated into replog's own requests,
sent by replog's clients (``common.client``) to the broker groups' masters, so the proxy has no
semantics of its own: routes, sends, and the masters it follows across a failover are the
clients'. A broker with ``grpcServerPort`` runs one in its process over its own cluster;
``replog proxy`` runs one apart. The generated protocol modules are the official Python client
package's (``rocketmq.grpc_protocol``, a dependency).

| module        | what                                                               |
|---------------|--------------------------------------------------------------------|
| server.py     | the grpc.aio server on its own thread: start, stop                  |
| service.py    | the RPCs: each one's translation, and NOT_IMPLEMENTED for the rest  |
| convert.py    | messages, routes and statuses between the two protocols            |
"""
