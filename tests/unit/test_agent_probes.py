"""The red-team probe's batched attacks (redteam_probe/probes/): ids are stable dotted names, unique
across categories; an attempt reports success, errno or refusal, never raises; a canary is searched
for in every encoding, and the masked hand-over keeps every encoding out of the probe's argv."""

from __future__ import annotations

import base64
import errno
import json
import urllib.parse

import pytest

from ironclawd.formats.containment import ID_RE
from redteam_probe import probes
from redteam_probe.probes.base import Refused, attempt
from redteam_probe.probes.secrets import canaries, encodings

SECRET = b"sk-ant-api03-CANARY/0123+abc"


def test_attack_ids_are_dotted_and_unique_across_categories() -> None:
    ids = [attack_id for attacks in probes.CATEGORIES.values() for attack_id in attacks]
    assert len(ids) == len(set(ids))
    assert all(ID_RE.fullmatch(i) for i in ids), [i for i in ids if not ID_RE.fullmatch(i)]
    assert len(ids) >= 60


def test_attempt_reports_success_errno_refusal_and_probe_errors() -> None:
    assert attempt(lambda: {"a": 1}) == {"ok": True, "errno": None, "detail": '{"a": 1}'}

    def denied() -> None:
        raise PermissionError(errno.EACCES, "no")

    assert attempt(denied)["errno"] == "EACCES"
    assert attempt(denied)["ok"] is False

    def refused() -> None:
        raise Refused("nothing there")

    assert attempt(refused) == {"ok": False, "errno": None, "detail": "nothing there"}

    def broken() -> None:
        raise KeyError("bug")

    assert attempt(broken)["ok"] is None  # a probe bug is never taken for containment


def test_run_filters_by_id_and_refuses_unknown_categories() -> None:
    # Harmless on the host: it only reads /proc/self/status.
    results = probes.run(["kernel"], {"only": "priv.capabilities-held"})
    assert list(results) == ["priv.capabilities-held"]
    with pytest.raises(ValueError, match="expected one of"):
        probes.run(["nope"], {})


def test_every_encoding_of_a_canary_is_searched() -> None:
    forms = encodings(SECRET)
    text = SECRET.decode()
    must = {
        SECRET, SECRET.hex().encode(), base64.b64encode(SECRET),
        urllib.parse.quote(text, safe="").encode(),
        json.dumps(text).replace("/", "\\/")[1:-1].encode(),
    }  # fmt: skip
    assert must <= set(forms.values())
    # Inside a longer base64 text (a Basic header's user:secret), at any alignment.
    for prefix in (b"u:", b"us:", b"use:"):
        whole = base64.b64encode(prefix + SECRET + b"!")
        assert any(forms[f"base64-in-{k}"] in whole for k in range(3)), prefix


def test_canaries_travel_masked() -> None:
    pad = bytes(range(1, len(SECRET) + 1))
    masked = bytes(a ^ b for a, b in zip(SECRET, pad, strict=True))
    argv = f"model-key:{pad.hex()}:{masked.hex()}"
    assert canaries({"needles": argv}) == {"model-key": SECRET}
    assert not any(form.decode(errors="replace") in argv for form in encodings(SECRET).values())
