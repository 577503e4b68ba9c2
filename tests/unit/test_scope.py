"""Every server-wide operation is declared once (``control/scope.py``): each scope has it with the
declared signature, so that a worker's forwarded call and the supervisor's fan-out name the same
arguments."""

from __future__ import annotations

import inspect

import pytest

from edgeinfer.control.local import LocalScope
from edgeinfer.control.scope import MUTATING, OPERATIONS, Scope
from edgeinfer.supervisor.cluster import ClusterScope


def test_the_operations_are_the_protocols_methods():
    assert set(OPERATIONS) == {"load", "unload", "route", "shadow", "canaries", "canary", "index"} | {
        "statistics",
        "snapshot",
        "metrics",
        "overview",
    }
    assert set(OPERATIONS) >= MUTATING


@pytest.mark.parametrize("scope", [LocalScope, ClusterScope])
@pytest.mark.parametrize("op", OPERATIONS)
def test_each_scope_has_each_operation_as_declared(scope: type, op: str):
    declared = inspect.signature(getattr(Scope, op))
    implemented = inspect.signature(getattr(scope, op))
    assert list(implemented.parameters) == list(declared.parameters)
    assert [p.default for p in implemented.parameters.values()] == [
        p.default for p in declared.parameters.values()
    ]
    assert inspect.iscoroutinefunction(getattr(scope, op))
