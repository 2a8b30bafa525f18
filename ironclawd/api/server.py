"""The admin gRPC server: AdminService, Health and reflection behind the peer-identity front."""

from __future__ import annotations

import contextlib
import grp
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import _async as health_aio  # grpc_health.v1.health.aio, typed path
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from ironclawd import paths
from ironclawd.api.admin import AdminServicer
from ironclawd.api.auth import CallerInterceptor
from ironclawd.api.peer import PeerFront, PeerRegistry
from ironclawd.api.sockets import (
    bind_unix_socket,
    ensure_private_dir,
    ensure_shared_dir,
    remove_stale_socket,
)
from ironclawd.config import AdminConfig
from ironclawd.errors import HostError

ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name


@dataclass
class AdminServer:
    grpc_server: grpc.aio.Server
    front: PeerFront
    health: health_aio.HealthServicer
    paths: tuple[Path, ...]

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", ADMIN_SERVICE):
            await self.health.set(service, status)

    async def stop(self, grace: float) -> None:
        await self.set_serving(False)
        await self.front.close()
        await self.grpc_server.stop(grace)
        for path in self.paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


async def start_admin_server(config: AdminConfig, servicer: AdminServicer) -> AdminServer:
    """Bind the sockets (refusing unsafe paths) and start serving."""
    try:
        admin_gid = grp.getgrnam(config.group).gr_gid
    except KeyError:
        raise HostError(
            f"group '{config.group}' does not exist (install sysusers.d/ironclaw.conf and run "
            "systemd-sysusers)"
        ) from None
    run_dir = config.socket.parent
    internal_dir = run_dir / paths.INTERNAL_DIR.name
    ensure_shared_dir(run_dir, 0o755, gid=admin_gid)
    ensure_private_dir(internal_dir, 0o700)
    internal_socket = internal_dir / paths.INTERNAL_ADMIN_SOCKET.name

    registry = PeerRegistry()
    limit = config.max_message_bytes
    max_calls = config.max_concurrent_streams * 4
    server = grpc.aio.server(
        interceptors=[
            CallerInterceptor(registry, config.group, config.max_deadline_seconds, max_calls)
        ],
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.max_concurrent_streams", config.max_concurrent_streams),
            ("grpc.so_reuseport", 0),
        ],
        maximum_concurrent_rpcs=max_calls,
    )
    admin_pb2_grpc.add_AdminServiceServicer_to_server(servicer, server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (
            ADMIN_SERVICE,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    # grpc binds this one itself; its directory is 0700 root, so only root can connect.
    remove_stale_socket(internal_socket)
    if server.add_insecure_port(f"unix:{internal_socket}") == 0:
        raise HostError(f"binding {internal_socket}: grpc could not listen there")
    await server.start()

    public = bind_unix_socket(config.socket, mode=0o660, group=config.group)
    front = PeerFront(public, internal_socket, registry, admin_gid, config.max_connections)
    await front.start()
    admin = AdminServer(server, front, health, (config.socket, internal_socket))
    await admin.set_serving(True)
    return admin
