"""The registry of model providers (ironclawd/domain/providers.py): the daemon builds an adapter
for each entry and gets its default base URL there; config validation and the create_agent kind
accept exactly its names; and no other file of the daemon names a provider. A provider added to
the registry (with an adapter module, here one that exists only in this test) is built, offered
its base URL and accepted by create_agent with nothing else changed.
"""

from __future__ import annotations

import ast
import asyncio
import sys
import types
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from ironclawd.config import parse_config
from ironclawd.domain.changes import check_payload
from ironclawd.domain.model import Chunk, Completion, Message
from ironclawd.domain.providers import PROVIDERS, ProviderInfo, provider_choices
from ironclawd.errors import ConfigError, InvalidArgument
from ironclawd.providers.registry import build_providers, default_base_urls

REPO = Path(__file__).resolve().parents[2]


def _http() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(599)))


def test_every_registered_provider_is_built_under_its_name_with_its_base_url() -> None:
    built = build_providers(_http())
    assert list(built) == list(PROVIDERS) == ["mock", "anthropic", "openai"]
    for name, provider in built.items():
        assert provider.name == name
    assert default_base_urls() == {
        "anthropic": "https://api.anthropic.com",
        "openai": "https://api.openai.com/v1",
    }


def test_config_and_create_agent_accept_exactly_the_registered_names() -> None:
    for name in PROVIDERS:
        text = f"[agents.a]\nprovider = '{name}'\n"
        assert parse_config(text, "x.toml").agents[0].provider == name
        assert check_payload("create_agent", "a", f'{{"persona": "p", "provider": "{name}"}}')
    with pytest.raises(ConfigError, match="one of 'mock', 'anthropic', 'openai'"):
        parse_config("[agents.a]\nprovider = 'evil'\n", "x.toml")
    for bad in ('"evil"', "[]", "{}", "7"):
        with pytest.raises(InvalidArgument) as err:
            check_payload("create_agent", "a", f'{{"persona": "p", "provider": {bad}}}')
        assert str(err.value) == "payload.provider: expected mock, anthropic or openai"


def test_an_adapter_named_wrongly_or_outside_the_package_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError, match="adapter must be a module name"):
        ProviderInfo("x", base_url="", adapter="os.path")
    monkeypatch.setitem(PROVIDERS, "liar", ProviderInfo("liar", base_url="", adapter="mock"))
    with pytest.raises(RuntimeError, match="provider liar: its adapter calls itself mock"):
        build_providers(_http())


class EchoProvider:
    name = "echo"

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def stream(self, completion: Completion, key: str, base_url: str) -> AsyncIterator[Chunk]:
        yield Chunk(text=f"{base_url}: {completion.messages[-1].text}")


def test_a_provider_added_to_the_registry_is_built_and_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = types.ModuleType("ironclawd.providers.echo")
    module.build = EchoProvider  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ironclawd.providers.echo", module)
    info = ProviderInfo("echo", base_url="https://echo.test/v1", adapter="echo")
    monkeypatch.setitem(PROVIDERS, "echo", info)

    http = _http()
    built = build_providers(http)
    echo = built["echo"]
    assert isinstance(echo, EchoProvider)
    assert echo.http is http
    assert default_base_urls()["echo"] == "https://echo.test/v1"
    assert provider_choices() == "mock, anthropic, openai or echo"
    got = check_payload("create_agent", "a", '{"persona": "p", "provider": "echo"}')
    assert got["provider"] == "echo"

    async def first() -> Chunk:
        completion = Completion("", (Message("user", "hi"),), (), "m", 10)
        async for chunk in built["echo"].stream(completion, "", default_base_urls()["echo"]):
            return chunk
        raise AssertionError("no chunk")

    assert asyncio.run(first()).text == "https://echo.test/v1: hi"


def test_no_file_outside_the_registry_and_the_adapters_names_a_provider() -> None:
    allowed = {REPO / "ironclawd/domain/providers.py"} | {
        REPO / f"ironclawd/providers/{info.adapter}.py" for info in PROVIDERS.values()
    }
    found = []
    for path in sorted((REPO / "ironclawd").rglob("*.py")):
        if path in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in PROVIDERS.keys() - {"mock"}:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    assert found == []
