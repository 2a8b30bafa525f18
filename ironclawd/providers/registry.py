"""Every provider of ``ironclawd/domain/providers.py`` built, and their default base URLs.

Each entry's ``adapter`` is a module of this package with ``build(http) -> Provider``; it is
imported here by that fixed name, so adding a provider is its module plus its line in the
domain's list, nothing else.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

from ironclawd.domain.providers import ADAPTER_PACKAGE, PROVIDERS
from ironclawd.providers.base import Provider, ProviderFactory

if TYPE_CHECKING:  # httpx loads at the first model call (issue 17: not at start)
    import httpx


def build_providers(http: httpx.AsyncClient) -> dict[str, Provider]:
    """One adapter per known provider, sharing the daemon's HTTP client."""
    out: dict[str, Provider] = {}
    for info in PROVIDERS.values():
        module = importlib.import_module(f"{ADAPTER_PACKAGE}.{info.adapter}")
        build = cast(ProviderFactory, module.build)
        provider = build(http)
        if provider.name != info.name:
            raise RuntimeError(f"provider {info.name}: its adapter calls itself {provider.name}")
        out[info.name] = provider
    return out


def default_base_urls() -> dict[str, str]:
    """The public API of each provider that calls one (an agent's base_url overrides it)."""
    return {name: info.base_url for name, info in PROVIDERS.items() if info.base_url}
