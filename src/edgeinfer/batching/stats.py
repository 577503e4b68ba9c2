"""Cumulative counters per model version, in the shape of Triton's statistics extension.

Updated only on the event loop (durations measured in worker threads are handed back with the
results), so no locks are needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgeinfer.runners import BatchTimes


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class ModelStatistics:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    by_batch_size: dict[int, BatchTimes] = field(default_factory=dict)
    count_by_batch_size: dict[int, int] = field(default_factory=dict)

    def record_batch(self, rows: int, requests: int, times: BatchTimes) -> None:
        self.execution_count += 1
        self.inference_count += rows
        self.compute_input.add(times.input_ns, requests)
        self.compute_infer.add(times.infer_ns, requests)
        self.compute_output.add(times.output_ns, requests)
        total = self.by_batch_size.get(rows)
        if total is None:
            total = self.by_batch_size[rows] = BatchTimes()
        total.input_ns += times.input_ns
        total.infer_ns += times.infer_ns
        total.output_ns += times.output_ns
        self.count_by_batch_size[rows] = self.count_by_batch_size.get(rows, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        """Triton's ``inference_stats`` / ``batch_stats`` layout (what tritonclient reads)."""
        return {
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(),
                "fail": self.fail.as_dict(),
                "queue": self.queue.as_dict(),
                "compute_input": self.compute_input.as_dict(),
                "compute_infer": self.compute_infer.as_dict(),
                "compute_output": self.compute_output.as_dict(),
                "cache_hit": {"count": 0, "ns": 0},
                "cache_miss": {"count": 0, "ns": 0},
            },
            "batch_stats": [
                {
                    "batch_size": rows,
                    "compute_input": {"count": self.count_by_batch_size[rows], "ns": times.input_ns},
                    "compute_infer": {"count": self.count_by_batch_size[rows], "ns": times.infer_ns},
                    "compute_output": {"count": self.count_by_batch_size[rows], "ns": times.output_ns},
                }
                for rows, times in sorted(self.by_batch_size.items())
            ],
        }


def merge_statistics(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """One version's statistics from several workers' (``as_dict`` layouts): counts and times summed,
    ``last_inference`` the latest, batch sizes merged, the learned batch cost the largest."""
    merged = ModelStatistics()
    for entry in entries:
        merged.inference_count += entry["inference_count"]
        merged.execution_count += entry["execution_count"]
        merged.last_inference_ms = max(merged.last_inference_ms, entry["last_inference"])
        stats = entry["inference_stats"]
        for name in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
            getattr(merged, name).add(int(stats[name]["ns"]), int(stats[name]["count"]))
        for batch in entry["batch_stats"]:
            rows = batch["batch_size"]
            times = merged.by_batch_size.setdefault(rows, BatchTimes())
            times.input_ns += int(batch["compute_input"]["ns"])
            times.infer_ns += int(batch["compute_infer"]["ns"])
            times.output_ns += int(batch["compute_output"]["ns"])
            count = int(batch["compute_infer"]["count"])
            merged.count_by_batch_size[rows] = merged.count_by_batch_size.get(rows, 0) + count
    result = merged.as_dict()
    costs = [entry["batch_cost"] for entry in entries if "batch_cost" in entry]
    if costs:  # each worker learns its own: the most expensive, and every batch seen
        result["batch_cost"] = {
            "per_batch_ns": max(cost["per_batch_ns"] for cost in costs),
            "per_row_ns": max(cost["per_row_ns"] for cost in costs),
            "batches_observed": sum(cost["batches_observed"] for cost in costs),
            "drain_per_row_ns": max(cost["drain_per_row_ns"] for cost in costs),
            "admission_margin_ns": max(cost["admission_margin_ns"] for cost in costs),
        }
    return result
