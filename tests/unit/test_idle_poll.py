"""How long the server polls after going idle (``SpinWindow``), as traces of busy and idle periods."""

from __future__ import annotations

import itertools

import pytest

from edgeinfer.server.idle_poll import GAP_MARGIN, PROBE_EVERY, SpinWindow

US = 1e-6
LONGEST = 0.005  # the interpreter's switch interval


def after(trace: list[tuple[float, float | None]]) -> tuple[SpinWindow, list[float]]:
    """Each step: the busy time before an idle period (us), then how long the period lasted (us; None:
    still idle). Returns the policy and the window it gave each period (us)."""
    policy, windows = SpinWindow(), []
    for busy_us, gap_us in trace:
        policy.worked(busy_us * US)
        window = policy.window_s(LONGEST)
        windows.append(round(window / US, 3))
        if gap_us is not None:
            policy.ended(gap_us * US, window)
    return policy, windows


def test_nothing_measured_yet_means_no_polling():
    assert SpinWindow().window_s(LONGEST) == 0.0


def test_the_first_idle_period_polls_as_long_as_the_work_took():
    assert after([(60, None)])[1] == [60]


@pytest.mark.parametrize(
    ("gap_us", "settles_at"),
    [
        (20, GAP_MARGIN * 20),  # a client that comes back in 20 us: twice that is polled, not 60
        (40, 60),  # twice the gap is over the work: the work bounds it
    ],
)
def test_requests_that_come_back_soon_are_polled_for_about_twice_their_gap(gap_us, settles_at):
    _, windows = after([(60, gap_us)] * 40)
    assert windows[-1] == pytest.approx(settles_at, rel=0.01)


def test_sparse_traffic_stops_polling_and_probes_now_and_then():
    policy, windows = after([(60, 1_000_000)] * 60)  # a request a second: no poll catches one
    assert policy.hit_rate < 0.5
    stopped = windows.index(0.0)
    assert stopped <= 8, "it stops within a few misses"
    probes = [at for at, window in enumerate(windows) if at > stopped and window > 0]
    assert probes
    assert all(window == 60 for window in (windows[at] for at in probes))
    assert [b - a for a, b in itertools.pairwise(probes)] == [PROBE_EVERY] * (len(probes) - 1)


def test_probes_that_catch_requests_again_bring_polling_back():
    sparse = [(60, 1_000_000)] * 40
    policy, _ = after(sparse)
    windows = []
    for _ in range(PROBE_EVERY * 8):  # the client comes back fast again: only the probes see it
        policy.worked(60 * US)
        window = policy.window_s(LONGEST)
        windows.append(window)
        policy.ended(20 * US, window)  # slept gaps (window 0) teach nothing: only the probes count
    assert policy.hit_rate >= 0.5
    assert windows[-1] == pytest.approx(GAP_MARGIN * 20 * US, rel=0.05)


def test_a_gap_after_sleeping_does_not_count_against_polling():
    policy, _ = after([(60, 20)] * 10)
    rate, caught = policy.hit_rate, policy.caught_s
    policy.ended(5_000 * US, 0.0)  # slept: the gap includes the CPU's wake
    assert (policy.hit_rate, policy.caught_s) == (rate, caught)


def test_the_window_never_exceeds_the_mean_work_it_serves():
    policy = SpinWindow()
    for busy_us in (200, 100, 50, 25, 10, 5, 400, 5):
        policy.worked(busy_us * US)
        window = policy.window_s(LONGEST)
        assert policy.work_s is not None
        assert 0 < window <= policy.work_s
        policy.ended(20 * US, window)


def test_no_window_is_longer_than_the_longest_allowed():
    _, windows = after([(20_000, None)])  # 20 ms of work: the GIL is not held that long
    assert windows == [LONGEST / US]
