"""Which thread offloaded work runs on (``Starvation``), as traces of runs: where each ran, its wall time
and its CPU time."""

from __future__ import annotations

import pytest

from edgeinfer.server.offload import FREE_RATIO, STARVED_RATIO, Starvation

IDLE, LOW = True, False
MS = 1e-3
SHORTEST_WAIT_MS = 5.0  # the interpreter's switch interval, which the server passes


def threads(trace: list[tuple[bool, float, float]]) -> list[str]:
    """Each step: a run on the idle thread (IDLE) or the low one (LOW), its wall and CPU ms. Returns the
    thread the next run goes to after each step."""
    starvation, chosen = Starvation(SHORTEST_WAIT_MS * MS), []
    for on_idle, wall_ms, cpu_ms in trace:
        starvation.ran(on_idle, wall_ms * MS, cpu_ms * MS)
        chosen.append("low" if starvation.starved else "idle")
    return chosen


def test_it_starts_on_the_idle_thread():
    assert not Starvation(0.005).starved


@pytest.mark.parametrize(
    "ratios",
    [
        [1.0] * 20,  # a free CPU
        [1.43, 2.26, 3.76, 7.49, 1.2, 1.5, 2.0, 1.1] * 5,  # `cnn` at 2x: p50, p90, p99, max, ...
        [1.0, 1.0, 15.0, 1.0, 1.0, 1.0, 1.0, 15.0, 1.0, 1.0],  # held up now and then, twice that max
    ],
)
def test_runs_that_get_most_of_a_cpu_stay_on_the_idle_thread(ratios):
    assert threads([(IDLE, 2.5 * ratio, 2.5) for ratio in ratios]) == ["idle"] * len(ratios)


def test_one_run_that_waited_hundreds_of_times_its_cpu_time_moves_the_next_to_the_low_thread():
    """Two other processes spinning on two cores: 2.5 ms of work came back after 845 ms."""
    assert threads([(IDLE, 2.8, 2.5), (IDLE, 845.0, 2.5)]) == ["idle", "low"]


def test_runs_that_keep_waiting_several_times_their_cpu_time_move_it_too():
    chosen = threads([(IDLE, 2.5 * 12, 2.5)] * 10)
    assert "low" in chosen
    assert chosen.index("low") <= 4


def test_it_stays_on_the_low_thread_while_the_cpu_is_busy_and_goes_back_once_it_is_free():
    starved = [(IDLE, 845.0, 2.5)]
    busy = [(LOW, 2.5 * ratio, 2.5) for ratio in (9.6, 12.4, 9.4, 27.0, 8.0, 19.0)]  # measured: 24-71 ms
    free = [(LOW, 2.6, 2.5)] * 10
    chosen = threads(starved + busy + free)
    assert chosen[: 1 + len(busy)] == ["low"] * (1 + len(busy))
    back = chosen.index("idle", 1 + len(busy))
    assert back - len(busy) <= 10, "about ten runs on a free CPU bring it back"
    assert chosen[back:] == ["idle"] * (len(chosen) - back)


def test_on_the_low_thread_it_needs_runs_below_the_free_ratio_to_go_back():
    just_above = [(IDLE, 845.0, 2.5)] + [(LOW, 2.5 * FREE_RATIO * 1.05, 2.5)] * 30
    assert threads(just_above)[-1] == "low"


def test_runs_on_the_thread_no_longer_in_use_change_nothing():
    """Work handed out before a switch finishes after it: what it measured is about the old choice."""
    after_moving = [(IDLE, 845.0, 2.5), (IDLE, 2.5 * STARVED_RATIO * 10, 2.5), (IDLE, 2.5, 2.5)]
    assert threads(after_moving) == ["low"] * 3
    after_returning = [(IDLE, 845.0, 2.5)] + [(LOW, 2.5, 2.5)] * 10 + [(LOW, 500.0, 2.5)]
    assert threads(after_returning)[-1] == "idle"


def test_short_runs_held_up_by_the_loop_weigh_as_little_as_their_work():
    """A 256 KiB body decodes in about 0.4 ms; its result may wait a 6 ms loop iteration."""
    mixed = [(IDLE, 2.6, 2.5), (IDLE, 6.4, 0.4), (IDLE, 2.6, 2.5), (IDLE, 6.4, 0.4), (IDLE, 6.4, 0.4)] * 4
    assert threads(mixed) == ["idle"] * len(mixed)


def test_a_small_run_held_up_for_less_than_the_shortest_wait_moves_nothing():
    """A first run of a few microseconds (a thread to start, two hops) came back after 0.5 ms: a ratio of
    100, but no starvation."""
    assert threads([(IDLE, 0.5, 0.005)] + [(IDLE, 0.2, 0.005)] * 10) == ["idle"] * 11


def test_a_run_without_measurable_cpu_time_says_nothing():
    assert threads([(IDLE, 845.0, 0.0)] * 3) == ["idle"] * 3
