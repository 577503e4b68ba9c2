"""The degradation ladder without a clock: hysteresis traces, the latency window, the ladder's counts."""

from __future__ import annotations

import math

import pytest

from edgeinfer.model_config import FallbackConfig
from edgeinfer.repository.ladder import CHECK_EVERY_S, Hysteresis, Ladder, LatencyWindow

# enter above 45 ms for 5 s, exit below 30 ms for 30 s (the example)
LEVELS = {"enter_s": 0.045, "exit_s": 0.030, "enter_after_s": 5.0, "exit_after_s": 30.0}


def run(trace: list[tuple[float, float | None]]) -> list[bool]:
    """The state after each (time, p95) observation."""
    state = Hysteresis(**LEVELS)
    states = []
    for now, p95 in trace:
        state.step(p95, now)
        states.append(state.degraded)
    return states


def every(
    seconds: float, until: float, p95: float | None, start: float = 0.0
) -> list[tuple[float, float | None]]:
    count = round((until - start) / seconds)
    return [(start + i * seconds, p95) for i in range(count)]


@pytest.mark.parametrize(
    ("name", "trace", "degraded_at_end", "switches"),
    [
        ("below the enter level", every(1.0, 60.0, 0.040), False, 0),
        ("above, but not for long enough", every(1.0, 4.5, 0.050) + every(1.0, 10.0, 0.040, 4.5), False, 0),
        ("above for enter_after_s", every(1.0, 6.0, 0.050), True, 1),
        # hovering at the enter level: 3 s above, 1 s below, over and over: never 5 s in a row
        (
            "hovering at the enter level",
            [(t, 0.050 if t % 4 < 3 else 0.044) for t in range(0, 120)],
            False,
            0,
        ),
        # once down, between the levels keeps it down (hysteresis), however long
        ("between the levels", every(1.0, 6.0, 0.050) + every(1.0, 200.0, 0.035, 6.0), True, 1),
        # hovering at the exit level: 20 s below, 1 s above: never 30 s in a row
        (
            "hovering at the exit level",
            every(1.0, 6.0, 0.050) + [(t, 0.020 if t % 21 < 20 else 0.031) for t in range(6, 200)],
            True,
            1,
        ),
        (
            "below the exit level for exit_after_s",
            every(1.0, 6.0, 0.050) + every(1.0, 37.0, 0.020, 6.0),
            False,
            2,
        ),
        ("no requests after stepping down", every(1.0, 6.0, 0.050) + every(1.0, 37.0, None, 6.0), False, 2),
        ("no requests before", every(1.0, 60.0, None), False, 0),
        ("refusals (infinite latency)", every(1.0, 6.0, math.inf), True, 1),
    ],
)
def test_hysteresis_traces(name, trace, degraded_at_end, switches):
    states = run(trace)
    assert states[-1] is degraded_at_end, name
    assert sum(a != b for a, b in zip([False, *states], states, strict=False)) == switches, name


def test_the_dwell_is_measured_from_the_first_sample_beyond_the_level():
    states = run([(0.0, 0.050), (4.9, 0.050), (5.0, 0.050)])
    assert states == [False, False, True]
    # one sample back inside restarts the clock
    states = run([(0.0, 0.050), (4.0, 0.040), (4.5, 0.050), (9.0, 0.050), (9.5, 0.050)])
    assert states == [False, False, False, False, True]


def test_the_window_keeps_only_its_span():
    window = LatencyWindow(span_s=1.0)
    assert window.p95(0.0) is None
    for i in range(100):
        window.add(i * 0.01, 0.001 * (i + 1))  # 1..100 ms over 0..0.99 s
    assert window.p95(0.99) == pytest.approx(0.096)  # the sample at or above 95 % of the others
    assert window.p95(1.5) == pytest.approx(0.098)  # only 0.5..0.99 s remain: 51..100 ms
    assert window.p95(3.0) is None


def test_the_window_is_a_bounded_ring():
    window = LatencyWindow(span_s=100.0, capacity=10)
    for i in range(25):
        window.add(float(i), 1.0 if i < 15 else 0.001)  # the last 10 are fast
    assert window.p95(25.0) == pytest.approx(0.001)


def test_a_refusal_counts_as_infinitely_slow():
    window = LatencyWindow(span_s=10.0)
    for i in range(10):
        window.add(float(i), 0.001)
    window.add(9.5, math.inf)
    assert window.p95(10.0) == math.inf


def test_the_ladder_counts_switches_and_rechecks_at_most_every_check_interval():
    config = FallbackConfig(
        model="small", enter_p95_ms=45, exit_p95_ms=30, enter_after_s=1, exit_after_s=2, window_s=1
    )
    ladder = Ladder("big", config)
    now = 100.0
    ladder.observe(now, 0.050)
    assert not ladder.degraded(now)
    assert ladder.p95_s == pytest.approx(0.050)
    ladder.observe(now + CHECK_EVERY_S / 2, 0.001)
    ladder.degraded(now + CHECK_EVERY_S / 2)
    assert ladder.p95_s == pytest.approx(0.050), "not recomputed within the check interval"
    t = now
    while t < now + 1.5:  # slow requests for 1.5 s
        t += 0.05
        ladder.observe(t, 0.050)
        ladder.degraded(t)
    assert ladder.degraded(t)
    assert (ladder.entered, ladder.exited) == (1, 0)
    while t < now + 5.0:  # fast ones for 3.5 s: the old ones leave the window after 1 s, then 2 s below
        t += 0.05
        ladder.observe(t, 0.002)
        ladder.degraded(t)
    assert not ladder.degraded(t)
    assert (ladder.entered, ladder.exited) == (1, 1)


def test_workers_ladders_and_loop_lags_merge_into_one_exposition():
    from edgeinfer.exposition import exposition
    from edgeinfer.metrics import LadderGauges, Metrics, merge

    down = Metrics().snapshot([], [LadderGauges("big", "small", True, 2, 1, 0.050)], loop_lag_s=0.003)
    up = Metrics().snapshot([], [LadderGauges("big", "small", False, 1, 1, None)])
    merged = merge([down, up])
    assert merged["ladders"]["big"] == {
        "fallback": "small", "degraded": 1, "entered": 3, "exited": 2, "p95_s": 0.050,
    }  # fmt: skip
    text = exposition(merged, {}).decode()
    assert 'edgeinfer_model_degraded{fallback="small",model="big"} 1.0' in text
    assert 'edgeinfer_fallback_switches_total{direction="enter",fallback="small",model="big"} 3.0' in text
    assert 'edgeinfer_fallback_window_p95_seconds{model="big"} 0.05' in text
    assert "edgeinfer_event_loop_lag_seconds 0.003" in text  # the larger of the two workers' lags
