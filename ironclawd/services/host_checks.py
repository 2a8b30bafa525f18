"""What change kinds may ask of the host (``HostChecks`` of ironclawd/domain/kinds/base.py),
answered for the approval gateway from the ports, the configured channels and the registry."""

from __future__ import annotations

import grp
from collections.abc import Mapping, Sequence

from ironclawd.domain.agents import AgentMount, AgentSpec, grant_overlap
from ironclawd.domain.channels import ChannelConfig
from ironclawd.domain.packages import AgentPackage
from ironclawd.errors import InvalidArgument, PolicyDenied
from ironclawd.ports import MountSources, PackageImages, TrustedKeys


class GatewayHostChecks:
    def __init__(
        self,
        *,
        mounts: MountSources,
        mount_allowlist: tuple[str, ...],
        keys: TrustedKeys | None,
        packages: PackageImages | None,
        channels: Sequence[ChannelConfig],
        agents: Mapping[str, AgentSpec],
    ) -> None:
        self._mounts = mounts
        self._mount_allowlist = mount_allowlist
        self._keys = keys
        self._packages = packages
        self._channels = {c.name: c for c in channels}
        self._agents = agents

    def mount_source(self, source: str) -> None:
        """Mount allowlist: the source a real directory below an allowlisted one."""
        self._mounts.resolve(source, self._mount_allowlist)

    def mount_overlap(self, agent: str, mounts: tuple[AgentMount, ...]) -> None:
        why = grant_overlap(agent, mounts, self._agents)
        if why is not None:
            raise PolicyDenied(why)

    def skill_signature(self, name: str, manifest: bytes, signature: str) -> str:
        """Skill signature: by a key in the trusted directory (none given: no key is trusted)."""
        from ironclawd.formats import skill as skill_format  # noqa: PLC0415

        trusted = self._keys.read() if self._keys is not None else {}
        return skill_format.verify_manifest(name, manifest, signature, trusted)

    def resolve_packages(self, names: tuple[str, ...]) -> tuple[AgentPackage, ...]:
        return self._package_images().resolve(names)

    def prepare_packages(self, packages: tuple[AgentPackage, ...]) -> None:
        self._package_images().image(packages)

    def _package_images(self) -> PackageImages:
        if self._packages is None:
            raise PolicyDenied("this ironclawd has no package support (no image builder)")
        return self._packages

    def channel_kind(self, name: str) -> str:
        return self._channel(name).type

    def webhook_endpoint(self, channel: str, endpoint: str) -> None:
        config = self._channel(channel)
        names = [e.name for e in config.endpoints]
        if config.type != "webhook" or endpoint not in names:
            raise InvalidArgument(
                f"channel {channel} has no webhook endpoint {endpoint!r} "
                f"(configured: {', '.join(names) or 'none'})"
            )

    def route_owner(self, channel: str, where: str) -> str | None:
        for name, spec in self._agents.items():
            if any(r.channel == channel and r.where == where for r in spec.wiring):
                return name
        return None

    def host_group(self, name: str) -> None:
        try:
            grp.getgrnam(name)
        except KeyError:
            raise InvalidArgument(f"host group {name!r} does not exist on this host") from None

    def _channel(self, name: str) -> ChannelConfig:
        config = self._channels.get(name)
        if config is None:
            raise InvalidArgument(
                f"channel {name!r} is not configured (configured channels: "
                f"{', '.join(sorted(self._channels)) or 'none'}; [[channels]] in ironclawd.toml)"
            )
        return config
