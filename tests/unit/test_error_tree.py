"""The one error tree: every IronclawError subclass anywhere in ironclawd is defined in
ironclawd/errors.py and has its own row in the one table (gRPC status, then ironctl exit code),
so a new class without a row fails here; every rate limit or budget is RESOURCE_EXHAUSTED."""

from __future__ import annotations

import importlib
import pkgutil
import re

import grpc
import pytest

import ironclawd
from ironclawd import errors
from ironclawd.api.status import code_for
from ironclawd.ctl import exitcodes
from ironclawd.errors import EXIT_CODE, GRPC_STATUS, IronclawError


def _every_error_class() -> list[type[IronclawError]]:
    for module in pkgutil.walk_packages(ironclawd.__path__, "ironclawd."):
        importlib.import_module(module.name)  # a class counts only once its module is loaded
    found: list[type[IronclawError]] = []
    todo: list[type[IronclawError]] = [IronclawError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


ALL = _every_error_class()


def test_the_walk_found_the_whole_tree() -> None:
    assert len(ALL) >= 20
    assert errors.RateLimited in ALL
    assert errors.MalformedReport in ALL


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_error_class_lives_in_errors_py_and_has_its_own_row(
    cls: type[IronclawError],
) -> None:
    assert cls.__module__ == "ironclawd.errors", f"define {cls.__qualname__} in ironclawd/errors.py"
    assert cls in GRPC_STATUS, f"{cls.__name__} has no row in errors.GRPC_STATUS"
    assert cls.__name__ in (errors.__doc__ or ""), f"draw {cls.__name__} in errors.py's tree"
    status = GRPC_STATUS[cls]
    assert code_for(cls("x")) is grpc.StatusCode[status]
    assert status in EXIT_CODE


def test_the_tree_in_the_docstring_names_each_class_with_its_status() -> None:
    drawn = dict(re.findall(r"(\w+)\s{2,}([A-Z_]+)$", errors.__doc__ or "", re.MULTILINE))
    assert drawn == {cls.__name__: status for cls, status in GRPC_STATUS.items()}


def test_every_grpc_status_has_one_documented_exit_code() -> None:
    assert set(EXIT_CODE) == {code.name for code in grpc.StatusCode}
    named = {
        value for name, value in vars(exitcodes).items() if name.isupper() and type(value) is int
    }
    for status, code in EXIT_CODE.items():
        assert code in named, status
        assert re.search(rf"(^|\s){code}\s", exitcodes.HELP), f"exit {code} not in --help"
        assert exitcodes.for_status(grpc.StatusCode[status].name) == code
    assert exitcodes.for_status("UNAVAILABLE") == exitcodes.UNAVAILABLE
    assert exitcodes.for_status("PERMISSION_DENIED") == exitcodes.PERMISSION
    assert exitcodes.for_status("INTERNAL") == exitcodes.INTERNAL


@pytest.mark.parametrize("cls", [errors.BudgetExceeded, errors.RateLimited, errors.DiskFull])
def test_every_limit_budget_or_full_disk_is_resource_exhausted_with_one_exit_code(
    cls: type[IronclawError],
) -> None:
    assert code_for(cls("x")) is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert exitcodes.for_status(code_for(cls("x")).name) == exitcodes.FAILED


def test_a_subclass_without_a_row_would_still_map_through_its_base() -> None:
    # The walk above refuses such a class; at run time it must not become INTERNAL by accident.
    class Unlisted(errors.NotFound):
        pass

    assert errors.grpc_status(Unlisted("x")) == "NOT_FOUND"
    assert Unlisted not in GRPC_STATUS
