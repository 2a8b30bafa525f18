"""The egress credential canary, attacked from inside a session whose agent has an operator rule
that injects it (the egress world of tests/integration/test_egress.py: a test upstream in a
network namespace this run made, which reflects the credential back in every way it knows): the
credential searched for in every encoding in every readable file and in everything the broker
hands back; and egress.sock fuzzed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.test_egress import PASSWORD, TOKEN, TOKEN_PUNCT, World
from tests.integration.test_egress import world as egress_world  # noqa: F401 - a fixture
from tests.redteam.conftest import RUNNING, Sandbox, record
from tests.redteam.report import Ledger
from tests.redteam.test_attack_model_key import masked

pytestmark = pytest.mark.redteam

BASE = "https://keyed.egress.test/v1/"
# The world's three credential rules: a bearer token, one full of punctuation, a Basic password.
BASES = ",".join(f"https://keyed.egress.test/{p}/" for p in ("v1", "v2", "basic"))


@pytest.fixture(scope="module")
def raw(egress_world: World) -> Iterator[dict[str, Any]]:  # noqa: F811 - the fixture above
    sid = egress_world.create()
    box = Sandbox(egress_world.sysd, sid)
    try:
        # Control: the rule really injects the credential upstream.
        reply = egress_world.fetch(sid, {"url": BASE + "hello"})
        assert "HTTP 200" in reply, reply
        seen = [e for e in egress_world.entries("ns") if e.get("path") == "/v1/hello"]
        assert any(TOKEN in str(e["headers"]) for e in seen), seen
        found: dict[str, Any] = {}
        # The fuzz first: the canary searches below spend the session's egress budget.
        found.update(box.attacks("sockets", only="sockets.fuzz.egress"))
        found["_after"] = egress_world.fetch(sid, {"url": BASE + "hello"})
        needles = ",".join(
            masked(label, secret.encode())
            for label, secret in (
                ("token", TOKEN),
                ("punct", TOKEN_PUNCT),
                ("basic-password", PASSWORD),
            )
        )
        found.update(
            box.attacks(
                "secrets",
                needles=needles,
                egress_base=BASES,
                only="secrets.files,secrets.egress-echo",
                timeout=600,
            )
        )
        found["_state"] = box.state()
        yield found
    finally:
        egress_world.remove(sid)


@pytest.mark.parametrize("attack_id", ["secrets.files", "secrets.egress-echo"])
def test_egress_credential_canary_never_reaches_the_box(
    raw: dict[str, Any], ledger: Ledger, attack_id: str
) -> None:
    result = raw[attack_id]
    where = ("every readable file (incl. /proc/*/environ, cmdline)" if attack_id == "secrets.files"
             else "the broker's answers: echoed headers, gzip/deflate bodies, reason phrase, "
             "12 reflected encodings")  # fmt: skip
    record(ledger, attack_id.replace("secrets.", "secrets.egress-credential."), "secrets",
           f"find three egress credential canaries (bearer, punctuated, Basic password) in "
           f"{where}, in 22 encodings",
           result["ok"] is False, result["detail"], error=result["ok"] is None)  # fmt: skip
    assert result["ok"] is False, result


def test_fuzzed_egress_socket_keeps_serving(raw: dict[str, Any], ledger: Ledger) -> None:
    result = raw["sockets.fuzz.egress"]
    serving = "HTTP 200" in raw["_after"] and raw["_state"] == RUNNING
    record(ledger, "sockets.fuzz.egress", "sockets",
           "random, truncated and oversized gRPC/HTTP/2 frames to egress.sock",
           result["ok"] is False and serving,
           f"{result['detail']}; a real fetch afterwards: {raw['_after'][:40]!r}",
           error=result["ok"] is None)  # fmt: skip
    assert result["ok"] is False, result
    assert serving, result
