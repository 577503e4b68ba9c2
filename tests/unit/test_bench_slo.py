"""bench/slo.py's targets and tables: a step in which the load generator fell behind is shown but not
counted; each step says what the hypervisor took and who used the cores."""

from __future__ import annotations

import math

import pytest

from bench import slo

FOUND = {"tiny": {"slo_ms": 4.0}, "cnn": {"slo_ms": 300.0}}
LIGHT = {  # the light-load part of a run: tiny at concurrency 1, cnn at 8 against in-process
    "tiny_c1": [{"ratio": 0.5}],
    "cnn_c8_images_per_s": 9.0,
    "cnn_inprocess_images_per_s": 10.0,
    "cnn_inprocess_before_after": [9.0, 11.0],
}


def step(model: str, config: str, offered: float, p99_ms: float, **extra: object) -> slo.RampPoint:
    return slo.RampPoint(model, config, offered, offered, 0.5, p99_ms, 0, 0.0, 0, 0.1, **extra)


def test_a_step_the_client_fell_behind_in_is_shown_and_not_counted():
    points = []
    for model, slo_ms in (("tiny", 4.0), ("cnn", 300.0)):
        for config in ("slo", "b8_w0"):
            points += [step(model, config, 1000.0, slo_ms / 2), step(model, config, 2000.0, slo_ms / 2)]
        # a stall at 1,000/s: 30 ms late, refused or slow; the step again kept the SLO
        points.insert(0, step(model, "slo", 1000.0, 80.0 * slo_ms, client_behind=True))
    summary = slo.targets(points, FOUND, LIGHT, {})
    assert summary["tiny"]["slo_holds_up_to_share_of_sustainable"] == 1.0
    assert summary["cnn"]["configs"]["slo"]["holds_slo_up_to"] == 2000.0
    shown = slo.targets_table(summary)  # the ratio against the mean of the in-process runs beside it
    assert "| 0.90 (9.0 images/s; in-process 9.0 just before, 11.0 just after) |" in shown
    assert "| <= 0.60 | 0.50 (0.50) |" in shown
    # c=1 runs the host disturbed were run again: the table says how many, and marks a counted run that
    # still met the limit (the last try counts as it is)
    disturbed = slo.targets_table(slo.targets(points, FOUND, LIGHT | {"tiny_c1_repeated": [{}, {}]}, {}))
    assert "| <= 0.60 | 0.50 (0.50; 2 more run again, the host taking over 5 % of the CPU) |" in disturbed
    still = [{"ratio": 0.5, "edgeinfer_host_steal_pct": 1.0, "fastapi_host_steal_pct": 29.5}, {"ratio": 0.4}]
    marked = slo.targets_table(slo.targets(points, FOUND, LIGHT | {"tiny_c1": still}, {}))
    assert "| <= 0.60 | 0.50 (0.50*, 0.40; * its last run still met over 5 %) |" in marked
    table = slo.points_table(points)
    assert table.count("slo (client behind, repeated)") == 2


def test_a_step_the_host_took_much_of_the_machine_in_is_shown_and_not_counted():
    points = [
        step(model, config, rate, FOUND[model]["slo_ms"] / 2)
        for model in ("tiny", "cnn")
        for config in ("slo", "b8_w0")
        for rate in (1000.0, 2000.0)
    ]
    # the host took 29 % of the CPU at 2,000/s: the SLO config fell behind; once more, it kept up
    points.insert(1, step("tiny", "slo", 2000.0, 30.0, host_steal_pct=29.2, host_took=True))
    points[1].goodput = 1000.0
    summary = slo.targets(points, FOUND, LIGHT, {})
    assert summary["tiny"]["configs"]["slo"]["holds_slo_up_to"] == 2000.0
    assert summary["tiny"]["slo_holds_up_to_share_of_sustainable"] == 1.0
    assert "| tiny | slo (host took 29.2 %, repeated) | 2,000.0 | 1,000.0 |" in slo.points_table(points)


def test_a_step_is_repeated_when_the_client_fell_behind_or_the_host_took_over_the_limit():
    limit = slo.STEAL_LIMIT_PCT
    cases = [  # (client late p99 ms, host steal %, repeated, client behind, host took); SLO 4 ms
        (0.5, 0.0, False, False, False),
        (4.0, limit, False, False, False),  # at the limits: counted
        (4.1, 0.0, True, True, False),
        (0.5, limit + 0.1, True, False, True),
        (30.0, 29.2, True, True, True),
        (0.5, math.nan, False, False, False),  # a kernel that does not count steal
    ]
    for late_ms, steal_pct, repeated, behind, took in cases:
        point = step("tiny", "slo", 1000.0, 2.0, host_steal_pct=steal_pct)
        point.client_late_p99_ms = late_ms
        assert (slo.mark_disturbed(point, 4.0), point.client_behind, point.host_took) == (
            repeated,
            behind,
            took,
        )


def test_a_step_runs_again_while_the_host_takes_the_cpu_and_once_when_the_client_fell_behind(
    monkeypatch: pytest.MonkeyPatch,
):
    over = slo.STEAL_LIMIT_PCT + 1
    cases = [  # (each run's (client late p99 ms, host steal %), runs made, the kept run); SLO 4 ms
        ([(0.5, 0.0)], 1, 0),
        ([(0.5, over), (0.5, 0.0)], 2, 1),
        ([(0.5, over), (0.5, over), (0.5, 0.0)], 3, 2),
        ([(0.5, over), (0.5, over), (0.5, over)], 3, 2),  # HOST_TRIES: the last counts as it is
        ([(9.0, 0.0), (9.0, 0.0)], 2, 1),  # the client behind: once more, then counted
        ([(9.0, 0.0), (9.0, over), (0.5, 0.0)], 3, 2),  # behind, then the host: again
        ([(0.5, over), (9.0, 0.0)], 2, 1),  # the host, then the client behind: counted
    ]
    assert slo.HOST_TRIES == 3
    for runs, made, kept in cases:
        made_points = []

        def run_step(*_: object, runs: list = runs, made_points: list = made_points) -> slo.RampPoint:
            late_ms, steal_pct = runs[len(made_points)]
            point = step("tiny", "slo", 1000.0, 2.0, host_steal_pct=steal_pct)
            point.client_late_p99_ms = late_ms
            made_points.append(point)
            return point

        monkeypatch.setattr(slo, "_step", run_step)
        shown: list[slo.RampPoint] = []
        counted = slo.measure_step(None, "tiny", "tiny_slo", b"", 1000.0, 1.0, 4.0, shown)  # type: ignore[arg-type]
        kept_at = [point is counted for point in made_points].index(True)
        assert (len(made_points), kept_at, counted.repeated()) == (made, kept, False), runs
        assert [p.repeated() for p in shown] == [True] * kept, runs
        assert all(a is b for a, b in zip(shown, made_points[:kept], strict=True)), runs


def test_host_steal_is_the_hypervisors_share_of_the_machines_cpu_time_over_the_step():
    from bench import loadgen

    #            user nice system idle iowait irq softirq steal guest guest_nice
    before = [1000, 0, 200, 5000, 10, 0, 40, 100, 0, 0]
    after = [1600, 0, 300, 5200, 10, 0, 40, 200, 0, 0]  # 1,000 ticks passed, 100 of them stolen
    assert math.isclose(loadgen.steal_share(before, after), 0.1)
    assert math.isnan(loadgen.steal_share(before, before))  # no time passed
    assert math.isnan(loadgen.steal_share(None, after))  # no /proc/stat
    assert math.isnan(loadgen.steal_share(before[:4], after[:4]))  # a kernel without the steal field
    times = loadgen.cpu_times()
    assert times is None or len(times) >= 8


def test_machine_busy_is_the_share_of_the_machines_cpu_time_not_idle_over_the_step():
    from bench import loadgen

    #            user nice system idle iowait irq softirq steal guest guest_nice
    before = [1000, 0, 200, 5000, 10, 0, 40, 100, 0, 0]
    after = [1600, 0, 300, 5150, 60, 0, 40, 200, 0, 0]  # 1,000 ticks passed, 200 idle (150 + 50 iowait)
    assert math.isclose(loadgen.busy_share(before, after), 0.8)
    assert math.isnan(loadgen.busy_share(before, before))  # no time passed
    assert math.isnan(loadgen.busy_share(None, after))  # no /proc/stat
    assert math.isnan(loadgen.busy_share(before[:4], after[:4]))  # a kernel without all the fields


def test_the_points_table_shows_the_host_steal_and_who_used_the_cores_in_each_step():
    table = slo.points_table(
        [
            step(
                "tiny",
                "slo",
                1000.0,
                2.0,
                host_steal_pct=12.5,
                server_cores=0.95,
                client_cores=0.99,
                host_busy_pct=97.0,
                server_us_per_request=55.4,
            )
        ]
    )
    assert table.splitlines()[0].endswith(
        "| host steal % | server cores | client cores | machine busy % | server us/request |"
    )
    assert table.splitlines()[2].endswith("| 0.10 | 12.5 | 0.95 | 0.99 | 97 | 55 |")


def test_the_overload_target_says_who_used_the_cores_and_what_a_request_cost_the_server():
    points = [step(model, config, 1000.0, 1.0) for model in slo.MODELS for config in ("slo", "b8_w0")]
    points.append(step("tiny", "slo", 900.0, 1.0, at_target=True, server_us_per_request=139.6))
    overload = {
        "tiny": {
            "offered": 2000.0,
            "goodput": 900.0,
            "admitted_p99_ms": 3.9,
            "refused": 3300,
            "refused_p99_ms": 10.3,
            "refused_after_send_p99_ms": 10.1,
            "client_late_p99_ms": 0.3,
            "client_write_p99_ms": 0.02,
            "server_cores": 0.95,
            "client_cores": 0.99,
            "host_busy_pct": 97.0,
            "server_us_per_request": 55.4,
            "errors": 0,
            "not_sent": 651,
            "rss_before_mib": 80.0,
            "rss_after_mib": 81.0,
            "answers_after": True,
        }
    }
    shown = slo.targets_table(slo.targets(points, FOUND, LIGHT, overload))
    assert (
        "the client itself late by 0.3 ms, its write of a request taking up to 0.02 ms; cores: server 0.95, "
        "client 0.99, machine busy 97 %;" in shown
    )
    assert "; the server's CPU 55 us a request, 140 at 0.9 x R*;" in shown


def test_the_priorities_step_says_what_each_level_got():
    points = [step(model, config, 1000.0, 1.0) for model in slo.MODELS for config in ("slo", "b8_w0")]
    level = {"refused_p99_ms": 4.2, "errors": 0, "host_steal_pct": 0.3}
    priorities = {
        "cnn": {
            "priority_1": level | {"offered": 8.0, "answered_share": 0.9531, "p99_ms": 108.2, "refused": 3},
            "priority_2": level
            | {"offered": 160.0, "answered_share": 0.476, "p99_ms": 548.2, "refused": 700},
        }
    }
    shown = slo.targets_table(slo.targets(points, FOUND, LIGHT, {}, priorities))
    assert (
        "| cnn: 2x, 0.1 x R* of it at priority 1 and the rest at 2: priority 1 within the SLO | answered, "
        "p99 <= "
        f"{FOUND['cnn']['slo_ms']:g} ms | 95.3% answered of 8.0/s, p99 108.20 ms (3 refused); priority 2: "
        "47.6% of 160.0/s at p99 548.20 ms, refusals p99 4.2 ms; 0 errors |" in shown
    )
    assert "tiny: 2x, " not in shown  # not measured: not shown


def kept(model: str, config: str, offered: float, answered_share: float, **extra: object) -> slo.RampPoint:
    point = step(model, config, offered, 1.0, **extra)
    point.goodput = offered * answered_share
    return point


def test_the_sustainable_rate_is_the_highest_one_kept_up_with_twice():
    ramp = [
        kept("cnn", "slo", 60.0, 1.0),
        kept("cnn", "slo", 70.0, 0.93),
        kept("cnn", "b8_w2", 70.0, 0.99),
        kept("cnn", "b8_w2", 80.0, 0.96),  # a lucky step: once more, it did not keep up
    ]
    assert slo.sustainable_rate(ramp) == 80.0  # without repeats: one step is enough
    repeats = [
        kept("cnn", "b8_w2", 80.0, 0.90, confirms=80.0),
        kept("cnn", "b8_w2", 70.0, 0.97, confirms=70.0),
    ]
    assert slo.sustainable_rate(ramp + repeats) == 70.0
    assert slo.sustainable_rate(ramp + repeats[:1]) == 80.0  # no repeat kept up: the ramp's own answer


def test_the_repeats_of_r_star_candidates_are_shown_and_are_not_ramp_steps():
    points = []
    for model in slo.MODELS:
        points += [kept(model, "slo", 1000.0, 1.0), kept(model, "slo", 2000.0, 0.96)]
        points += [kept(model, "b8_w0", 1000.0, 1.0), kept(model, "b8_w0", 2000.0, 0.80)]
        # the SLO config's 2,000/s kept up once, not twice: R* is 1,000/s, and its held rate is its own
        points.append(kept(model, "slo", 2000.0, 0.90, confirms=2000.0))
        points.append(kept(model, "slo", 1000.0, 1.0, confirms=1000.0))
    summary = slo.targets(points, FOUND, LIGHT, {})
    assert summary["tiny"]["sustainable_rate"] == 1000.0
    assert summary["tiny"]["configs"]["slo"]["holds_slo_up_to"] == 2000.0
    assert [p.offered for p in slo.steps_of(points, "slo")] == [1000.0, 1000.0, 2000.0, 2000.0]
    assert slo.points_table(points).count("| slo (R* candidate, once more) |") == 4


def test_shares_are_shown_so_that_just_under_the_target_does_not_read_as_on_it():
    points = [step(model, config, 1000.0, 1.0) for model in slo.MODELS for config in ("slo", "b8_w0")]
    points += [step(model, "slo", 1117.3, 100.0) for model in slo.MODELS]  # not held
    points += [step(model, "b8_w0", 1117.3, 100.0) for model in slo.MODELS]
    points.append(kept("cnn", "slo", 71.8, 68.2 / 71.8, at_target=True))  # a hair under 95 %
    shown = slo.targets_table(slo.targets(points, FOUND, LIGHT, {}))
    assert "sustainable rate (1,117/s) | >= 0.90 | 0.895 (best fixed, b8_w0: 0.895) |" in shown
    assert "at 72/s (0.9 x R*): NOT held, 94.99% answered," in shown


def test_throughput_within_the_slo_is_the_best_of_every_run_and_says_how_many():
    """A fixed config that answered more when its step was repeated (as R*'s candidate) is judged by that
    repeat: the ratio against the best fixed counts every run of both, and the table says how many."""
    points = []
    for model in ("tiny", "cnn"):
        slo_ms = FOUND[model]["slo_ms"]
        points += [step(model, "slo", 1000.0, slo_ms / 2), step(model, "slo", 2000.0, slo_ms / 2)]
        points += [step(model, "b8_w0", 1000.0, slo_ms / 2), step(model, "b8_w0", 2000.0, slo_ms / 2)]
        points[-1].goodput = 1500.0  # fell behind in the ramp ...
        points.append(step(model, "b8_w0", 2000.0, slo_ms / 2, confirms=2000.0))  # ... kept up once more
    summary = slo.targets(points, FOUND, LIGHT, {})
    assert summary["tiny"]["throughput_within_slo_vs_best_fixed"] == 1.0  # 2,000 against 2,000, not 1,500
    assert summary["tiny"]["configs"]["b8_w0"]["runs"] == 3
    assert "| 1.00 (the best of every run: 2 of the SLO config, 3 of b8_w0, 5 in all) |" in slo.targets_table(
        summary
    )
