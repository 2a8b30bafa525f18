"""The daemon's logging set-up: no library may write the URLs the daemon fetches to the journal."""

from __future__ import annotations

import logging

import pytest

from ironclawd.logsetup import QUIET_LIBRARIES, Metered, setup_logging

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


def test_what_a_remote_party_makes_the_mcp_sdk_log_is_metered_without_tracebacks() -> None:
    """A hostile MCP server's invalid notifications each made the SDK log a WARNING with a
    traceback, under "client" (found by a review): at most a minute's share reach the handler,
    without tracebacks, and the next after a minute says how many were left out."""
    now = [0.0]
    meter = Metered(per_minute=20, clock=lambda: now[0])

    def record(name: str) -> logging.LogRecord:
        try:
            raise ValueError("server-chosen text\nfake: ironclawd line")
        except ValueError as exc:
            return logging.LogRecord(name, logging.WARNING, __file__, 1,
                                     "Failed to validate notification: %s", ("x",),
                                     (type(exc), exc, exc.__traceback__))  # fmt: skip

    passed = [r for r in (record("client") for _ in range(5000)) if meter.filter(r)]
    assert len(passed) == 20
    assert all(r.exc_info is None and r.exc_text is None for r in passed)
    assert passed[0].getMessage() == (
        "Failed to validate notification: x (ValueError; traceback not logged)"
    )
    # Children of "mcp" are metered too; the daemon's own lines never are.
    assert not meter.filter(record("mcp.shared.jsonrpc_dispatcher"))
    assert all(meter.filter(record("ironclawd.mcp")) for _ in range(100))
    now[0] = 61.0
    after = record("mcp.client.session")
    assert meter.filter(after)
    assert after.getMessage().endswith("[4981 such lines left out before this one]")


def test_setup_logging_meters_the_sdk(restore_logging: object) -> None:
    setup_logging("info")
    handler = logging.getLogger().handlers[0]
    assert any(isinstance(f, Metered) for f in handler.filters)
    assert logging.getLogger("client").level == logging.WARNING
