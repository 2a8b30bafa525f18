"""Wrong types in the config and host checks shared by start and --check-config."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from ironclawd import daemon
from ironclawd.api.preflight import check_host
from ironclawd.config import Config, DaemonConfig, parse_config
from ironclawd.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[agents.x]\negress = [{host = 'example.com', methods = 5}]\n", "agents.x.egress"),
        ("[agents.x]\negress = [{host = 'example.com', scheme = [1]}]\n", "agents.x.egress"),
        ("[agents.x]\negress = [{host = 'a.com', path_prefixes = 7}]\n", "agents.x.egress"),
        ("[daemon]\nlog_level = [1]\n", "daemon.log_level"),
        ("[gateway]\nfour_eyes = 5\n", "gateway.four_eyes"),
        ("[egress]\ninternal_cidrs = [5]\n", "egress.internal_cidrs"),
        ("[agents.x]\ntools = {a = 1}\n", "agents.x.tools"),
    ],
)
def test_wrong_types_are_config_errors_naming_the_key(text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=f"'{key}'"):
        parse_config(text, "t.toml")


def _config(tmp_path: Path, **daemon_fields: object) -> Config:
    os.chmod(tmp_path, 0o755)
    return dataclasses.replace(Config(), daemon=DaemonConfig(**daemon_fields))  # type: ignore[arg-type]


def test_symlinked_state_dir_is_refused_naming_the_key(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "state").symlink_to(real)
    with pytest.raises(ConfigError, match=r"daemon\.state_dir: .*symlink"):
        check_host(_config(tmp_path, state_dir=tmp_path / "state", master_key_file=tmp_path / "k"))


def test_symlinked_master_key_is_refused_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "real.key").write_bytes(b"k" * 32)
    (tmp_path / "master.key").symlink_to(tmp_path / "real.key")
    config = _config(
        tmp_path, state_dir=tmp_path / "state", master_key_file=tmp_path / "master.key"
    )
    with pytest.raises(ConfigError, match=r"daemon\.master_key_file: .*symlink"):
        check_host(config)


def test_missing_admin_group_is_refused_naming_the_key(tmp_path: Path) -> None:
    base = _config(tmp_path, state_dir=tmp_path / "state", master_key_file=tmp_path / "k")
    config = dataclasses.replace(
        base, admin=dataclasses.replace(base.admin, group="no-such-group-ic", socket=tmp_path / "s")
    )
    with pytest.raises(ConfigError, match=r"admin\.group: group 'no-such-group-ic'"):
        check_host(config)


def test_check_config_exits_78_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    os.chmod(tmp_path, 0o755)
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "state").symlink_to(real)
    conf = tmp_path / "ironclawd.toml"
    conf.write_text(f"[daemon]\nstate_dir = '{tmp_path / 'state'}'\n")
    assert daemon.main(["--config", str(conf), "--check-config"]) == daemon.EX_CONFIG
    err = capsys.readouterr().err
    assert "daemon.state_dir" in err
    assert "Traceback" not in err
    conf.write_text("[agents.x]\negress = [{host = 'example.com', methods = 5}]\n")
    assert daemon.main(["--config", str(conf), "--check-config"]) == daemon.EX_CONFIG
    err = capsys.readouterr().err
    assert "agents.x.egress" in err
    assert "Traceback" not in err
