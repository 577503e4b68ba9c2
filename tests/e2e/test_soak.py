"""The soak (bench/soak.py), short: mixed HTTP JSON, binary and gRPC `tiny` requests with 1 % bad ones
and clients that hang up; no crash, every good request answered correctly, every bad one with its own
status, no growth of RSS (< 5 % after warm-up), file descriptors or threads. The benchmark runs the same
code with a million requests."""

from __future__ import annotations

from pathlib import Path

from bench.soak import report, soak


def test_a_short_soak_leaves_nothing_behind(tmp_path: Path):
    result = soak(requests=6000, clients=2, bad=0.01, disconnects=0.005, folder=tmp_path)
    assert result["failures"] == [], report(result)
    assert result["good"] > 5000
    assert result["bad"] > 0
    assert result["disconnects"] > 0
