"""The config file itself (found by a review):

- one saved with a byte-order mark read "not valid TOML: Invalid statement (at line 1, column
  1)", naming nothing the operator can see at that place;
- a FIFO (or any other non-regular file) at the config path blocked the start, --check-config
  and ``ironctl doctor``'s config check in open() until something wrote to it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ironclawd.config import load_config, parse_config
from ironclawd.errors import ConfigError


def test_a_byte_order_mark_is_named() -> None:
    with pytest.raises(ConfigError, match=r"t\.toml: .*byte-order mark.*UTF-8 without"):
        parse_config("\ufeff[daemon]\nlog_level = 'info'\n", "t.toml")


def test_a_fifo_at_the_config_path_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "ironclawd.toml"
    os.mkfifo(fifo, 0o600)
    outcome: list[BaseException | object] = []

    def load() -> None:
        try:
            outcome.append(load_config(fifo))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(5.0)
    if worker.is_alive():
        with open(fifo, "wb"):  # let the blocked open() return, then fail
            pass
        worker.join(5.0)
        pytest.fail("load_config waited on a FIFO")
    (result,) = outcome
    assert isinstance(result, ConfigError), result
    assert "not a regular file" in str(result)
    assert str(fifo) in str(result)
