"""An egress rule asked for in a change is bounded: at most 32 path prefixes of at most 1024
characters, at most 7 methods, duplicates dropped. One session submission with a 1.4 MB path
prefix made a stored change larger than the admin API's 4 MiB answer, and `ironctl change list`
failed from then on (found by a review). Rules already stored still load."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ironclawd.domain.changes import check_payload
from ironclawd.domain.egress import (
    MAX_METHODS,
    MAX_PATH_PREFIX,
    MAX_PATH_PREFIXES,
    EgressRule,
    requested_rule,
)
from ironclawd.errors import InvalidArgument
from ironclawd.services.registry import spec_from_json
from tests.unit.test_changes_domain import World


def _egress(**rule: Any) -> str:
    return json.dumps({"rules": [{"host": "example.org", **rule}]})


@pytest.mark.parametrize(
    ("rule", "needle"),
    [
        ({"path_prefixes": ["/" + "a" * 1_400_000]},
         f"payload.rules[0]: expected path_prefixes[0]: a path of at most {MAX_PATH_PREFIX} "
         "characters, got one of 1400001"),
        ({"path_prefixes": ["/v1", "/" + "a" * MAX_PATH_PREFIX]},
         f"path_prefixes[1]: a path of at most {MAX_PATH_PREFIX} characters, got one of 1025"),
        ({"path_prefixes": [f"/{n}" for n in range(MAX_PATH_PREFIXES + 1)]},
         f"payload.rules[0]: expected path_prefixes: at most {MAX_PATH_PREFIXES} paths, got 33"),
        ({"methods": ["GET"] * 100_000},
         f"payload.rules[0]: expected methods: at most {MAX_METHODS} methods, got 100000"),
    ],
)  # fmt: skip
def test_a_rule_past_its_bounds_is_refused_naming_the_field_the_limit_and_what_was_given(
    rule: dict[str, Any], needle: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_payload("egress", "demo", _egress(**rule))
    assert needle in str(caught.value)
    assert len(str(caught.value)) < 200  # the prefix itself is not echoed


def test_a_rule_at_its_bounds_is_accepted_and_its_methods_are_deduplicated() -> None:
    prefixes = [f"/{n:03}" + "a" * (MAX_PATH_PREFIX - 4) for n in range(MAX_PATH_PREFIXES)]
    dumped = check_payload("egress", "demo", _egress(path_prefixes=prefixes))
    assert dumped["rules"][0]["path_prefixes"] == prefixes
    methods = ["get", "POST", "GET", "post", "HEAD", "head", "GET"]
    dumped = check_payload("egress", "demo", _egress(methods=methods))
    assert dumped["rules"][0]["methods"] == ["GET", "POST", "HEAD"]
    assert requested_rule({"host": "a.example"}) == EgressRule("a.example")


def test_a_session_cannot_store_the_reviewers_change() -> None:
    w = World()
    payload = _egress(path_prefixes=["/" + "a" * 1_400_000])
    with pytest.raises(InvalidArgument, match=r"path_prefixes\[0\]: a path of at most 1024"):
        w.gateway.submit("egress", "demo", payload, "", "session:s1")
    assert w.gateway.list_changes() == []
    assert "change.refused" in w.audit.events()


def test_rules_stored_before_the_bounds_still_load() -> None:
    # An agent approved before the bounds existed: the registry reads it back as it was.
    rule = {"host": "example.org", "methods": ["GET", "GET"],
            "path_prefixes": [f"/{n}" for n in range(40)]}  # fmt: skip
    spec = spec_from_json(json.dumps({"name": "old", "egress": [rule]}))
    assert len(spec.egress[0].path_prefixes) == 40
    assert spec.egress[0].methods == ("GET", "GET")
