"""The HTTP API as one table (``ROUTES``): each route's method, path pattern, handler, the API-key role
it needs and whether it is an inference. The table drives dispatch (``RouteTable.match``), the key
check, the early refusal of inference requests whose body is still arriving, and the route list in
docs/protocol.md (``describe``, held to the docs by a test).

A pattern is literal segments and ``{name}`` segments matching any one segment; a literal wins over a
name at the same place (``/v2/models/stats`` is not the statistics of a model named ``stats``).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeinfer.errors import ConfigError
from edgeinfer.server.auth import ROLES

OPEN = "open"  # a route that needs no key (the status page's static file)
PATHS_KEPT = 64  # matched paths remembered per method (``RouteTable.match``)
Role = str | tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Route:
    """``role``: the API-key role it needs (``OPEN``: none; a tuple: any one of them); ``handler``: the
    name of the transport's method that answers it; ``inference``: a model runs for it (judged for the
    SLO before its body is read)."""

    method: str
    pattern: str
    handler: str
    role: Role
    summary: str
    inference: bool = False
    listed: bool = True  # in the route list and the ``Allow`` header (False: an alias kept for old clients)


def _both(
    method: str, pattern: str, handler: str, role: Role, summary: str, inference: bool = False
) -> tuple[Route, ...]:
    """A model route and the same route of one version (``/versions/{version}`` after the model)."""
    versioned = pattern.replace("{model}", "{model}/versions/{version}", 1)
    return (
        Route(method, pattern, handler, role, summary, inference),
        Route(method, versioned, handler, role, summary, inference),
    )


ROUTES: tuple[Route, ...] = (
    Route("GET", "/v2", "server_metadata", "infer", "server metadata"),
    Route("GET", "/v2/health/live", "live", "infer", "liveness probe"),
    Route("GET", "/v2/health/ready", "ready", "infer", "readiness probe"),
    *_both("GET", "/v2/models/{model}", "model_metadata", "infer", "model metadata"),
    *_both("GET", "/v2/models/{model}/ready", "model_ready", "infer", "model readiness"),
    Route("GET", "/v2/models/stats", "statistics", "admin", "every model's statistics (Triton's extension)"),
    *_both("GET", "/v2/models/{model}/stats", "statistics", "admin", "statistics (Triton's extension)"),
    *_both("GET", "/v2/models/{model}/config", "model_config", "infer", "model configuration (Triton's)"),
    *_both("GET", "/v2/models/{model}/inspect", "model_inspect", "infer", "size, providers, coverage"),
    *_both("POST", "/v2/models/{model}/infer", "infer", "infer", "inference", inference=True),
    Route("GET", "/v1/models", "model_index", "infer", "every model, version and state"),
    *_both("POST", "/v1/models/{model}/predict", "infer", "infer", "inference, as /infer", inference=True),
    Route("GET", "/health", "health", "infer", "200 when ready, 503 otherwise"),
    Route("GET", "/metrics", "metrics", "metrics", "Prometheus metrics (also on the metrics port)"),
    Route("POST", "/v2/repository/index", "repository_index", "admin", "every version and its state"),
    Route("POST", "/v2/repository/models/{model}/load", "load", "admin", "load or reload a model"),
    Route("POST", "/v2/repository/models/{model}/unload", "unload", "admin", "stop serving a model"),
    Route("GET", "/v2/routes", "routes", "admin", "every weighted route"),
    Route("PUT", "/v2/routes/{model}", "set_route", "admin", 'set ({"variants": [...]}) or remove a route'),
    Route("DELETE", "/v2/routes/{model}", "remove_route", "admin", "remove a route"),
    Route("GET", "/v2/shadows", "shadows", "admin", "every shadow"),
    Route(
        "PUT", "/v2/shadows/{model}", "set_shadow", "admin", 'set ({"version"|"model", "share"}) or remove'
    ),
    Route("DELETE", "/v2/shadows/{model}", "remove_shadow", "admin", "remove a shadow"),
    Route("GET", "/v2/canaries", "canaries", "admin", "every canary's state"),
    Route("POST", "/v2/canaries/{model}/{action}", "canary", "admin", "start, pause, resume, promote, abort"),
    Route("GET", "/v2/ui/state", "overview", ("metrics", "admin"), "the server now, for the status page"),
    Route("GET", "/ui", "status_page", OPEN, "the status page (it reads /v2/ui/state)"),
)
# older clients set a route or a shadow with POST: the same handler, not listed
ALIASES: tuple[Route, ...] = (
    Route("POST", "/v2/routes/{model}", "set_route", "admin", "", listed=False),
    Route("POST", "/v2/shadows/{model}", "set_shadow", "admin", "", listed=False),
)
METRICS_PORT: tuple[Route, ...] = (Route("GET", "/metrics", "metrics", "metrics", "Prometheus metrics"),)


class _Node:
    __slots__ = ("by_method", "literal", "param")

    def __init__(self) -> None:
        self.literal: dict[str, _Node] = {}
        self.param: _Node | None = None
        self.by_method: dict[str, Route] = {}


class Match:
    """A path matched: the routes of its methods, the ``{name}`` segments in order, and the route of
    the request's method (None: the path takes other methods: 405)."""

    __slots__ = ("args", "by_method", "route")

    def __init__(self, route: Route | None, args: list[str], by_method: dict[str, Route]) -> None:
        self.route = route
        self.args = args
        self.by_method = by_method

    @property
    def role(self) -> Role:
        """The role the path needs (its routes share one: ``RouteTable`` checks)."""
        route = self.route if self.route is not None else next(iter(self.by_method.values()))
        return route.role

    @property
    def allowed(self) -> str:
        """The methods the path takes, for the ``Allow`` header."""
        return ", ".join(method for method, route in self.by_method.items() if route.listed)


class RouteTable:
    """``routes`` checked (a start-up error names what is wrong) and indexed by segment."""

    def __init__(self, routes: tuple[Route, ...]) -> None:
        self.routes = routes
        self._root = _Node()
        for route in routes:
            self._add(route)
        # by method, then path: the last PATHS_KEPT paths matched (a client sends a few over and over,
        # and a walk costs more than a lookup); all dropped when one more comes, so new paths never
        # cost memory
        self._kept: dict[str, dict[str, Match | None]] = {}

    def _add(self, route: Route) -> None:
        where = f"route {route.method} {route.pattern}"
        roles = (route.role,) if isinstance(route.role, str) else route.role
        if not roles or not all(role in ROLES or (role == OPEN and len(roles) == 1) for role in roles):
            raise ConfigError(
                f"{where}: its role must be {OPEN!r} or one of {', '.join(ROLES)}; got {route.role!r}"
            )
        if not route.pattern.startswith("/") or route.method not in ("GET", "POST", "PUT", "DELETE"):
            raise ConfigError(f"{where}: a method GET, POST, PUT or DELETE and a path from '/'")
        node = self._root
        for segment in _segments(route.pattern):
            if segment.startswith("{") and segment.endswith("}"):
                node.param = node.param or _Node()
                node = node.param
            else:
                node = node.literal.setdefault(segment, _Node())
        if route.method in node.by_method:
            raise ConfigError(f"{where}: declared twice")
        others = {other.role for other in node.by_method.values()}
        if others and others != {route.role}:
            raise ConfigError(
                f"{where}: its path needs one role for every method, not {others | {route.role}}"
            )
        node.by_method[route.method] = route

    def match(self, method: str, path: str) -> Match | None:
        """The routes of ``path`` (None: no route has that path). The same ``Match`` is given again for
        the same method and path: its ``args`` are read, never changed."""
        kept = self._kept.get(method)
        if kept is None:
            kept = self._kept[method] = {}
        elif path in kept:
            return kept[path]
        args: list[str] = []
        node = _walk(self._root, _segments(path), 0, args)
        match = None if node is None else Match(node.by_method.get(method), args, node.by_method)
        if len(kept) >= PATHS_KEPT:
            kept.clear()
        kept[path] = match
        return match


def _walk(node: _Node, segments: list[str], at: int, args: list[str]) -> _Node | None:
    """The node of ``segments[at:]`` below ``node`` that has routes, a literal tried before a name;
    ``args`` gets the segments the names matched."""
    if at == len(segments):
        return node if node.by_method else None
    segment = segments[at]
    child = node.literal.get(segment)
    if child is not None:
        found = _walk(child, segments, at + 1, args)
        if found is not None:
            return found
    if node.param is not None:
        args.append(segment)
        found = _walk(node.param, segments, at + 1, args)
        if found is not None:
            return found
        args.pop()
    return None


def _segments(path: str) -> list[str]:
    stripped = path.strip("/")
    return stripped.split("/") if stripped else []


def describe(routes: tuple[Route, ...]) -> str:
    """The route list as docs/protocol.md shows it: one line per path (a model's path and the same for
    one version together), its methods and what it is."""
    lines: dict[str, tuple[list[str], str]] = {}
    versioned: set[str] = set()
    for route in routes:
        if not route.listed:
            continue
        pattern = route.pattern
        if "{model}/versions/{version}" in pattern:
            pattern = pattern.replace("/versions/{version}", "", 1)
            versioned.add(pattern)
        methods, _ = lines.setdefault(pattern, ([], route.summary))
        if route.method not in methods:
            methods.append(route.method)
    shown = [
        (
            " | ".join(methods),
            pattern.replace("{model}", "{model}[/versions/{version}]", 1)
            if pattern in versioned
            else pattern,
            summary,
        )
        for pattern, (methods, summary) in lines.items()
    ]
    width = max(len(methods) for methods, _, _ in shown)
    widest = max(len(pattern) for _, pattern, _ in shown)
    return "\n".join(
        f"{methods:<{width}}  {pattern:<{widest}}  {summary}" for methods, pattern, summary in shown
    )
