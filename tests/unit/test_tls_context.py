"""ironclawd/net/http.tls_context: one verifying context per trust-anchor source, shared while the
source is unchanged (loading the system store cost ~30 ms per egress request before), and a new
one as soon as the CA file is rewritten: an operator replacing a CA never waits for a restart."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from ironclawd.net.http import tls_context
from tests.support.certs import write_ca


def _anchors(context: ssl.SSLContext) -> list[str]:
    return [str(c["subject"]) for c in context.get_ca_certs()]


def test_one_context_while_the_ca_file_is_unchanged(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    write_ca(ca, "first CA")
    context = tls_context(ca)
    assert tls_context(ca) is context
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert any("first CA" in a for a in _anchors(context))


def test_a_rewritten_ca_file_is_loaded_at_the_next_call(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    write_ca(ca, "first CA")
    first = tls_context(ca)
    write_ca(ca, "second CA")
    stat = ca.stat()
    os.utime(ca, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # a coarse clock too
    second = tls_context(ca)
    assert second is not first
    assert any("second CA" in a for a in _anchors(second))
    assert not any("first CA" in a for a in _anchors(second))


def test_sources_do_not_share_or_evict_each_other(tmp_path: Path) -> None:
    a, b = tmp_path / "a.pem", tmp_path / "b.pem"
    write_ca(a, "CA a")
    write_ca(b, "CA b")
    context_a, context_b = tls_context(a), tls_context(b)
    assert context_a is not context_b
    assert tls_context(a) is context_a
    assert tls_context(b) is context_b
    assert tls_context(None) is tls_context(None)  # the system store
    assert tls_context(None) is not context_a
