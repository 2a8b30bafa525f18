"""The composition root's wiring: the real adapters (host/, store/, net/, providers/) picked
and handed to the services, one builder per subsystem."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import httpx

from ironclawd import paths
from ironclawd.api.control import ControlServer
from ironclawd.api.sandbox import SandboxApi
from ironclawd.api.sockets import ensure_private_dir
from ironclawd.bundle.image import ensure_rootfs
from ironclawd.bundle.spec import QUEUES_DIR
from ironclawd.config import Config
from ironclawd.domain.agents import AGENT_GID, AGENT_UID, BUILTIN
from ironclawd.errors import IronclawError
from ironclawd.host import runsc
from ironclawd.host.netns import NetnsAdapter
from ironclawd.host.runtime import RunscRuntime, UnavailableRuntime
from ironclawd.host.systemd import SystemdUnitManager
from ironclawd.net.http import PinnedHttpClient
from ironclawd.net.resolver import SystemResolver
from ironclawd.ports import SandboxRuntime
from ironclawd.providers.anthropic import AnthropicProvider
from ironclawd.providers.mock import MockProvider
from ironclawd.providers.openai import OpenAIProvider
from ironclawd.services.audit import Audit
from ironclawd.services.egress import EgressBroker
from ironclawd.services.gateway import Gateway, GatewayPolicy
from ironclawd.services.messaging import MessageService
from ironclawd.services.model_proxy import ModelProxy
from ironclawd.services.registry import Registry
from ironclawd.services.session_data import DataLayout, SessionData
from ironclawd.services.session_lifecycle import SandboxLayout, SandboxLifecycle
from ironclawd.services.sessions import SessionService
from ironclawd.store.audit import AuditLog
from ironclawd.store.credentials import CredentialStore
from ironclawd.store.keys import MasterKey, load_master_key
from ironclawd.store.state import StateStore

log = logging.getLogger("ironclawd")


@dataclass(frozen=True)
class Wired:
    """What the daemon runs and closes."""

    master: MasterKey
    store: StateStore
    sessions: SessionService
    control: ControlServer
    messages: MessageService
    sandbox_api: SandboxApi
    http: httpx.AsyncClient
    gateway: Gateway
    registry: Registry
    audit: Audit


def wire(config: Config, netns: NetnsAdapter) -> Wired:
    """Build every service over its real adapters."""
    ensure_private_dir(config.daemon.state_dir, 0o700)
    master = load_master_key(config.daemon.master_key_file)
    log.info("master key from %s (fingerprint %s)", master.source, master.fingerprint())
    store = StateStore(config.daemon.state_dir / "state.db", master.derive("ironclaw state db v1"))
    audit = Audit(
        AuditLog(config.daemon.state_dir / "audit.log", master.derive("ironclaw audit v1")),
        store,
    )
    # Seeded once with the built-in demo agent and the config's [agents.NAME] tables; after
    # that only approved changes alter the registry.
    registry = Registry(store, [*BUILTIN.values(), *config.agents])
    control = ControlServer(paths.SESSIONS_RUN_DIR, config.sockets)
    data = _session_data(config, store, master)
    service = _sessions(config, store, registry, netns, control, data, audit)
    messages = MessageService(
        store=store,
        sessions=service,
        data=data,
        control=control,
        agent_uid=AGENT_UID,
        agent_gid=AGENT_GID,
        limits=config.queues,
        audit=audit,
    )
    service.on_remove(messages.forget)
    http = httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=10.0), follow_redirects=False)
    gateway = _gateway(config, store, registry, audit, service)
    sandbox_api = SandboxApi(
        paths.INTERNAL_DIR / "sandbox-grpc.sock", paths.SESSIONS_RUN_DIR,
        _model_proxy(config, registry, audit, service, http), gateway, service, audit=audit,
        limits=config.sockets,
    )  # fmt: skip
    service.lifecycle.sockets = sandbox_api
    broker = _egress(config, registry, audit, service)
    sandbox_api.serve_egress(broker)
    service.on_remove(broker.forget)
    return Wired(
        master, store, service, control, messages, sandbox_api, http, gateway, registry, audit,
    )  # fmt: skip


def _rootfs(config: Config) -> Path:
    state_dir = config.daemon.state_dir
    try:
        return ensure_rootfs(
            config.sandbox.agent_dir, config.sandbox.rootfs_template, state_dir / "rootfs"
        )
    except IronclawError as exc:
        # The daemon still serves doctor and status; creating a session will say why not.
        log.error("agent image unavailable: %s", exc)
        return state_dir / "rootfs" / "unavailable"


def _session_data(config: Config, store: StateStore, master: MasterKey) -> SessionData:
    state_dir = config.daemon.state_dir
    return SessionData(
        store,
        master,
        DataLayout(
            state_dir / QUEUES_DIR.name,
            paths.KEYS_RUN_DIR,
            paths.INGEST_DIR,
            config.queues,
            state_dir,
            config.daemon.min_free_bytes,
        ),
    )


def _sessions(  # noqa: PLR0917 (one builder, every collaborator named)
    config: Config,
    store: StateStore,
    registry: Registry,
    netns: NetnsAdapter,
    control: ControlServer,
    data: SessionData,
    audit: Audit,
) -> SessionService:
    """The session lifecycle over systemd, runsc, the netns adapter and the control sockets."""
    bundles = config.daemon.state_dir / "bundles"
    ensure_private_dir(bundles, 0o700)
    layout = SandboxLayout(
        bundles_dir=bundles,
        rootfs=_rootfs(config),
        start_timeout=config.sandbox.start_timeout_seconds,
        idle_timeout=float(config.sandbox.idle_timeout_seconds),
        mount_allowlist=config.gateway.mount_allowlist,
        state_dir=config.daemon.state_dir,
    )
    lifecycle = SandboxLifecycle(
        units=SystemdUnitManager(),
        netns=netns,
        control=control,
        runtime=_runtime(config),
        layout=layout,
        data=data,
    )
    service = SessionService(store=store, lifecycle=lifecycle, agents=registry)
    service.audit = audit
    return service


def _model_proxy(
    config: Config, registry: Registry, audit: Audit, sessions: SessionService,
    http: httpx.AsyncClient,
) -> ModelProxy:  # fmt: skip
    proxy = ModelProxy(
        sessions=sessions,
        agents=registry,
        providers={
            "mock": MockProvider(),
            "anthropic": AnthropicProvider(http),
            "openai": OpenAIProvider(http),
        },
        credentials=CredentialStore(config.daemon.master_key_file.parent),
        base_urls={
            "anthropic": "https://api.anthropic.com",
            "openai": "https://api.openai.com/v1",
        },
    )
    proxy.audit = audit
    return proxy


def _gateway(
    config: Config, store: StateStore, registry: Registry, audit: Audit, sessions: SessionService
) -> Gateway:
    return Gateway(
        store=store,
        registry=registry,
        audit=audit,
        policy=GatewayPolicy(
            expiry_seconds=config.gateway.expiry_hours * 3600.0,
            four_eyes=frozenset(config.gateway.four_eyes),
            submissions_per_hour=config.gateway.submissions_per_hour,
            mount_allowlist=config.gateway.mount_allowlist,
        ),
        restart_agent_sessions=sessions.restart_agent_sessions,
    )


def _egress(
    config: Config, registry: Registry, audit: Audit, sessions: SessionService
) -> EgressBroker:
    return EgressBroker(
        sessions=sessions,
        agents=registry,
        resolver=SystemResolver(),
        upstream=PinnedHttpClient(Path(config.egress.ca_file) if config.egress.ca_file else None),
        credentials=CredentialStore(config.daemon.master_key_file.parent),
        limits=config.egress,
        record=lambda d: audit.record_soon(
            "egress.decision", f"session:{d.sid}",
            **{k: v for k, v in dataclasses.asdict(d).items() if k != "sid"},
        ),
    )  # fmt: skip


def _runtime(config: Config) -> SandboxRuntime:
    try:
        info = runsc.detect(config.sandbox.runsc)
        platform = runsc.choose_platform(config.sandbox.platform, info)
    except IronclawError as exc:
        log.error("runsc unavailable: %s", exc)
        return UnavailableRuntime(str(exc))
    ensure_private_dir(paths.RUN_DIR, 0o755)
    return RunscRuntime(info, paths.RUN_DIR / "runsc", platform)
