from __future__ import annotations

from pathlib import Path

import pytest

from ironclawd.config import Config, load_config, parse_config, reference_markdown
from ironclawd.errors import ConfigError


def test_empty_file_means_defaults() -> None:
    config = parse_config("", "t.toml")
    assert config.admin == Config().admin
    assert config.source == "t.toml"


def test_missing_file_means_defaults(tmp_path: Path) -> None:
    assert load_config(tmp_path / "absent.toml") == Config()


def test_a_config_file_others_may_write_is_refused(tmp_path: Path) -> None:
    # It names what the daemon runs as root (sandbox.runsc): its writer would own the host.
    path = tmp_path / "ironclawd.toml"
    path.write_text('[admin]\ngroup = "x"\n')
    path.chmod(0o666)
    with pytest.raises(ConfigError, match=r"others may write .*mode 0666"):
        load_config(path)
    path.chmod(0o620)
    with pytest.raises(ConfigError, match="mode 0620"):
        load_config(path)
    path.chmod(0o644)
    path.write_text('[admin]\ngroup = "ops"\n')
    assert load_config(path).admin.group == "ops"


def test_values_are_applied() -> None:
    config = parse_config(
        '[admin]\nmax_message_bytes = 2048\ngroup = "ops"\n[sandbox]\nplatform = "ptrace"\n',
        "t.toml",
    )
    assert config.admin.max_message_bytes == 2048
    assert config.admin.group == "ops"
    assert config.sandbox.platform == "ptrace"
    share = parse_config("[sockets]\nloop_share = 1.0\nloop_share_burst_seconds = 2\n", "t")
    assert (share.sockets.loop_share, share.sockets.loop_share_burst_seconds) == (1.0, 2.0)
    assert Config().gateway.mount_allowlist == ()  # nothing can be granted by default
    grants = parse_config("[gateway]\nmount_allowlist = ['/srv/share', '/srv/share/']\n", "t")
    assert grants.gateway.mount_allowlist == ("/srv/share",)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("[admin]\nmax_mesage_bytes = 3\n", ["admin.max_mesage_bytes", "max_message_bytes"]),
        ("[adminn]\n", ["[adminn]", "admin"]),
        ("[sandbox]\nplatform = 'kvmx'\n", ["sandbox.platform", "'ptrace'", "'kvmx'"]),
        ("[admin]\nmax_message_bytes = 'big'\n", ["admin.max_message_bytes", "integer"]),
        ("[admin]\nmax_message_bytes = true\n", ["admin.max_message_bytes", "integer"]),
        ("[admin]\nmax_message_bytes = 10\n", ["admin.max_message_bytes", "1024"]),
        ("[admin]\nsocket = 'relative.sock'\n", ["admin.socket", "absolute path"]),
        ("[admin]\nsocket = '/run/../etc/x'\n", ["admin.socket", ".."]),
        ("[daemon]\nlog_level = 'loud'\n", ["daemon.log_level", "'debug'"]),
        ("[sockets]\nloop_share = 2\n", ["sockets.loop_share", "0.001 to 1"]),
        ("admin = 3\n", ["'admin' must be a table"]),
        ("[admin\n", ["not valid TOML"]),
        ("[gateway]\nmount_allowlist = '/srv'\n", ["gateway.mount_allowlist", "a list"]),
        ("[gateway]\nmount_allowlist = ['/']\n", ["gateway.mount_allowlist", "other than '/'"]),
        ("[gateway]\nmount_allowlist = ['srv']\n", ["gateway.mount_allowlist", "absolute"]),
        ("[gateway]\nmount_allowlist = ['/srv/../etc']\n", ["gateway.mount_allowlist", ".."]),
        ("[gateway]\nmount_allowlist = ['/srv//x']\n", ["gateway.mount_allowlist", "normal"]),
    ],
)
def test_bad_config_names_key_and_expectation(text: str, names: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "/etc/ironclaw/ironclawd.toml")
    message = str(info.value)
    assert message.startswith("/etc/ironclaw/ironclawd.toml: ")
    for name in names:
        assert name in message


def test_reference_lists_every_key() -> None:
    reference = reference_markdown()
    for key in ("admin.socket", "admin.max_deadline_seconds", "sandbox.platform"):
        assert f"`{key}`" in reference


def test_docs_config_reference_is_current() -> None:
    doc = Path(__file__).parents[2] / "docs" / "config.md"
    assert reference_markdown() in doc.read_text(), "run: make docs (regenerates docs/config.md)"
