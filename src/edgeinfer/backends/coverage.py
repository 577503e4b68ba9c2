"""Which execution provider really runs each node of a model, read from ONNX Runtime's own profile.

An accelerator's provider takes the nodes it supports and leaves the rest to the CPU; when it takes
few, most of the work runs on the CPU and the accelerator's speed means nothing. ONNX Runtime records
the provider of every node it runs in its profile (``enable_profiling``: one ``Node`` event per
kernel, ``args.provider`` and ``args.op_name``), so one profiled run tells, for the graph as it is
executed (after ONNX Runtime's own fusions), the share of nodes and of time on each provider and
which operators fell back. Pure: the caller runs the model and hands the events over.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

KERNEL_SUFFIX = "_kernel_time"  # a node's compute event (the profile also has fences and session events)


@dataclass(frozen=True, slots=True)
class ProviderShare:
    provider: str
    nodes: int
    node_share: float
    time_us: int
    time_share: float


@dataclass(frozen=True, slots=True)
class Coverage:
    """One profiled run: ``wanted`` is the provider the model was asked to run on first."""

    wanted: str
    nodes: int
    providers: tuple[ProviderShare, ...]  # the most nodes first
    ops: dict[str, int]  # operator histogram of the executed graph
    fallback_ops: dict[str, dict[str, int]]  # provider -> op -> nodes, for nodes not on ``wanted``
    parameter_bytes: int  # initializers the nodes read, as ONNX Runtime counted them

    @property
    def ratio(self) -> float:
        """The share of nodes on the wanted provider (1.0 for a model with no nodes)."""
        if not self.nodes:
            return 1.0
        return next((share.node_share for share in self.providers if share.provider == self.wanted), 0.0)

    def ratios(self) -> dict[str, float]:
        """The node share of every provider that ran something, and of the wanted one (maybe 0)."""
        shares = {share.provider: share.node_share for share in self.providers}
        shares.setdefault(self.wanted, self.ratio)
        return shares

    def fallback_text(self) -> str:
        """``Op x3, Other x1 on CPUExecutionProvider``: what ran elsewhere, for error messages and logs."""
        parts = []
        for provider, ops in self.fallback_ops.items():
            listed = ", ".join(f"{op} x{count}" for op, count in sorted(ops.items(), key=lambda kv: -kv[1]))
            parts.append(f"{listed} on {provider}")
        return "; ".join(parts) or "none"

    def as_dict(self) -> dict[str, Any]:
        return {
            "wanted_provider": self.wanted,
            "coverage": round(self.ratio, 4),
            "nodes": self.nodes,
            "providers": [
                {
                    "provider": share.provider,
                    "nodes": share.nodes,
                    "node_share": round(share.node_share, 4),
                    "time_us": share.time_us,
                    "time_share": round(share.time_share, 4),
                }
                for share in self.providers
            ],
            "fallback_ops": self.fallback_ops,
            "ops": self.ops,
            "parameter_bytes": self.parameter_bytes,
        }


def coverage(events: Iterable[Mapping[str, Any]], wanted: str) -> Coverage:
    """Aggregate one profiled run's node events by provider. A node that ran more than once (in a loop)
    counts once for the node shares and with all its time for the time shares."""
    node_provider: dict[str, str] = {}
    node_op: dict[str, str] = {}
    node_params: dict[str, int] = {}
    time_us: Counter[str] = Counter()
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") != "Node" or not name.endswith(KERNEL_SUFFIX):
            continue
        args = event.get("args") or {}
        provider = str(args.get("provider") or "unknown")
        node = name[: -len(KERNEL_SUFFIX)]
        node_provider[node] = provider
        node_op[node] = str(args.get("op_name") or "unknown")
        node_params[node] = _int(args.get("parameter_size"))
        time_us[provider] += _int(event.get("dur"))
    nodes_by_provider = Counter(node_provider.values())
    total_nodes = len(node_provider)
    total_time = sum(time_us.values())
    providers = tuple(
        ProviderShare(
            provider,
            count,
            count / total_nodes,
            time_us[provider],
            time_us[provider] / total_time if total_time else 0.0,
        )
        for provider, count in nodes_by_provider.most_common()
    )
    fallback: dict[str, Counter[str]] = {}
    for node, provider in node_provider.items():
        if provider != wanted:
            fallback.setdefault(provider, Counter())[node_op[node]] += 1
    return Coverage(
        wanted=wanted,
        nodes=total_nodes,
        providers=providers,
        ops=dict(Counter(node_op.values()).most_common()),
        fallback_ops={provider: dict(ops) for provider, ops in fallback.items()},
        parameter_bytes=sum(node_params.values()),
    )


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
