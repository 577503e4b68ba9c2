"""The latency-objective benchmark (issue 12): adaptive SLO batching against a sweep of fixed settings.

    python bench/slo.py [--step-seconds 3] [--plot PATH]      (also part of `python bench/run.py`)

1. A probe server (every model with ``max_batch_size: 1``) gives each model's single-request latency
   (wrk, concurrency 1, the lowest p50 of ``PROBE_RUNS``) and closed-loop capacity (wrk, concurrency
   32). Each model's SLO is ``SLO_FACTOR`` x that latency: an objective a user of this box could ask
   for, derived from what the box does rather than written for one machine.
2. Light load: the user's plain config (``max_batch_size: 32, batch_timeout_millis: 2``) plus the SLO, on
   ``tiny`` over JSON at concurrency 1, from ``FRESH_RUNS`` fresh server processes, against the bare
   FastAPI endpoint (a pair of runs in which the host took more than ``STEAL_LIMIT_PCT`` % is run
   again like a ramp step, below); and ``cnn`` over JSON at concurrency 8 against in-process ONNX
   Runtime, measured just before and just after it (``light_load``).
3. The ramp: one server holds each model under the plain SLO config and under every fixed
   configuration of ``FIXED`` (max batch x max wait, no SLO). Open-loop Poisson arrivals
   (bench/loadgen.py) at ``RAMP`` x the probe's capacity, ``--step-seconds`` each, until a configuration
   falls behind. The *sustainable rate* R* is the highest offered rate some configuration kept up with
   (answered at least 95 % of it) twice: in its ramp step, and once more right after the ramp
   (``confirm_sustainable``: the steps that kept up are repeated from the highest rate down until one
   keeps up again; ``sustainable_rate``). With one step each, R* was the luckiest of some forty noisy
   steps near the limit: on the 2-core VM of 20261202, `cnn`'s was 88/s in one run (`b8_w2` answered
   83.4/s of 87.6: 95.2 %) and 74/s in the next, and 10 s steps at 85/s on fresh servers answered
   77.0-82.9/s under the SLO config and under `b8_w2` alike (two each). A configuration *holds the
   SLO* at a rate when it answers at least 95 % of it with p99 within the SLO. Then one more step of
   the SLO configuration at ``TARGET_SHARE`` x R*, the target's own rate: the ramp's steps near the top
   are about 0.9 apart, so its highest step held below R* cannot tell whether the SLO holds at 0.9 x R*.
4. Overload: 2 x R* on the SLO configuration: p99 of the admitted requests, how fast refusals come back,
   the server's RSS before and after, and that it still answers every request (no error, no refusal)
   ``AFTER_S`` after the overload. Then the same overload again, ``PRIORITY_SHARE`` x R* of it sent at
   priority 1 and the rest at priority 2 (two load generators at once): how much of the priority-1
   traffic is answered, and at what p99 (issue 12: "priority levels keep high-priority traffic within
   the SLO under overload"). Refusals count from when they were due (the target); beside that
   the table shows them from when the client sent them, and how late the client was: on a machine
   the client shares with the server, the difference is the client's.

A step in which the load generator itself fell behind by more than the model's SLO (its ``client late``
p99: it shares the machine, and a stall of the whole VM delays it as much as the server) measured the
client, not the server: it is run again once, and the first is shown marked and left out of the
targets. The second counts whatever it shows: the server can make the client late (they share the
cores), so lateness is not excused twice.

Each step also shows the host's steal (``loadgen.steal_share``): the share of the machine's CPU time
the hypervisor gave to other guests meanwhile, which tells a reader comparing runs from two machines,
or two hours, whether the host was busy. A step in which it took more than ``STEAL_LIMIT_PCT`` % measured
the host's other guests, and is run again, up to ``HOST_TRIES`` runs in all, each one not kept shown
marked and left out of the targets; the last counts whatever it shows. Steal is the one thing the
server cannot cause, so running again excuses nothing it does, and once was not enough: the host's
busy spells last minutes, and in 20261203-083318 both runs of twelve of `tiny`'s ramp steps met 5.2-24.9 %,
one of them (the SLO config at 2,071/s, 0.4 of the probe's capacity: 18.5 and 13.5 %, p99 7.65 and
9.17 ms against an SLO of 8.2) ending the SLO config's ramp at 0.17 of R*. Quiet, the host takes 0-2 %
here; in the runs of 20261202-03 0-12 steps of about
a hundred took more than 5 %, up to 29 %, at random in the ramp, and one was enough to end a
configuration's ramp: in 20261203-004853 the SLO config of `tiny` (SLO 21 ms) answered 2,986 of
3,573 and 2,274 of 4,466 requests/s at p99 34 and 28 ms with the host taking 12.1 and 29.2 %, so it
"held" its SLO up to 0.29 of R*, and then answered 98.4 % at p99 16 ms at 0.9 x R* (7,503/s) with 0 %
taken; `b8_w0` kept up at both rates with 0 and 1.3 % taken. And who used
the cores: the server's CPU time and the load generator's, in cores, and the share of the machine's
CPU time not idle (``loadgen.busy_share``), each over the whole step, its warmup and the wait for the
last answers included. On a machine the client shares with the server, an overload
step is the whole machine's: with `tiny` at twice what it sustains on two cores, the server used 0.95
of a core, the load generator 0.99 and the machine was 97 % busy, so the event loop lost its core now
and then to the client, and a request that arrived then waited for it to come back.

And what a request cost the server: its CPU time over the step divided by the requests it answered or
refused (``server us/request``). The overload target shows it beside the one at ``TARGET_SHARE`` x R*.
Refusing is cheaper than answering, but not free: when the refusals alone, at the overload's rate, take
the whole core the event loop can use, requests wait in their sockets and the refusals come back late
whatever admission decides (`tiny` on one VM: 55 us a request at 2x, about 140 at 0.8 x R*;
docs/batching.md).

Prints the targets and a table, returns them for run.py's report, and draws p99 and throughput against
offered load (PNG).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import loadgen  # noqa: E402
import run  # noqa: E402  (the shared helpers of bench/run.py)

SLO_FACTOR = 30  # each model's p99 objective: this many times its single-request latency here
# The single-request latency is the lowest p50 of this many runs: a run that meets a busy host reads
# high, and the SLO and every target after it move with it (20261203: one probe read `tiny` at 0.647
# ms where the probes before and after it read 0.216-0.226, and set an SLO of 19 ms instead of about 7)
PROBE_RUNS = 3
FRESH_RUNS = 3
FIXED = ((1, 0.0), (8, 0.0), (8, 2.0), (32, 2.0), (32, 8.0))  # (max_batch_size, batch_timeout_millis)
RAMP = (0.2, 0.4, 0.6, 0.75, 0.85, 0.95, 1.05, 1.2, 1.4)  # x the probe's closed-loop capacity
KEEPS_UP = 0.95  # answered share of the offered rate that counts as keeping up
STEAL_LIMIT_PCT = 5.0  # of the machine's CPU time taken by the hypervisor: above it, a step is run again
HOST_TRIES = 3  # runs of a step in all while the hypervisor takes over STEAL_LIMIT_PCT % (the client: 2)
TARGET_SHARE = 0.9  # of R*: up to where the SLO config must hold its SLO (issue 12's target)
MODELS = ("tiny", "cnn")
INPROCESS_S = 2.0  # each in-process measurement beside the server's cnn c=8 run (``light_load``)
AFTER_S = 1.0  # the pause between the overload step and the check that the server answers again
# the priorities step: of the overload's 2 x R*, this share of R* at priority 1, the rest at priority 2
PRIORITY_SHARE = 0.1


@dataclass
class RampPoint:
    model: str
    config: str
    offered: float
    goodput: float
    p50_ms: float
    p99_ms: float
    refused: int
    refused_p99_ms: float
    errors: int  # the server's: connections lost, answers missing or other than 200/429/503/504
    client_late_p99_ms: float
    not_sent: int = 0  # requests the client could not send: over its own in-flight cap (loadgen.MAX_OPEN)
    at_target: bool = False  # the SLO config's step at TARGET_SHARE x R*, after the ramp
    client_behind: bool = False  # the client fell behind by more than the SLO: repeated, not counted
    host_took: bool = False  # the hypervisor took more than STEAL_LIMIT_PCT %: repeated, not counted
    refused_after_send_p99_ms: float = float("nan")  # from when the client sent them (not when due)
    client_write_p99_ms: float = float("nan")  # the client's own write of a request (loadgen)
    host_steal_pct: float = float("nan")  # of the machine's CPU time, taken by the hypervisor (loadgen)
    host_busy_pct: float = float("nan")  # of the machine's CPU time, spent by anyone (loadgen)
    server_cores: float = float("nan")  # the server's CPU time over the step, in cores
    client_cores: float = float("nan")  # the load generator's, in cores
    server_us_per_request: float = float("nan")  # the server's CPU time per request it answered or refused
    confirms: float | None = None  # a repeat of the ramp step at this rate, before R* is taken from it

    def repeated(self) -> bool:
        """Whether the step measured something other than the server, and was run again (not counted)."""
        return self.client_behind or self.host_took

    def keeps_up(self) -> bool:
        return self.goodput >= KEEPS_UP * self.offered and self.errors == 0

    def holds(self, slo_ms: float) -> bool:
        return self.keeps_up() and self.p99_ms <= slo_ms


def model_config(path: Path, max_batch: int, wait_ms: float | None, slo_ms: float | None) -> dict:
    config: dict = {
        "model_path": str(path),
        "backend_config": {"intra_op_num_threads": 1, "inter_op_num_threads": 1},
        "max_batch_size": max_batch,
        "max_queue_size": 1024,
    }
    if wait_ms is not None:
        config["batch_timeout_ms"] = wait_ms
    if slo_ms is not None:
        config["slo"] = {"p99_ms": slo_ms}
    return config


def plain(path: Path, slo_ms: float) -> dict:
    """The config a user writes without tuning (issue 12), plus the SLO."""
    return model_config(path, 32, 2.0, slo_ms)


def fixed_name(model: str, max_batch: int, wait_ms: float) -> str:
    return f"{model}_b{max_batch}_w{wait_ms:g}"


def start(models: dict[str, dict], name: str) -> run.Process:
    config = {"models": models, "logging": {"level": "WARNING"}}
    path = run.WORK / f"{name}.yaml"
    path.write_text(json.dumps(config))
    return run.edgeinfer_process(path, 1)


def wrk_p50_and_rate(
    server: run.Process, model: str, concurrency: int, seconds: float
) -> tuple[float, float]:
    body = run.json_body(model.split("_")[0])
    result = run.wrk(server.port, f"/v2/models/{model}/infer", body, concurrency, seconds, False)
    return result["p50_us"] / 1000, result["requests"] / (result["duration_us"] / 1e6)


def probe(paths: dict[str, Path]) -> dict[str, dict[str, float]]:
    server = start({model: model_config(paths[model], 1, 0.0, None) for model in MODELS}, "slo-probe")
    found = {}
    try:
        for model in MODELS:
            wrk_p50_and_rate(server, model, 1, 1)  # warm
            p50_ms = min(wrk_p50_and_rate(server, model, 1, 2)[0] for _ in range(PROBE_RUNS))
            _, capacity = wrk_p50_and_rate(server, model, 32, 3)
            slo_ms = float(f"{SLO_FACTOR * p50_ms:.2g}")
            found[model] = {"p50_ms": p50_ms, "capacity": capacity, "slo_ms": slo_ms}
            print(
                f"probe {model}: c=1 p50 {p50_ms:.3f} ms, capacity {capacity:,.0f} req/s "
                f"-> SLO p99 {slo_ms:g} ms"
            )
    finally:
        server.stop()
    return found


def c1_run(server: run.Process, seconds: float) -> dict[str, float]:
    """``tiny`` over JSON at concurrency 1: the p50, and beside it the server's CPU time a request and the
    host's steal over the run. On this host a process's c=1 p50 reads either of two levels, and in the
    slow one the same requests took the server about 1.5 times the CPU time (`tiny` on 20261203, fresh
    servers, two-second runs: 400-441 us a request at p50 0.63-0.67 ms, against 269 at 0.26 ms), which
    says that the host's state, not the request path, set it."""
    ticks, cpu_s = loadgen.cpu_times(), server.cpu_s()
    result = run.wrk(server.port, "/v2/models/tiny/infer", run.json_body("tiny"), 1, seconds, False)
    used_s, steal = server.cpu_s() - cpu_s, loadgen.steal_share(ticks, loadgen.cpu_times())
    return {
        "p50_ms": result["p50_us"] / 1000,
        "us_per_request": round(used_s / result["requests"] * 1e6, 1) if result["requests"] else math.nan,
        "host_steal_pct": round(steal * 100, 1),
    }


def c1_pair(path: Path, slo_ms: float, fastapi: run.Process, seconds: float, name: str) -> dict:
    """``c1_run`` on a fresh server with the plain config, then on the FastAPI endpoint, and the ratio."""
    server = start({"tiny": plain(path, slo_ms)}, name)
    try:
        ours = c1_run(server, seconds)
    finally:
        server.stop()
    theirs = c1_run(fastapi, seconds)
    return (
        {"ratio": round(ours["p50_ms"] / theirs["p50_ms"], 3)}
        | {f"edgeinfer_{key}": value for key, value in ours.items()}
        | {f"fastapi_{key}": value for key, value in theirs.items()}
    )


def c1_steal_pct(entry: dict) -> float:
    """The host's steal over a ``c1_pair``: the larger of its two runs' (either can be disturbed)."""
    return max(entry.get("edgeinfer_host_steal_pct", 0.0), entry.get("fastapi_host_steal_pct", 0.0))


def light_load(paths: dict[str, Path], slos: dict[str, float], seconds: float) -> dict:
    """c=1 on tiny from fresh processes against FastAPI, and cnn JSON c=8, all with the plain config.
    In-process ONNX Runtime is measured just before and just after the server's c=8 run, and the ratio
    taken against the mean of the two: the speed of this VM drifts over minutes (one reference run
    had `cnn` at 105 images/s over gRPC where the next, on the same code, had 149), and a ratio of two
    rates measured minutes apart measures the drift as well."""
    port = run.free_port()
    fastapi = run.Process(
        "fastapi-slo",
        [sys.executable, str(HERE / "baseline_fastapi.py"), str(port), "1", "loop", f"tiny={paths['tiny']}"],
        port,
    )
    ratios, repeated = [], []
    try:
        for attempt in range(FRESH_RUNS):
            for runs in range(1, HOST_TRIES + 1):
                entry = c1_pair(paths["tiny"], slos["tiny"], fastapi, seconds, f"slo-fresh-{attempt}")
                print(
                    f"tiny JSON c=1, fresh process {attempt + 1}: {entry['edgeinfer_p50_ms']:.3f} ms vs "
                    f"FastAPI {entry['fastapi_p50_ms']:.3f} ms (the server's CPU "
                    f"{entry['edgeinfer_us_per_request']:.0f} vs {entry['fastapi_us_per_request']:.0f} us "
                    f"a request, host steal {entry['edgeinfer_host_steal_pct']:g} % and "
                    f"{entry['fastapi_host_steal_pct']:g} %)",
                    flush=True,
                )
                took = c1_steal_pct(entry)
                if not host_took(took) or runs == HOST_TRIES:
                    ratios.append(entry)
                    break
                repeated.append(entry)
                print(f"  (the host took {took:g} % of the CPU: that run measured it; once more)", flush=True)
    finally:
        fastapi.stop()
    server = start({"cnn": plain(paths["cnn"], slos["cnn"])}, "slo-cnn-c8")
    try:
        wrk_p50_and_rate(server, "cnn", 8, 2)  # warm: the cost model learns
        before = run.inprocess(paths["cnn"], "cnn", 1, [1], INPROCESS_S)[1]
        _, rate = wrk_p50_and_rate(server, "cnn", 8, max(seconds, 5))
        after = run.inprocess(paths["cnn"], "cnn", 1, [1], INPROCESS_S)[1]
    finally:
        server.stop()
    inprocess = (before + after) / 2
    print(
        f"cnn JSON c=8, plain config: {rate:.1f} images/s, in-process {inprocess:.1f} "
        f"({before:.1f} just before, {after:.1f} just after)"
    )
    return {
        "tiny_c1": ratios,
        "tiny_c1_repeated": repeated,  # runs in which the host took over STEAL_LIMIT_PCT %: run again
        "cnn_c8_images_per_s": rate,
        "cnn_inprocess_images_per_s": inprocess,
        "cnn_inprocess_before_after": [round(before, 1), round(after, 1)],
    }


def ramp(
    paths: dict[str, Path], found: dict[str, dict[str, float]], step_s: dict[str, float]
) -> tuple[list[RampPoint], dict, dict]:
    models = {}
    for model in MODELS:
        models[f"{model}_slo"] = plain(paths[model], found[model]["slo_ms"])
        for max_batch, wait_ms in FIXED:
            name = fixed_name(model, max_batch, wait_ms)
            models[name] = model_config(paths[model], max_batch, wait_ms, None)
    server = start(models, "slo-ramp")
    points: list[RampPoint] = []
    overload, priorities = {}, {}
    try:
        for model in MODELS:
            body = run.json_body(model).path.read_bytes()
            slo_ms = found[model]["slo_ms"]
            names = [f"{model}_slo", *(fixed_name(model, b, w) for b, w in FIXED)]
            for name in names:
                request = loadgen.http_request(f"/v2/models/{name}/infer", body)
                behind = 0
                for fraction in RAMP:
                    rate = fraction * found[model]["capacity"]
                    point = measure_step(server, model, name, request, rate, step_s[model], slo_ms, points)
                    points.append(point)
                    behind = 0 if point.keeps_up() else behind + 1
                    if behind == 2:
                        break
                time.sleep(1.0)  # what was dropped at the end drains before the next configuration
            sustainable = confirm_sustainable(server, model, body, step_s[model], slo_ms, points)
            if not sustainable:
                sustainable = found[model]["capacity"] * RAMP[0]
            request = loadgen.http_request(f"/v2/models/{model}_slo/infer", body)
            # the target's own rate (see the module's docstring, step 3)
            print(f"  at {TARGET_SHARE:g} x R* ({sustainable:,.1f}/s):", flush=True)
            rate = TARGET_SHARE * sustainable
            point = measure_step(server, model, f"{model}_slo", request, rate, step_s[model], slo_ms, points)
            point.at_target = True
            points.append(point)
            time.sleep(1.0)
            rss_before = server.memory_mib("VmRSS")
            point = measure_step(
                server, model, f"{model}_slo", request, 2 * sustainable, 2 * step_s[model], slo_ms, points
            )
            rss_after = server.memory_mib("VmRSS")
            time.sleep(AFTER_S)  # "after": once the overload's last requests are answered or refused
            alive = run.wrk(server.port, f"/v2/models/{model}_slo/infer", run.json_body(model), 1, 1, False)
            overload[model] = {
                "offered": point.offered,
                "goodput": point.goodput,
                "admitted_p99_ms": point.p99_ms,
                "refused": point.refused,
                "refused_p99_ms": point.refused_p99_ms,
                "refused_after_send_p99_ms": point.refused_after_send_p99_ms,
                "client_late_p99_ms": point.client_late_p99_ms,
                "client_write_p99_ms": point.client_write_p99_ms,
                "server_cores": point.server_cores,
                "client_cores": point.client_cores,
                "host_busy_pct": point.host_busy_pct,
                "server_us_per_request": point.server_us_per_request,
                "errors": point.errors,
                "not_sent": point.not_sent,
                "rss_before_mib": round(rss_before, 1),
                "rss_after_mib": round(rss_after, 1),
                "answers_after": alive["requests"] > 0 and alive["status_errors"] == 0,
            }
            time.sleep(AFTER_S)
            priorities[model] = two_priorities(server, model, body, sustainable, 2 * step_s[model], slo_ms)
    finally:
        server.stop()
    return points, overload, priorities


def two_priorities(
    server: run.Process, model: str, body: bytes, sustainable: float, seconds: float, slo_ms: float
) -> dict:
    """The overload step's 2 x R*, ``PRIORITY_SHARE`` x R* of it at priority 1 and the rest at priority 2,
    each level from its own load generator (``loadgen.run_step``): what each level got. Each generator
    may open up to ``loadgen.MAX_OPEN`` connections: where the server's loop falls far behind, together
    they can hold more than the server takes (``server.limits.max_connections``, 1,024), and the
    connections it turns away count as errors here."""
    plain_body = json.loads(body)
    results: dict[int, loadgen.StepResult] = {}

    def offer(priority: int, rate: float) -> None:
        request = loadgen.http_request(
            f"/v2/models/{model}_slo/infer",
            json.dumps(plain_body | {"parameters": {"priority": priority}}).encode(),
        )
        results[priority] = loadgen.run_step(
            server.port, request, rate, seconds, seed=priority, drain_s=drain_for(slo_ms)
        )

    offers = [
        threading.Thread(target=offer, args=(2, (2 - PRIORITY_SHARE) * sustainable)),
        threading.Thread(target=offer, args=(1, PRIORITY_SHARE * sustainable)),
    ]
    for thread in offers:
        thread.start()
    for thread in offers:
        thread.join()
    found = {}
    for priority, result in sorted(results.items()):
        offered = result.sent / result.seconds
        level = found[f"priority_{priority}"] = {
            "offered": round(offered, 1),
            "answered_share": share(result.goodput, offered, 4),
            "p99_ms": round(result.p(0.99) * 1000, 2),
            "refused": len(result.refused_latency),
            "refused_p99_ms": round(result.p(0.99, refused=True) * 1000, 2),
            "errors": result.errors + result.unanswered,
            "host_steal_pct": round(result.host_steal * 100, 1),
        }
        print(
            f"  {model}_slo at priority {priority}: offered {offered:,.1f}/s, "
            f"answered {result.goodput:,.1f}/s, p99 {level['p99_ms']:.2f} ms, refused {level['refused']} "
            f"(p99 {level['refused_p99_ms']:.2f} ms), host steal {level['host_steal_pct']:g} %",
            flush=True,
        )
    return found


def confirm_sustainable(
    server: run.Process, model: str, body: bytes, seconds: float, slo_ms: float, points: list[RampPoint]
) -> float:
    """R*: the ramp's steps that kept up are repeated from the highest rate down, each added to
    ``points`` (``confirms``), until one keeps up again; 0 if none does (the module's docstring)."""
    candidates = [
        p for p in points if p.model == model and p.keeps_up() and p.confirms is None and not p.repeated()
    ]
    for candidate in sorted(candidates, key=lambda p: -p.offered):
        name = f"{model}_slo" if candidate.config == "slo" else f"{model}_{candidate.config}"
        request = loadgen.http_request(f"/v2/models/{name}/infer", body)
        print(f"  R* candidate {candidate.offered:,.1f}/s ({candidate.config}), once more:", flush=True)
        shown: list[RampPoint] = []
        point = measure_step(server, model, name, request, candidate.offered, seconds, slo_ms, shown)
        for repeat in (*shown, point):
            repeat.confirms = candidate.offered
        points.extend((*shown, point))
        if point.keeps_up():
            return candidate.offered
        time.sleep(1.0)  # what was dropped at the end drains before the next one
    return 0.0


def sustainable_rate(points: list[RampPoint]) -> float:
    """R* from one model's steps: the highest rate whose step kept up and whose repeat kept up too;
    without repeats (none was run), the highest rate a step kept up with."""
    confirmed = [p.confirms for p in points if p.confirms is not None and p.keeps_up()]
    if confirmed:
        return max(confirmed)
    return max((p.offered for p in points if p.keeps_up() and p.confirms is None), default=0.0)


def measure_step(
    server: run.Process,
    model: str,
    name: str,
    request: bytes,
    rate: float,
    seconds: float,
    slo_ms: float,
    shown: list[RampPoint],
) -> RampPoint:
    """One step, run again while it measured something other than the server (``mark_disturbed``; the
    module's docstring): once more if the client fell behind, up to ``HOST_TRIES`` runs in all while
    the host took the CPU. Each run not kept is added to ``shown``, marked; the last counts whatever it
    shows."""
    point = _step(server, model, name, request, rate, seconds, slo_ms)
    for runs in range(1, HOST_TRIES):
        behind, took = disturbed_by(point, slo_ms)
        if not (took or (behind and runs == 1)):
            break
        mark_disturbed(point, slo_ms)
        shown.append(point)
        what = [f"the host took {point.host_steal_pct:g} % of the CPU"] if took else []
        what += ["the client fell behind by more than the SLO"] if behind else []
        print(f"  ({' and '.join(what)}: that step measured it; once more)", flush=True)
        point = _step(server, model, name, request, rate, seconds, slo_ms)
    return point


def mark_disturbed(point: RampPoint, slo_ms: float) -> bool:
    """Mark a step with ``disturbed_by``'s two answers, and return whether it measured the client or
    the host rather than the server."""
    point.client_behind, point.host_took = disturbed_by(point, slo_ms)
    return point.repeated()


def disturbed_by(point: RampPoint, slo_ms: float) -> tuple[bool, bool]:
    """(whether the client fell behind by more than the SLO, ``host_took``)."""
    return point.client_late_p99_ms > slo_ms, host_took(point.host_steal_pct)


def host_took(steal_pct: float) -> bool:
    """Whether a run measured the host's other guests: the hypervisor took more than
    ``STEAL_LIMIT_PCT`` % of the machine's CPU time (never where the kernel does not count it: NaN)."""
    return steal_pct > STEAL_LIMIT_PCT


def _step(
    server: run.Process, model: str, name: str, request: bytes, rate: float, seconds: float, slo_ms: float
) -> RampPoint:
    drain_s = drain_for(slo_ms)
    cpu_before, started = server.cpu_s(), time.perf_counter()
    result = loadgen.run_step(server.port, request, rate, seconds, drain_s=drain_s)
    server_cpu_s = server.cpu_s() - cpu_before
    server_cores = server_cpu_s / (time.perf_counter() - started)
    point = RampPoint(
        model=model,
        config="slo" if name.endswith("_slo") else name[len(model) + 1 :],
        offered=round(result.sent / result.seconds, 1),
        goodput=round(result.goodput, 1),
        p50_ms=round(result.p(0.5) * 1000, 2),
        p99_ms=round(result.p(0.99) * 1000, 2),
        refused=len(result.refused_latency),
        refused_p99_ms=round(result.p(0.99, refused=True) * 1000, 2),
        errors=result.errors + result.unanswered,
        client_late_p99_ms=round(result.client_late_p99_s * 1000, 2),
        not_sent=result.client_overflow,
        refused_after_send_p99_ms=round(result.refused_after_send_p(0.99) * 1000, 2),
        client_write_p99_ms=round(result.client_write_p99_s * 1000, 2),
        host_steal_pct=round(result.host_steal * 100, 1),
        host_busy_pct=round(result.host_busy * 100, 1),
        server_cores=round(server_cores, 2),
        client_cores=round(result.client_cores, 2),
        server_us_per_request=round(server_cpu_s / result.handled * 1e6, 1) if result.handled else math.nan,
    )
    print(
        f"  {name:16} offered {point.offered:8,.1f}/s  answered {point.goodput:8,.1f}/s  "
        f"p50 {point.p50_ms:9.2f}  p99 {point.p99_ms:9.2f} ms  refused {point.refused:5}  "
        f"errors {point.errors}  not sent {point.not_sent}  "
        f"client late p99 {point.client_late_p99_ms:.2f} ms (its writes {point.client_write_p99_ms:.2f})  "
        f"host steal {point.host_steal_pct:g} %  "
        f"{cores_text(point.server_cores, point.client_cores, point.host_busy_pct)}, "
        f"server {point.server_us_per_request:.0f} us a request",
        flush=True,
    )
    return point


def drain_for(slo_ms: float) -> float:
    """How long a step waits for its last answers: four SLOs, within 2-10 s."""
    return min(10.0, max(2.0, 4 * slo_ms / 1000))


def cores_text(server_cores: float, client_cores: float, busy_pct: float) -> str:
    """Who used the cores over a step, as the step's line and the overload target say it."""
    return f"cores: server {server_cores:.2f}, client {client_cores:.2f}, machine busy {busy_pct:g} %"


def targets(
    points: list[RampPoint], found: dict, light: dict, overload: dict, priorities: dict | None = None
) -> dict:
    summary: dict = {}
    worst = max(light["tiny_c1"], key=lambda run_: run_["ratio"])
    summary["tiny_json_c1_p50_vs_fastapi_worst_of_3"] = worst["ratio"]
    summary["tiny_json_c1_p50_vs_fastapi_runs"] = [run_["ratio"] for run_ in light["tiny_c1"]]
    summary["tiny_json_c1_runs_the_host_disturbed"] = len(light.get("tiny_c1_repeated", []))
    summary["tiny_json_c1_counted_though_disturbed"] = [  # the last of HOST_TRIES, counted as it is
        host_took(c1_steal_pct(run_)) for run_ in light["tiny_c1"]
    ]
    summary["cnn_json_c8_vs_inprocess"] = round(
        light["cnn_c8_images_per_s"] / light["cnn_inprocess_images_per_s"], 3
    )
    summary["cnn_json_c8_images_per_s"] = round(light["cnn_c8_images_per_s"], 1)
    summary["cnn_inprocess_before_after"] = light["cnn_inprocess_before_after"]
    for model in MODELS:
        slo_ms = found[model]["slo_ms"]
        mine = [p for p in points if p.model == model and not p.repeated()]
        sustainable = sustainable_rate(mine)
        by_config: dict[str, dict] = {}
        for config in dict.fromkeys(p.config for p in mine):
            steps = steps_of(mine, config)
            held = 0.0
            for p in steps:  # the SLO holds up to the first rate where it does not
                if not p.holds(slo_ms):
                    break
                held = p.offered
            # every run of the configuration counts for its best throughput: its ramp steps, the
            # repeats of R*'s candidates (which a fixed config often answers better the second time)
            # and, for ours, the step at the target's rate
            runs = [p for p in mine if p.config == config]
            best = max((p.goodput for p in runs if p.p99_ms <= slo_ms and p.errors == 0), default=0.0)
            by_config[config] = {"holds_slo_up_to": held, "best_goodput_within_slo": best, "runs": len(runs)}
        fixed = {name: values for name, values in by_config.items() if name != "slo"}
        at_target = next((p for p in mine if p.at_target), None)
        best_fixed = max(fixed, key=lambda name: fixed[name]["best_goodput_within_slo"])
        ours, theirs = by_config["slo"], fixed[best_fixed]
        summary[model] = {
            "slo_p99_ms": slo_ms,
            "sustainable_rate": sustainable,
            "slo_holds_up_to_share_of_sustainable": share(ours["holds_slo_up_to"], sustainable),
            "best_fixed": best_fixed,
            "best_fixed_holds_up_to_share": share(theirs["holds_slo_up_to"], sustainable),
            "at_target": None
            if at_target is None
            else {
                "offered": at_target.offered,
                "answered_share": share(at_target.goodput, at_target.offered, 4),  # 0.9499: not held
                "p99_ms": at_target.p99_ms,
                "holds": at_target.holds(slo_ms),
                "server_us_per_request": at_target.server_us_per_request,
            },
            "throughput_within_slo_vs_best_fixed": share(
                ours["best_goodput_within_slo"], theirs["best_goodput_within_slo"]
            ),
            "configs": by_config,
            "overload_2x": overload.get(model, {}),
            "priorities_2x": (priorities or {}).get(model, {}),
        }
    return summary


def steps_of(points: list[RampPoint], config: str) -> list[RampPoint]:
    """One configuration's steps in order of rate (the step at TARGET_SHARE x R* comes last in time); the
    repeats of R*'s candidates are not steps of the ramp."""
    return sorted((p for p in points if p.config == config and p.confirms is None), key=lambda p: p.offered)


def share(part: float, whole: float, places: int = 3) -> float:
    return round(part / whole, places) if whole else 0.0


def targets_table(summary: dict) -> str:
    lines = ["| target | wanted | measured |", "|---|---|---|"]
    disturbed_still = summary["tiny_json_c1_counted_though_disturbed"]
    runs = ", ".join(
        f"{value:.2f}{'*' if still else ''}"
        for value, still in zip(summary["tiny_json_c1_p50_vs_fastapi_runs"], disturbed_still, strict=True)
    )
    if disturbed := summary["tiny_json_c1_runs_the_host_disturbed"]:
        runs += f"; {disturbed} more run again, the host taking over {STEAL_LIMIT_PCT:g} % of the CPU"
    if any(disturbed_still):
        runs += f"; * its last run still met over {STEAL_LIMIT_PCT:g} %"
    lines.append(
        f"| tiny JSON c=1 p50 / FastAPI p50, worst of {FRESH_RUNS} fresh processes | <= 0.60 | "
        f"{summary['tiny_json_c1_p50_vs_fastapi_worst_of_3']:.2f} ({runs}) |"
    )
    before, after = summary["cnn_inprocess_before_after"]
    lines.append(
        "| cnn JSON c=8 / in-process ONNX Runtime, no tuning | >= 0.85 | "
        f"{summary['cnn_json_c8_vs_inprocess']:.2f} ({summary['cnn_json_c8_images_per_s']:.1f} images/s; "
        f"in-process {before:.1f} just before, {after:.1f} just after) |"
    )
    for model in MODELS:
        entry = summary[model]
        over = entry["overload_2x"]
        target = entry["at_target"]
        at_target = (
            ""
            if target is None
            else f"; at {target['offered']:,.0f}/s ({TARGET_SHARE:g} x R*): "
            f"{'held' if target['holds'] else 'NOT held'}, {target['answered_share']:.2%} answered, "
            f"p99 {target['p99_ms']:.2f} ms"
        )
        lines.append(
            f"| {model}: SLO (p99 {entry['slo_p99_ms']:g} ms) held up to / sustainable rate "
            f"({entry['sustainable_rate']:,.0f}/s) | >= 0.90 | "
            f"{entry['slo_holds_up_to_share_of_sustainable']:.3f} "
            f"(best fixed, {entry['best_fixed']}: {entry['best_fixed_holds_up_to_share']:.3f}){at_target} |"
        )
        runs = {config: values["runs"] for config, values in entry["configs"].items()}
        best = entry["best_fixed"]
        lines.append(
            f"| {model}: throughput within the SLO / best fixed | >= 0.90 | "
            f"{entry['throughput_within_slo_vs_best_fixed']:.2f} (the best of every run: {runs['slo']} of "
            f"the SLO config, {runs[best]} of {best}, {sum(runs.values())} in all) |"
        )
        if over:
            lines.append(
                f"| {model} at 2x ({over['offered']:,.0f}/s): admitted p99 <= SLO; refusals p99 < 5 ms | "
                f"<= {entry['slo_p99_ms']:g} ms; < 5 ms | {over['admitted_p99_ms']:.1f} ms; "
                f"{over['refused_p99_ms']:.1f} ms ({over['refused']} refused; from the client's send "
                f"{over['refused_after_send_p99_ms']:.1f} ms, the client itself late by "
                f"{over['client_late_p99_ms']:.1f} ms, its write of a request taking up to "
                f"{over['client_write_p99_ms']:.2f} ms; "
                f"{cores_text(over['server_cores'], over['client_cores'], over['host_busy_pct'])}; "
                f"the server's CPU {over['server_us_per_request']:.0f} us a request, "
                f"{math.nan if target is None else target['server_us_per_request']:.0f} at "
                f"{TARGET_SHARE:g} x R*; "
                f"{over['errors']} errors, "
                f"{over['not_sent']} not sent by the client, RSS "
                f"{over['rss_before_mib']} -> {over['rss_after_mib']} MiB, answers after: "
                f"{'yes' if over['answers_after'] else 'NO'}) |"
            )
        if levels := entry["priorities_2x"]:
            high, low = levels["priority_1"], levels["priority_2"]
            lines.append(
                f"| {model}: 2x, {PRIORITY_SHARE:g} x R* of it at priority 1 and the rest at 2: priority 1 "
                f"within the SLO | answered, p99 <= {entry['slo_p99_ms']:g} ms | "
                f"{high['answered_share']:.1%} answered of {high['offered']:,.1f}/s, "
                f"p99 {high['p99_ms']:.2f} ms ({high['refused']} refused); "
                f"priority 2: {low['answered_share']:.1%} of {low['offered']:,.1f}/s "
                f"at p99 {low['p99_ms']:.2f} ms, refusals p99 {low['refused_p99_ms']:.1f} ms; "
                f"{high['errors'] + low['errors']} errors |"
            )
    return "\n".join(lines)


def config_label(point: RampPoint) -> str:
    label = f"{point.config} ({TARGET_SHARE:g} x R*)" if point.at_target else point.config
    if point.confirms is not None:
        label = f"{point.config} (R* candidate, once more)"
    if point.client_behind:
        return f"{label} (client behind, repeated)"
    return f"{label} (host took {point.host_steal_pct:g} %, repeated)" if point.host_took else label


def points_table(points: list[RampPoint]) -> str:
    lines = [
        "| model | config | offered/s | answered/s | p50 ms | p99 ms | refused | refusal p99 ms | errors "
        "| not sent | client late p99 ms | host steal % | server cores | client cores | machine busy % "
        "| server us/request |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines.extend(
        f"| {p.model} | {config_label(p)} | {p.offered:,.1f} | {p.goodput:,.1f} | {p.p50_ms:.2f} | "
        f"{p.p99_ms:.2f} | {p.refused} | {p.refused_p99_ms:.2f} | {p.errors} | {p.not_sent} | "
        f"{p.client_late_p99_ms:.2f} | {p.host_steal_pct:g} | {p.server_cores:.2f} | {p.client_cores:.2f} | "
        f"{p.host_busy_pct:g} | {p.server_us_per_request:.0f} |"
        for p in points
    )
    return "\n".join(lines)


def plot(points: list[RampPoint], found: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(MODELS), 2, figsize=(11, 4.2 * len(MODELS)))
    for row, model in enumerate(MODELS):
        latency, throughput = axes[row]
        for config in dict.fromkeys(p.config for p in points if p.model == model):
            steps = steps_of([p for p in points if p.model == model and not p.repeated()], config)
            ours = config == "slo"
            style = {"linewidth": 2.5, "color": "black"} if ours else {"linewidth": 1, "alpha": 0.8}
            label = "adaptive + SLO" if ours else f"fixed {config}"
            offered = [p.offered for p in steps]
            latency.plot(offered, [p.p99_ms for p in steps], marker="o", label=label, **style)
            throughput.plot(offered, [p.goodput for p in steps], marker="o", label=label, **style)
        latency.axhline(found[model]["slo_ms"], color="red", linestyle="--", label="SLO (p99)")
        latency.set_yscale("log")
        latency.set_title(f"{model}: p99 of answered requests")
        latency.set_xlabel("offered load (requests/s, Poisson)")
        latency.set_ylabel("ms")
        throughput.set_title(f"{model}: answered per second (within each step)")
        throughput.set_xlabel("offered load (requests/s, Poisson)")
        throughput.set_ylabel("requests/s")
        latency.legend(fontsize=7)
        latency.grid(True, which="both", alpha=0.3)
        throughput.grid(True, alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)


def measure_all(step_seconds: float, plot_path: Path) -> tuple[dict, str]:
    """Everything above; returns the summary and a Markdown section for the report."""
    run.WORK.mkdir(parents=True, exist_ok=True)
    paths = run.build_models()
    found = probe(paths)
    light = light_load(paths, {model: found[model]["slo_ms"] for model in MODELS}, 3.0)
    points, overload, priorities = ramp(paths, found, {"tiny": step_seconds, "cnn": max(step_seconds, 5.0)})
    summary = targets(points, found, light, overload, priorities)
    plot(points, found, plot_path)
    markdown = (
        "## Latency objective (bench/slo.py)\n\n"
        f"SLOs: {SLO_FACTOR} x each model's c=1 p50 on this machine ("
        + ", ".join(f"{model} p99 {found[model]['slo_ms']:g} ms" for model in MODELS)
        + "). Plain config: `max_batch_size: 32, batch_timeout_millis: 2` plus the SLO; fixed sweep: "
        + ", ".join(f"b{b}/w{w:g}" for b, w in FIXED)
        + f" (max batch / max wait ms). Plot: bench/results/{plot_path.name} (the reference run's is "
        "docs/img/slo-ramp.png).\n\n"
        + targets_table(summary)
        + "\n\nRamp (open-loop Poisson):\n\n"
        + points_table(points)
        + "\n"
    )
    return {"probe": found, "light": light, "targets": summary, "ramp": [vars(p) for p in points]}, markdown


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--step-seconds", type=float, default=3.0, help="per ramp step (cnn: at least 5)")
    parser.add_argument("--plot", type=Path, default=run.RESULTS / "slo-ramp.png")
    args = parser.parse_args()
    for tool in ("wrk",):
        if subprocess.run(["which", tool], capture_output=True).returncode:
            raise SystemExit("wrk is needed: apt-get install wrk (make bench does this)")
    document, markdown = measure_all(args.step_seconds, args.plot)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run.RESULTS.mkdir(parents=True, exist_ok=True)
    (run.RESULTS / f"slo-{stamp}.json").write_text(json.dumps(document, indent=1))
    print("\n" + markdown)
    print(f"wrote {run.RESULTS / f'slo-{stamp}.json'} and {args.plot}")


if __name__ == "__main__":
    main()
