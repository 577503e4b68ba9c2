"""The inline-or-thread choice as arithmetic: it follows the measured hop and inline time, tries a size
inline before trusting thread-measured times, and ends in the same mode wherever it starts."""

from __future__ import annotations

import pytest

from edgeinfer.runners.inline import HOP_NEEDED, INLINE_SAMPLES, TRIAL_EVERY, TRIAL_WITHIN, InlineChoice

US = 1e-6


def measured(hop_s: float) -> InlineChoice:
    choice = InlineChoice()
    for _ in range(HOP_NEEDED):
        choice.hopped(hop_s)
    return choice


def simulate(
    choice: InlineChoice, inline_s: float, thread_s: float, hop_s: float, batches: int
) -> list[bool]:
    """Batches of one row on a machine where the model computes in ``inline_s`` on the loop and
    ``thread_s`` in a thread, and the hop costs ``hop_s``; the mode of each."""
    modes = []
    for _ in range(batches):
        estimate = inline_s if modes and modes[-1] else thread_s  # the cost model saw the last batch
        inline = choice.goes_inline(1, estimate)
        if inline:
            choice.ran_inline(1, inline_s)
        else:
            choice.hopped(hop_s)
        modes.append(inline)
    return modes


def test_nothing_runs_inline_before_the_hop_is_measured():
    choice = InlineChoice()
    for _ in range(HOP_NEEDED - 1):
        choice.hopped(50 * US)
        assert not choice.goes_inline(1, 1 * US)
    choice.hopped(50 * US)
    assert choice.limit_s == pytest.approx(50 * US)
    assert choice.goes_inline(1, 1 * US)


def test_the_hop_is_the_least_of_recent_ones():
    choice = measured(40 * US)
    for _ in range(5):
        choice.hopped(5000 * US)  # a thread start, a busy machine: not the hop
    assert choice.limit_s == pytest.approx(40 * US)


@pytest.mark.parametrize(
    ("case", "inline_us", "thread_us", "hop_us", "settles_inline"),
    [
        ("tiny model, fast machine", 20, 30, 50, True),
        ("tiny model, slow machine (3x)", 60, 90, 150, True),
        ("threads measure it above the hop, inline below", 40, 80, 50, True),
        ("inline above the hop", 70, 80, 50, False),
        ("a CNN", 20_000, 21_000, 50, False),
    ],
)
def test_the_mode_follows_inline_time_against_the_hop_wherever_it_starts(
    case, inline_us, thread_us, hop_us, settles_inline
):
    for start_inline in (True, False):
        choice = measured(hop_us * US)
        if start_inline:  # it once ran inline (a measurement from warmup, say)
            choice.ran_inline(1, inline_us * US)
        modes = simulate(choice, inline_us * US, thread_us * US, hop_us * US, 3 * TRIAL_EVERY)
        last = modes[-2 * TRIAL_EVERY :]
        if settles_inline:
            assert all(last), (case, start_inline)
        else:
            assert sum(last) <= 2, (case, start_inline)  # at most one trial per TRIAL_EVERY


def test_a_size_near_the_hop_is_tried_inline_at_once_and_then_rarely():
    choice = measured(50 * US)
    assert choice.goes_inline(1, 80 * US), "first: tried"
    choice.ran_inline(1, 70 * US)  # inline it is above the hop too
    tries = [choice.goes_inline(1, 80 * US) for _ in range(2 * TRIAL_EVERY)]
    assert sum(tries) == 2


def test_a_size_far_above_the_hop_is_never_tried():
    choice = measured(50 * US)
    assert not any(choice.goes_inline(1, TRIAL_WITHIN * 50 * US * 1.01) for _ in range(3 * TRIAL_EVERY))


def test_a_machine_that_slows_down_moves_the_size_to_threads():
    choice = measured(50 * US)
    choice.ran_inline(1, 20 * US)
    assert choice.goes_inline(1, None)
    for _ in range(40):
        choice.ran_inline(1, 90 * US)
    assert sum(choice.goes_inline(1, None) for _ in range(100)) <= 1  # at most one more trial


def test_an_inline_batch_that_waited_for_the_gil_does_not_move_the_size_to_threads():
    choice = measured(50 * US)
    for _ in range(INLINE_SAMPLES):
        choice.ran_inline(1, 20 * US)
    choice.ran_inline(1, 5000 * US)  # another thread held the GIL for 5 ms meanwhile
    assert choice.goes_inline(1, 20 * US)


def test_a_size_sent_to_threads_by_a_burst_of_slow_inline_batches_comes_back_after_it():
    choice = measured(50 * US)
    for _ in range(INLINE_SAMPLES):
        choice.ran_inline(1, 5000 * US)  # a long stall: every recent inline batch waited
    assert not choice.goes_inline(1, 5000 * US), "the thread-measured time too is far above the hop now"
    modes = simulate(choice, 20 * US, 30 * US, 50 * US, 4 * INLINE_SAMPLES * TRIAL_EVERY)
    assert all(modes[-TRIAL_EVERY:]), "trials measured the size inline again, and it went back"


@pytest.mark.parametrize(
    ("fixed_us", "estimate_us", "inline"), [(0, 1, False), (100, 99, True), (100, 101, True)]
)
def test_a_configured_limit_replaces_the_hop(fixed_us, estimate_us, inline):
    """A fixed limit needs no measured hop (101 us is tried once: within TRIAL_WITHIN of it)."""
    assert InlineChoice(fixed_us * US).goes_inline(1, estimate_us * US) is inline
