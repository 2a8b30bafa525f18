"""The composition root's wiring: the real adapters (host/, store/, net/, providers/) picked
and handed to the services, one builder per subsystem."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ironclawd import paths
from ironclawd.api.control import ControlServer
from ironclawd.api.sandbox import SandboxApi
from ironclawd.api.sockets import ensure_private_dir
from ironclawd.bundle.image import ensure_rootfs
from ironclawd.bundle.packages import AptPackageImages, bundle_roots
from ironclawd.bundle.skills import skill_sets_dir
from ironclawd.bundle.spec import QUEUES_DIR
from ironclawd.bundle.writer import BundleDirs
from ironclawd.config import Config
from ironclawd.domain.agents import AGENT_GID, AGENT_UID, BUILTIN
from ironclawd.domain.channels import ChannelConfig
from ironclawd.domain.checks import CheckResult, Status
from ironclawd.domain.message_ids import MessageId, message_id
from ironclawd.errors import ConfigError, IronclawError
from ironclawd.filecache import IdentityCache
from ironclawd.host import probes, runsc
from ironclawd.host.channel_adapters import matrix_channel, webhook_channel
from ironclawd.host.clock import SystemClock
from ironclawd.host.journal import SystemdJournal
from ironclawd.host.mcp import SystemdMcpLauncher
from ironclawd.host.mcp_remote import McpLaunchers, RemoteMcpLauncher
from ironclawd.host.memory import mem_available_bytes
from ironclawd.host.mountns import OutboundSpace
from ironclawd.host.mounts import HostMounts
from ironclawd.host.netns import NetnsAdapter
from ironclawd.host.pkg_runner import HelperRunner
from ironclawd.host.runtime import RunscRuntime, UnavailableRuntime
from ironclawd.host.skill_keys import TrustedKeyDir
from ironclawd.host.skills import collect_skill_sets
from ironclawd.host.systemd import SystemdUnitManager
from ironclawd.net.http import LazyAsyncClient, PinnedHttpClient, tls_context
from ironclawd.net.resolver import SystemResolver
from ironclawd.ports import MountSpace, RunscCheck, SandboxRuntime, UnitManager
from ironclawd.ports.channels import ChannelAdapter
from ironclawd.providers.registry import build_providers, default_base_urls
from ironclawd.services.audit import Audit
from ironclawd.services.egress import EgressBroker
from ironclawd.services.gateway import Gateway, GatewayPolicy
from ironclawd.services.inbox import Inbox
from ironclawd.services.mcp_gateway import McpGateway
from ironclawd.services.mcp_servers import McpSupervisor
from ironclawd.services.messaging import MessageService
from ironclawd.services.model_proxy import ModelProxy
from ironclawd.services.pool import WarmPool
from ironclawd.services.registry import Registry
from ironclawd.services.session_hooks import SessionHooks
from ironclawd.services.session_lifecycle import SandboxLayout, SandboxLifecycle
from ironclawd.services.sessions import SessionService
from ironclawd.services.webhook_delivery import WebhookDelivery
from ironclawd.store.audit import AuditLog
from ironclawd.store.channel_state import ChannelState
from ironclawd.store.credentials import CredentialStore
from ironclawd.store.keys import MasterKey, load_master_key
from ironclawd.store.probes import probe_sqlcipher
from ironclawd.store.session_data import DataLayout, SessionDataStore
from ironclawd.store.state import StateStore

if TYPE_CHECKING:  # httpx loads at the first model call or egress request, not at start
    import httpx

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
    mcp: McpSupervisor  # the real McpClients: one hardened unit per (agent, MCP server)
    inbox: Inbox  # the channels' adapters and the inbox they hand messages to
    space: MountSpace | None  # the outbound tmpfs' mount namespace (ironctl doctor checks it)


def wire(config: Config, netns: NetnsAdapter) -> Wired:
    """Build every service over its real adapters, each collaborator through its constructor."""
    clock = SystemClock()
    state_dir = config.daemon.state_dir
    ensure_private_dir(state_dir, 0o700)
    master = load_master_key(
        config.daemon.master_key_file, protects=(state_dir / "state.db", state_dir / "audit.log")
    )
    log.info("master key from %s (fingerprint %s)", master.source, master.fingerprint())
    store = StateStore(state_dir / "state.db", master.derive("ironclaw state db v1"))
    audit = Audit(AuditLog(state_dir / "audit.log", master.derive("ironclaw audit v1")), store)
    # Seeded once with the built-in demo agent and the config's [agents.NAME] tables; after
    # that only approved changes alter the registry.
    registry = Registry(store, [*BUILTIN.values(), *config.agents], clock)
    control = ControlServer(paths.SESSIONS_RUN_DIR, config.sockets)
    data = _session_data(config, store, master)
    # Package steps and MCP servers run in units that see neither the agents' mount sources
    # nor the daemon's own directories where the config moved them.
    hidden = hidden_from_helpers(config)
    images = AptPackageImages(_rootfs(config), state_dir / "images", HelperRunner(hidden=hidden))
    # Subscribed to by messaging, the broker and the sandbox API, all built after the service.
    hooks = SessionHooks()
    lifecycle = _lifecycle(config, netns, control, data, hooks, images=images)
    lifecycle.agents = registry
    pool = WarmPool(
        lifecycle=lifecycle, agents=registry, records=store, config=config.pool,
        available_bytes=mem_available_bytes, clock=clock,
    )  # fmt: skip
    service = SessionService(
        store=store,
        lifecycle=lifecycle,
        agents=registry,
        hooks=hooks,
        audit=audit,
        clock=clock,
        pool=pool,
    )
    _collect_images(images, registry, state_dir / "bundles")
    messages = MessageService(
        store=store, sessions=service, hooks=hooks, data=data, control=control,
        agent_uid=AGENT_UID, agent_gid=AGENT_GID, audit=audit, clock=clock, limits=config.queues,
    )  # fmt: skip
    # timeout: (connect, read, write, pool) seconds, as httpx.Timeout(120.0, connect=10.0).
    http = LazyAsyncClient(timeout=(10.0, 120.0, 120.0, 120.0), follow_redirects=False).as_client()
    credentials = CredentialStore(config.daemon.master_key_file.parent)
    # The agents' mount sources are hidden from every MCP server (another agent's files).
    remote = RemoteMcpLauncher(
        credentials, config.mcp, config.egress, SystemResolver(), audit.record_soon,
        functools.partial(
            tls_context, Path(config.egress.ca_file) if config.egress.ca_file else None
        ),
    )  # fmt: skip
    launcher = McpLaunchers(SystemdMcpLauncher(credentials, config.mcp, hidden), remote)
    mcp_clients = McpSupervisor(launcher, config.mcp, credentials=credentials)

    async def restart_and_reap(agent: str) -> list[str]:
        # After an approved change: an unregistered (or re-registered) MCP server stops now.
        restarted = await service.restart_agent_sessions(agent)
        spec = registry.get(agent)
        await mcp_clients.forget_unregistered(agent, spec.mcp_servers if spec is not None else ())
        await asyncio.to_thread(_collect_images, images, registry, state_dir / "bundles")
        return restarted

    gateway = _gateway(
        config, store=store, registry=registry, audit=audit, restart=restart_and_reap, clock=clock,
        images=images, drivers=messages.senders,
    )  # fmt: skip
    broker = _egress(
        config, registry=registry, audit=audit, sessions=service, credentials=credentials,
        clock=clock,
    )  # fmt: skip
    hooks.on_remove(broker.forget)
    mcp = McpGateway(
        sessions=service, agents=registry, clients=mcp_clients, credentials=credentials,
        audit=audit, clock=clock, session_limits=config.mcp,
    )  # fmt: skip
    hooks.on_remove(mcp.forget)
    proxy = _model_proxy(
        registry=registry, audit=audit, sessions=service, http=http, credentials=credentials,
        clock=clock,
    )  # fmt: skip
    hooks.on_remove(proxy.forget)
    sandbox_api = SandboxApi(
        paths.INTERNAL_DIR / "sandbox-grpc.sock",
        paths.SESSIONS_RUN_DIR,
        proxy=proxy,
        gateway=gateway,
        egress=broker,
        mcp=mcp,
        sessions=service,
        hooks=hooks,
        audit=audit,
        clock=clock,
        limits=config.sockets,
    )
    inbox = Inbox(
        records=ChannelState(store), messages=messages, sessions=service, agents=registry,
        adapters=_channels(config, credentials, clock, audit),
        clock=clock,
    )  # fmt: skip
    hooks.on_remove(inbox.deliverer.forget)
    return Wired(
        master, store, service, control, messages, sandbox_api, http, gateway, registry, audit,
        mcp_clients, inbox, data.space,
    )  # fmt: skip


def _channels(
    config: Config, credentials: CredentialStore, clock: SystemClock, audit: Audit
) -> dict[str, ChannelAdapter]:
    """One adapter per ``[[channels]]`` table; a type this build has no adapter for is a
    ConfigError naming the channel. Credentials are read by the adapters when needed."""
    ca = Path(config.egress.ca_file) if config.egress.ca_file else None
    # Webhook replies go out under the egress broker's address rules (SSRF defence).
    webhooks = WebhookDelivery(
        resolver=SystemResolver(), upstream=PinnedHttpClient(ca), limits=config.egress,
        clock=clock,
        record=lambda d: audit.record_soon(
            "webhook.delivery", f"channel:{d.channel}",
            **{k: v for k, v in dataclasses.asdict(d).items() if k != "channel"},
        ),
    )  # fmt: skip
    builders: dict[str, Callable[[ChannelConfig], ChannelAdapter]] = {
        "matrix": lambda c: matrix_channel(c, credentials.get, clock),
        "webhook": lambda c: webhook_channel(c, credentials.get, clock, webhooks),
    }
    adapters = {}
    for channel in config.channels:
        if channel.type not in builders:
            raise ConfigError(
                f"channels.{channel.name}: type '{channel.type}' is not built into this "
                f"ironclawd (available: {', '.join(sorted(builders))})"
            )
        adapters[channel.name] = builders[channel.type](channel)
    return adapters


def hidden_from_helpers(config: Config) -> tuple[str, ...]:
    """What package-step and MCP server units may not see on top of the daemon's default
    directories (``paths.PRIVATE_DIRS``, hidden always): the agents' mount sources, and the
    state directory and master key where the config moved them (a review found a moved
    ``state_dir`` visible to both, kept from them by its mode alone). The master key is hidden
    as a file: its directory may be one others need (the credentials beside it are root's)."""
    moved = [
        str(p)
        for p in (config.daemon.state_dir, config.daemon.master_key_file)
        if not any(p.is_relative_to(d) for d in paths.PRIVATE_DIRS)
    ]
    return (*config.gateway.mount_allowlist, *moved)


def _rootfs(config: Config) -> Path:
    state_dir = config.daemon.state_dir
    try:
        return ensure_rootfs(
            config.sandbox.agent_dir, config.sandbox.rootfs_template, state_dir / "rootfs",
            _start_cache(config),
        )  # fmt: skip
    except IronclawError as exc:
        # The daemon still serves doctor and status; creating a session will say why not.
        log.error(
            "agent image unavailable: %s", exc, extra=message_id(MessageId.SANDBOX_UNAVAILABLE)
        )
        return state_dir / "rootfs" / "unavailable"


def _start_cache(config: Config) -> IdentityCache:
    """What start-up learnt about unchanged files (agent image digest, runsc), root-only."""
    return IdentityCache(config.daemon.state_dir / "cache" / "start.json")


def _session_data(config: Config, store: StateStore, master: MasterKey) -> SessionDataStore:
    state_dir = config.daemon.state_dir
    # Each session's outbound tmpfs lives in a mount namespace of the daemon's own, so that no
    # sandbox unit start copies them (host/mountns.py).
    space = OutboundSpace(paths.MOUNTNS_DIR, state_dir / QUEUES_DIR.name)
    space.start()
    return SessionDataStore(
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
        space,
    )


def _lifecycle(
    config: Config,
    netns: NetnsAdapter,
    control: ControlServer,
    data: SessionDataStore,
    hooks: SessionHooks,
    *,
    images: AptPackageImages,
) -> SandboxLifecycle:
    """A session's host resources: systemd, runsc, the netns adapter and the sockets."""
    bundles = config.daemon.state_dir / "bundles"
    ensure_private_dir(bundles, 0o700)
    # Skill sets no bundle names (no session, running or adoptable, uses them) go at start.
    removed = collect_skill_sets(skill_sets_dir(config.daemon.state_dir), bundles)
    if removed:
        log.info("removed %d unused skill set(s)", len(removed))
    layout = SandboxLayout(
        bundles_dir=bundles,
        rootfs=images.base,
        start_timeout=config.sandbox.start_timeout_seconds,
        idle_timeout=float(config.sandbox.idle_timeout_seconds),
        mount_allowlist=config.gateway.mount_allowlist,
        state_dir=config.daemon.state_dir,
    )
    return SandboxLifecycle(
        units=SystemdUnitManager(),
        netns=netns,
        control=control,
        runtime=_runtime(config),
        layout=layout,
        data=data,
        mounts=HostMounts(),
        bundles=BundleDirs(),
        sockets=hooks,
        images=images,
        journal=SystemdJournal(),
    )


def _model_proxy(
    *,
    registry: Registry,
    audit: Audit,
    sessions: SessionService,
    http: httpx.AsyncClient,
    credentials: CredentialStore,
    clock: SystemClock,
) -> ModelProxy:
    return ModelProxy(
        sessions=sessions,
        agents=registry,
        providers=build_providers(http),
        credentials=credentials,
        base_urls=default_base_urls(),
        audit=audit,
        clock=clock,
    )


def _gateway(
    config: Config,
    *,
    store: StateStore,
    registry: Registry,
    audit: Audit,
    restart: Callable[[str], Coroutine[Any, Any, list[str]]],
    clock: SystemClock,
    images: AptPackageImages,
    drivers: Callable[[str], Collection[str]],
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
        restart_agent_sessions=restart,
        mounts=HostMounts(),
        clock=clock,
        skill_keys=TrustedKeyDir(),
        channels=config.channels,
        packages=images,
        drivers=drivers,
        resume_pending=True,  # the daemon's start runs resume() (daemon.py)
    )


def _collect_images(images: AptPackageImages, registry: Registry, bundles: Path) -> None:
    """Images no agent's packages and no session's bundle name go (at start, after a change)."""
    try:
        removed = images.collect([s.packages for s in registry.values()], bundle_roots(bundles))
    except (IronclawError, OSError) as exc:
        log.warning("package images: not collected: %s", exc)
        return
    if removed:
        log.info("removed %d unused package image(s)", len(removed))


def _egress(
    config: Config,
    *,
    registry: Registry,
    audit: Audit,
    sessions: SessionService,
    credentials: CredentialStore,
    clock: SystemClock,
) -> EgressBroker:
    return EgressBroker(
        sessions=sessions,
        agents=registry,
        resolver=SystemResolver(),
        upstream=PinnedHttpClient(Path(config.egress.ca_file) if config.egress.ca_file else None),
        credentials=credentials,
        limits=config.egress,
        clock=clock,
        record=lambda d: audit.record_soon(
            "egress.decision", f"session:{d.sid}",
            **{k: v for k, v in dataclasses.asdict(d).items()
               if k != "sid" and (v or k != "unrecorded_before")},
        ),
    )  # fmt: skip


class HostProbeSet:
    """``ports.HostProbes`` over host/probes.py and store/probes.py (adapters never import each
    other: the composition root joins them)."""

    def runsc(self, runsc: Path) -> RunscCheck:
        result, info = probes.probe_runsc(runsc)
        return RunscCheck(result, tuple(info.platforms) if info is not None else ())

    def systemd(self) -> CheckResult:
        return probes.probe_systemd()

    def cgroups(self) -> CheckResult:
        return probes.probe_cgroups()

    def sqlcipher(self) -> CheckResult:
        return probe_sqlcipher()

    def platform(self, units: UnitManager, runsc: Path, platform: str) -> CheckResult:
        return probes.probe_platform(units, runsc, platform)


def _runtime(config: Config) -> SandboxRuntime:
    def trial(platform: str) -> str | None:
        # The doctor's trial: a trivial sandbox in a unit hardened like a session's (~0.2 s).
        result = probes.probe_platform(SystemdUnitManager(), config.sandbox.runsc, platform)
        return None if result.status is Status.PASS else result.detail

    try:
        info = runsc.detect_cached(_start_cache(config), config.sandbox.runsc)
        cached = runsc.cached_trial(_start_cache(config), info, trial)
        platform, why = runsc.choose_working_platform(config.sandbox.platform, info, cached)
    except IronclawError as exc:
        log.error("runsc unavailable: %s", exc, extra=message_id(MessageId.SANDBOX_UNAVAILABLE))
        return UnavailableRuntime(str(exc))
    log.info("runsc %s: platform %s (%s)", info.version, platform, why)
    ensure_private_dir(paths.RUN_DIR, 0o755)
    return RunscRuntime(info, paths.RUN_DIR / "runsc", platform)
