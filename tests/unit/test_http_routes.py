"""The HTTP route table: what each path needs, how paths match, what a bad table is refused for, and
the route list docs/protocol.md shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeinfer.errors import ConfigError
from edgeinfer.server.auth import GRPC_ROUTES
from edgeinfer.server.http import MetricsRoutes, V2Routes
from edgeinfer.server.http_routes import (
    ALIASES,
    METRICS_PORT,
    OPEN,
    PATHS_KEPT,
    ROUTES,
    Route,
    RouteTable,
    describe,
)

TABLE = RouteTable(ROUTES + ALIASES)
DOCS = Path(__file__).parents[2] / "docs" / "protocol.md"


def role(path: str) -> object:
    match = TABLE.match("GET", path)
    return match.role if match is not None else "infer (no route)"


@pytest.mark.parametrize(
    ("path", "needed"),
    [
        ("/metrics", "metrics"),
        ("/metrics/", "metrics"),
        ("/v2/repository/index", "admin"),
        ("/v2/repository/models/m/load", "admin"),
        ("/v2/models/stats", "admin"),
        ("/v2/models/m/versions/1/stats", "admin"),
        ("/v2/models/m/infer", "infer"),
        ("/v2/models/stats-model/infer", "infer"),
        ("/v2", "infer"),
        ("/v1/models/m/predict", "infer"),
        ("/v2/health/live", "infer"),
        ("/v2/routes/m", "admin"),
        ("/v2/canaries/m/promote", "admin"),
        ("/v2/ui/state", ("metrics", "admin")),
        ("/ui", OPEN),
        ("/nowhere", "infer (no route)"),
    ],
)
def test_the_role_each_http_path_needs(path: str, needed: object):
    assert role(path) == needed


def test_grpc_methods_need_the_role_of_their_http_twin():
    for method, (needed, path) in GRPC_ROUTES.items():
        twin = path.format(model="m") + ("/start" if method == "CanaryAction" else "")  # the action's route
        assert role(twin) == needed, method


@pytest.mark.parametrize(
    ("method", "path", "handler", "args"),
    [
        ("POST", "/v2/models/m/infer", "infer", ["m"]),
        ("POST", "/v2/models/m/versions/3/infer", "infer", ["m", "3"]),
        ("POST", "/v1/models/m/versions/3/predict", "infer", ["m", "3"]),
        ("GET", "/v2/models/stats", "statistics", []),
        ("GET", "/v2/models/stats/stats", "statistics", ["stats"]),
        ("GET", "/v2/models/m/", "model_metadata", ["m"]),
        ("POST", "/v2/canaries/m/abort", "canary", ["m", "abort"]),
        ("POST", "/v2/routes/m", "set_route", ["m"]),
    ],
)
def test_a_path_matches_its_route_a_literal_before_a_name(method, path, handler, args):
    match = TABLE.match(method, path)
    assert match is not None
    assert match.route is not None
    assert (match.route.handler, match.args) == (handler, args)


def test_a_path_with_other_methods_names_them_and_one_without_a_route_matches_none():
    match = TABLE.match("GET", "/v2/routes/m")
    assert match is not None
    assert match.route is None
    assert match.allowed == "PUT, DELETE", "not the alias kept for old clients"
    assert TABLE.match("GET", "/v2/models/m/versions") is None
    assert TABLE.match("GET", "/v2/canaries/m") is None
    assert TABLE.match("GET", "/") is None


@pytest.mark.parametrize(
    ("routes", "message"),
    [
        ((Route("GET", "/v2/admin-thing", "x", "", "new"),), "its role must be 'open' or one of"),
        ((Route("GET", "/v2/x", "x", ("infer", OPEN), "new"),), "its role must be"),
        ((Route("GET", "/v2/x", "x", "root", "new"),), "got 'root'"),
        ((Route("PATCH", "/v2/x", "x", "admin", "new"),), "a method GET, POST, PUT or DELETE"),
        (
            (Route("GET", "/v2/x", "x", "admin", ""), Route("GET", "/v2/x", "y", "admin", "")),
            "declared twice",
        ),
        ((Route("GET", "/v2/x", "x", "admin", ""), Route("PUT", "/v2/x", "y", "infer", "")), "one role"),
    ],
)
def test_a_route_without_a_declared_role_or_otherwise_wrong_is_a_start_up_error(routes, message):
    with pytest.raises(ConfigError, match=message):
        RouteTable(routes)


def test_a_route_must_declare_its_role():
    with pytest.raises(TypeError):
        Route("GET", "/v2/x", "x", summary="no role")  # type: ignore[call-arg]


def test_every_route_has_its_handler():
    for route in ROUTES + ALIASES:
        assert callable(getattr(V2Routes, route.handler, None)), route
    for route in METRICS_PORT:
        assert callable(getattr(MetricsRoutes, route.handler, None)), route


def test_docs_list_the_routes_of_the_table():
    text = DOCS.read_text()
    start, end = (
        text.index("<!-- routes -->\n```\n") + len("<!-- routes -->\n```\n"),
        text.index("```\n<!-- /routes -->"),
    )
    assert text[start:end].rstrip("\n") == describe(ROUTES), "docs/protocol.md's route list is the table's"


def test_a_path_matched_again_gets_the_same_answer_and_new_paths_never_grow_the_table():
    table = RouteTable(ROUTES)
    first = table.match("POST", "/v2/models/m/infer")
    assert table.match("POST", "/v2/models/m/infer") is first
    for number in range(PATHS_KEPT * 3):
        match = table.match("GET", f"/v2/models/model-{number}/ready")
        assert match is not None
        assert match.args == [f"model-{number}"]
    assert table.match("GET", "/nowhere") is None
    again = table.match("POST", "/v2/models/m/infer")
    assert again is not None
    assert again.route is not None
    assert (again.route.handler, again.args) == ("infer", ["m"])
