"""The daemon's logging set-up: no library may write the URLs the daemon fetches to the journal."""

from __future__ import annotations

import logging

import pytest

from ironclawd.logsetup import QUIET_LIBRARIES, setup_logging

SECRET_URL = "https://hooks.example.test/services/T0/B0/s3cr3t-path?token=s3cr3t-query"


@pytest.fixture
def restore_logging() -> object:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in QUIET_LIBRARIES}
    yield None
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    for name, old in levels.items():
        logging.getLogger(name).setLevel(old)


@pytest.mark.parametrize("level", ["info", "debug"])
def test_request_lines_of_http_libraries_never_reach_the_handler(
    level: str, restore_logging: object, caplog: pytest.LogCaptureFixture
) -> None:
    setup_logging(level)
    logging.getLogger().addHandler(caplog.handler)
    caplog.handler.setLevel(logging.DEBUG)
    # What httpx (and its fork httpx2) log for every request, under their own logger names,
    # and what the mcp SDK logs of a remote server's session.
    logging.getLogger("httpx").info('HTTP Request: %s %s "%s %d %s"', "GET", SECRET_URL,
                                    "HTTP/1.1", 200, "OK")  # fmt: skip
    logging.getLogger("httpx2._client").info("HTTP Request: POST %s", SECRET_URL)
    logging.getLogger("httpcore.http11").debug("send_request_headers.started %s", SECRET_URL)
    logging.getLogger("mcp.client.streamable_http").info("Received session ID: s3cr3t-session")
    logging.getLogger("ironclawd.egress").info("egress session x: allowed GET host:443/path")
    messages = [record.getMessage() for record in caplog.records]
    assert not [m for m in messages if "s3cr3t" in m], messages
    # The daemon's own lines still pass, and the libraries' warnings too.
    logging.getLogger("httpx").warning("a library warning")
    assert "egress session x: allowed GET host:443/path" in [r.getMessage() for r in caplog.records]
    assert "a library warning" in [r.getMessage() for r in caplog.records]
