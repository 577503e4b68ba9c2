"""Canaries that roll themselves forward or back, on the box, from local aggregates only.

``canaries: {resnet: {version: 2, steps: [5, 25, 50, 100], interval_s: 60, min_requests: 200,
max_error_rate: 0.01, max_p99_ms: 80, max_disagreement: 0.02}}`` sends ``steps[i]`` % of ``resnet``'s
traffic to version 2 (a weighted route, ``repository/routes.py``) and the rest to the stable version
(the highest ready other version when it starts, or ``stable:``), and mirrors the stable's requests to
the candidate (a shadow, ``shadow.py``) so that their outputs can be compared on the same inputs.

Every tick (a tenth of the interval, at most a second) the controller reads the server's metrics (with
workers: the supervisor's merge of every worker's, so one decision is made for all) since the step
began, and ``decide`` says what to do:

* a breach rolls back at once, whenever it shows: the candidate's error rate above
  ``max_error_rate`` (with more errors than a whole step of ``min_requests`` may have), its p99 above
  ``max_p99_ms`` (estimated from the latency histogram as Prometheus'
  ``histogram_quantile`` does), or its rows disagreeing with the stable's on more than
  ``max_disagreement`` of the compared rows; all traffic goes to the stable version, the reason is
  recorded, and it does not start again until told;
* a step with fewer than ``min_requests`` candidate requests holds (a quiet box promotes nothing on no
  evidence), however long it lasts;
* otherwise, once ``interval_s`` has passed, it advances; after the last step (100) it is promoted: all
  traffic to the candidate, and the model is reloaded so that its version_policy decides again which
  versions stay (until then the candidate loads besides what the policy chooses: ``held_versions``);
  with ``latest: 1`` that retires the stable version, with ``all`` it stays.

The state (step, status, reason) is kept in ``<cache_dir>/canary-<model>.json``, written atomically at
every change, so a restart resumes where it was (a rolled-back canary stays rolled back).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgeinfer.errors import InvalidInput, ModelNotFound
from edgeinfer.metrics import LATENCY_BUCKETS_S, Snapshot
from edgeinfer.model_config import CanaryConfig
from edgeinfer.repository.registry import version_key

log = logging.getLogger(__name__)

ACTIONS = ("start", "pause", "resume", "promote", "abort")


@dataclass(frozen=True, slots=True)
class Window:
    """One variant's requests since the step began (from two metrics snapshots)."""

    requests: int = 0
    errors: int = 0
    p99_s: float | None = None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True, slots=True)
class Verdict:
    action: str  # hold, advance, promote, rollback
    reason: str = ""


def decide(
    config: CanaryConfig,
    step: int,
    elapsed_s: float,
    candidate: Window,
    stable: Window,
    compared_rows: int,
    disagreeing_rows: int,
) -> Verdict:
    """What a running canary does now (pure)."""
    versus = f"stable: {stable.errors}/{stable.requests} errors, p99 {_ms(stable.p99_s)}"
    # errors beyond what a whole step may have: no later request can make the step healthy enough
    if (
        candidate.error_rate > config.max_error_rate
        and candidate.errors > config.max_error_rate * config.min_requests
    ):
        return Verdict(
            "rollback",
            f"error rate {candidate.error_rate:.2%} ({candidate.errors}/{candidate.requests}) over "
            f"max_error_rate {config.max_error_rate:.2%} ({versus})",
        )
    enough = candidate.requests >= config.min_requests
    slow = (
        config.max_p99_ms is not None
        and candidate.p99_s is not None
        and candidate.p99_s * 1000 > config.max_p99_ms
    )
    if enough and slow:
        return Verdict(
            "rollback", f"p99 {_ms(candidate.p99_s)} over max_p99_ms {config.max_p99_ms:g} ({versus})"
        )
    if config.max_disagreement is not None and compared_rows >= config.min_requests:
        share = disagreeing_rows / compared_rows
        if share > config.max_disagreement:
            return Verdict(
                "rollback",
                f"{share:.2%} of {compared_rows} compared rows disagree with the stable version, over "
                f"max_disagreement {config.max_disagreement:.2%}",
            )
    if not enough:
        return Verdict("hold", f"{candidate.requests} of min_requests {config.min_requests} requests so far")
    if elapsed_s < config.interval_s:
        return Verdict("hold", "the step's interval has not passed")
    if step + 1 >= len(config.steps):
        return Verdict("promote", f"healthy through every step ({versus})")
    return Verdict("advance", f"healthy at {config.steps[step]:g}% ({versus})")


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.1f} ms"


def window(before: Snapshot, now: Snapshot, model: str, version: str) -> Window:
    """The requests of ``model``/``version`` between two snapshots."""
    old, new = _entry(before, model, version), _entry(now, model, version)
    requests = errors = 0
    for protocol, status, count in new.get("requests", []):
        earlier = _count(old, protocol, status)
        if status != "client_error":  # the client's mistakes say nothing about the version
            requests += count - earlier
        if status == "error":
            errors += count - earlier
    counts = _histogram_counts(new)
    if old:
        counts = [a - b for a, b in zip(counts, _histogram_counts(old), strict=True)]
    return Window(requests, errors, _quantile(0.99, counts))


def disagreement(before: Snapshot, now: Snapshot, model: str, candidate: str) -> tuple[int, int]:
    """Rows compared and rows disagreeing (all outputs) of ``model``'s shadow to ``candidate``."""
    key = f"{model}\x00{candidate}"
    old = before.get("shadows", {}).get(key, {}).get("rows", {})
    new = now.get("shadows", {}).get(key, {}).get("rows", {})
    compared = disagreeing = 0
    for output, (agreeing, rows) in new.items():
        was_agreeing, was_rows = old.get(output, (0, 0))
        compared += rows - was_rows
        disagreeing += (rows - agreeing) - (was_rows - was_agreeing)
    return compared, disagreeing


def _entry(snapshot: Snapshot, model: str, version: str) -> dict[str, Any]:
    entry: dict[str, Any] = snapshot.get("models", {}).get(f"{model}\x00{version}", {})
    return entry


def _count(entry: dict[str, Any], protocol: str, status: str) -> int:
    for p, s, count in entry.get("requests", []):
        if p == protocol and s == status:
            return int(count)
    return 0


def _histogram_counts(entry: dict[str, Any]) -> list[int]:
    total = [0] * (len(LATENCY_BUCKETS_S) + 1)
    for histogram in entry.get("duration", {}).values():
        total = [a + b for a, b in zip(total, histogram["counts"], strict=True)]
    return total


def _quantile(q: float, counts: list[int]) -> float | None:
    """Prometheus' ``histogram_quantile``: linear within the bucket the quantile falls in."""
    total = sum(counts)
    if total == 0:
        return None
    cumulative, rank = 0, q * total
    for index, count in enumerate(counts):
        if cumulative + count >= rank and count:
            if index == len(LATENCY_BUCKETS_S):
                return LATENCY_BUCKETS_S[-1]  # beyond the last bound: its bound, as Prometheus does
            low = LATENCY_BUCKETS_S[index - 1] if index else 0.0
            return low + (LATENCY_BUCKETS_S[index] - low) * (rank - cumulative) / count
        cumulative += count
    return LATENCY_BUCKETS_S[-1]


def stable_version(index: list[dict[str, str]], model: str, candidate: str) -> str:
    """The highest READY version of ``model`` other than ``candidate`` (the repository index's)."""
    ready = [
        e["version"]
        for e in index
        if e["name"] == model and e["state"] == "READY" and e["version"] != candidate
    ]
    if not ready:
        raise ModelNotFound(
            f"model {model!r} has no ready version besides the candidate {candidate} to compare with"
        )
    return max(ready, key=version_key)


@dataclass
class CanaryState:
    """What survives a restart (the state file)."""

    model: str
    version: str
    stable: str
    status: str = "running"  # running, paused, promoted, rolled_back, aborted
    step: int = 0
    reason: str = ""
    history: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        self.history.append(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {text}")
        del self.history[:-20]


Apply = Callable[[str, list[dict[str, Any]] | None, dict[str, Any] | None], Awaitable[None]]


def state_path(state_dir: Path, model: str) -> Path:
    return state_dir / f"canary-{model}.json"


def held_versions(configs: Mapping[str, CanaryConfig], state_dir: Path) -> dict[str, str]:
    """Per model, the candidate version that loads besides what its version_policy chooses: every
    configured canary's, until its state file says it was promoted (repository/sources.py). Read by
    every process that loads models (workers too): the state file is the one record they share."""
    held = {}
    for model, config in configs.items():
        try:
            saved = json.loads(state_path(state_dir, model).read_text())
            promoted = saved.get("status") == "promoted" and saved.get("version") == config.version
        except (OSError, ValueError, AttributeError):
            promoted = False  # no canary state yet (or unreadable): it is about to run
        if not promoted:
            held[model] = config.version
    return held


class Canaries:
    """The canaries of one server (the supervisor's, with workers): ticks, decides, applies.

    ``snapshot`` gives the whole server's metrics; ``apply(model, route, shadow)`` sets a model's route
    and shadow everywhere; ``stable_of(model, candidate)`` names the version serving before the canary;
    ``reload(model)`` loads the model again everywhere after a promotion (its version policy then
    decides whether the stable version stays).
    """

    def __init__(
        self,
        configs: Mapping[str, CanaryConfig],
        state_dir: Path,
        snapshot: Callable[[], Awaitable[Snapshot]],
        apply: Apply,
        stable_of: Callable[[str, str], Awaitable[str]],
        reload: Callable[[str], Awaitable[None]],
    ) -> None:
        self._configs = dict(configs)
        self._dir = state_dir
        self._snapshot = snapshot
        self._apply = apply
        self._stable_of = stable_of
        self._reload = reload
        self._states: dict[str, CanaryState] = {}
        self._window_start: dict[str, tuple[float, Snapshot]] = {}
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    @property
    def active(self) -> bool:
        return bool(self._configs)

    async def start(self) -> None:
        """Resume what the state files say, start the configured canaries that have none, tick."""
        for name, config in self._configs.items():
            state = self._load(name, config)
            if state is None:
                try:
                    state = CanaryState(
                        name, config.version, config.stable or await self._stable_of(name, config.version)
                    )
                except ModelNotFound as error:
                    log.error("canary for %s not started: %s", name, error)
                    continue
                state.note(f"started at {config.steps[0]:g}%")
            self._states[name] = state
            await self._enforce(state)
        if self._configs:
            tick = min(1.0, min(config.interval_s for config in self._configs.values()) / 10)
            self._task = asyncio.ensure_future(self._run(tick))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def states(self) -> dict[str, Any]:
        return {name: self._describe(state) for name, state in self._states.items()}

    def _describe(self, state: CanaryState) -> dict[str, Any]:
        config = self._configs[state.model]
        return {
            **asdict(state),
            "share": self._share(state, config),
            "steps": list(config.steps),
        }

    async def act(self, name: str, action: str) -> dict[str, Any]:
        """``start`` (again, after a rollback or abort), ``pause``, ``resume``, ``promote``, ``abort``."""
        if action not in ACTIONS:
            raise InvalidInput(f"unknown canary action {action!r}; use one of {', '.join(ACTIONS)}")
        async with self._lock:
            state = self._states.get(name)
            config = self._configs.get(name)
            if state is None or config is None:
                raise ModelNotFound(f"model {name!r} has no canary (canaries.{name} in the config)")
            if action == "start":
                stable = config.stable or await self._stable_of(name, config.version)
                state.status, state.step, state.reason, state.stable = "running", 0, "", stable
            elif action == "pause" and state.status == "running":
                state.status = "paused"
            elif action == "resume" and state.status == "paused":
                state.status = "running"
            elif action == "promote":
                state.status, state.step = "promoted", len(config.steps) - 1
            elif action == "abort":
                state.status = "aborted"
            else:
                raise InvalidInput(f"the canary of {name!r} is {state.status}: {action} does not apply")
            state.note(f"{action} (by request)")
            await self._enforce(state)
        if action == "promote":
            await self._retire_stable(state)
        return self._describe(state)

    # ---- deciding ----

    async def _run(self, tick: float) -> None:
        while True:
            await asyncio.sleep(tick)
            try:
                await self._check()
            except Exception:  # a failed tick must not end the canaries; the next one tries again
                log.exception("canary check failed")

    async def _check(self) -> None:
        running = [state for state in self._states.values() if state.status == "running"]
        if not running:
            return
        now_snapshot = await self._snapshot()
        now = time.monotonic()
        promoted = []
        async with self._lock:
            for state in running:
                if state.status != "running":
                    continue
                config = self._configs[state.model]
                started, before = self._window_start[state.model]  # set by _enforce at every step
                candidate = window(before, now_snapshot, state.model, state.version)
                stable = window(before, now_snapshot, state.model, state.stable)
                compared, disagreeing = disagreement(
                    before, now_snapshot, state.model, f"{state.model}/{state.version}"
                )
                verdict = decide(config, state.step, now - started, candidate, stable, compared, disagreeing)
                if verdict.action == "hold":
                    continue
                if verdict.action == "rollback":
                    state.status, state.reason = "rolled_back", verdict.reason
                    log.warning(
                        "canary %s version %s rolled back: %s", state.model, state.version, verdict.reason
                    )
                elif verdict.action == "promote":
                    state.status, state.reason = "promoted", verdict.reason
                    log.info("canary %s version %s promoted: %s", state.model, state.version, verdict.reason)
                    promoted.append(state)
                else:
                    state.step += 1
                    log.info(
                        "canary %s version %s advances to %g%%: %s",
                        state.model, state.version, config.steps[state.step], verdict.reason,
                    )  # fmt: skip
                state.note(f"{verdict.action}: {verdict.reason}")
                await self._enforce(state, now_snapshot)
        for state in promoted:
            await self._retire_stable(state)

    async def _retire_stable(self, state: CanaryState) -> None:
        """After a promotion (saved: the candidate is no longer held), load the model again, so that
        its version policy decides whether the stable version stays. The route already sends every
        request to the candidate, so nothing is in the way of unloading the stable one."""
        try:
            await self._reload(state.model)
        except Exception as error:  # the promotion stands; the stable version just stays loaded
            log.error("canary %s promoted, but reloading it to retire version %s failed: %s",
                      state.model, state.stable, error)  # fmt: skip
        else:
            state.note(f"reloaded: version {state.stable} stays only if the version policy keeps it")
            self._save(state)

    async def _enforce(self, state: CanaryState, snapshot: Snapshot | None = None) -> None:
        """Route (and shadow) the model as its state says; save the state; a new step's window."""
        config = self._configs[state.model]
        share = self._share(state, config)
        weights = ((state.stable, 100 - share), (state.version, share))
        route: list[dict[str, Any]] = [
            {"version": version, "weight": weight} for version, weight in weights if weight > 0
        ]
        watching = state.status in ("running", "paused") and config.max_disagreement is not None
        shadow = {"version": state.version, "share": config.shadow_share} if watching else None
        await self._apply(state.model, route, shadow)
        self._window_start[state.model] = (time.monotonic(), snapshot or await self._snapshot())
        self._save(state)

    @staticmethod
    def _share(state: CanaryState, config: CanaryConfig) -> float:
        if state.status == "promoted":
            return 100.0
        if state.status in ("rolled_back", "aborted"):
            return 0.0
        return float(config.steps[state.step])

    # ---- the state file ----

    def _path(self, name: str) -> Path:
        return state_path(self._dir, name)

    def _load(self, name: str, config: CanaryConfig) -> CanaryState | None:
        try:
            document = json.loads(self._path(name).read_text())
            state = CanaryState(**document)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            log.error("canary state of %s unreadable (%s); starting afresh", name, exc)
            return None
        if state.version != config.version or state.step >= len(config.steps):
            return None  # another canary now: the old state does not apply
        state.note(f"resumed after a restart ({state.status})")
        return state

    def _save(self, state: CanaryState) -> None:
        """Atomically: a crash leaves the old file or the new one."""
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            temporary = self._path(state.model).with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps(asdict(state), indent=1))
            os.replace(temporary, self._path(state.model))
        except OSError as exc:
            log.error("canary state of %s not saved (it will not survive a restart): %s", state.model, exc)
