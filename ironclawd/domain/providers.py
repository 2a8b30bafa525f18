"""The model providers this ironclawd knows: the one list of their names (pure data).

Config validation, the ``create_agent`` kind and the daemon read it; ironctl passes a provider
name through and the daemon refuses an unknown one. Each entry names the adapter module that
builds it (``build(http)`` in ``ironclawd/providers/<module>.py``, made by
``ironclawd/providers/registry.py``) and the public API used when an agent sets no base_url.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

ADAPTER_PACKAGE = "ironclawd.providers"


@dataclass(frozen=True)
class ProviderInfo:
    name: str
    base_url: str  # "" for a provider that calls no API
    adapter: str  # the module under ironclawd/providers/ whose build(http) makes it

    def __post_init__(self) -> None:
        if not self.adapter.isidentifier():
            raise ValueError(f"provider {self.name}: adapter must be a module name")


def _registry(*providers: ProviderInfo) -> Mapping[str, ProviderInfo]:
    return {p.name: p for p in providers}


# The order is the order shown in messages and in docs/config.md.
PROVIDERS = _registry(
    ProviderInfo("mock", base_url="", adapter="mock"),  # offline, deterministic: the default
    ProviderInfo("anthropic", base_url="https://api.anthropic.com", adapter="anthropic"),
    ProviderInfo("openai", base_url="https://api.openai.com/v1", adapter="openai"),
)
DEFAULT_PROVIDER = "mock"


def provider_choices() -> str:
    """``mock, anthropic or openai``: the known names as an error message lists them."""
    names = list(PROVIDERS)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
