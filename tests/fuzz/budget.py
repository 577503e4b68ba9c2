"""The generated-input tests' budget, one for every fuzz module: ``FUZZ_EXAMPLES`` examples per test (200
unless the environment says otherwise); the examples differ run to run, so CI keeps exploring."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

EXAMPLES_PER_TEST = int(os.environ.get("FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES_PER_TEST,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
