"""Pipelines (ensembles): a model made of other models, wired as a DAG in the config.

    models:
      digits_pipeline:
        backend: pipeline
        pipeline:
          inputs:  [{name: IMAGE, datatype: BYTES, shape: [-1]}]
          outputs: [{name: LABELS, datatype: BYTES, shape: [-1, 3], from: post.LABELS}]
          steps:
            - {name: pre,      model: preprocess, inputs: {IMAGE: IMAGE}}
            - {name: classify, model: digits,     inputs: {input: pre.PIXELS}}
            - {name: post,     model: topk,       inputs: {LOGITS: classify.logits}}

Each step is an ordinary inference request to its model, through that model's own queue and batcher,
so pipeline traffic and direct traffic to a step model batch together. A step starts as soon as the
tensors it needs exist, so independent steps run concurrently. An error names the step and its model
and keeps its kind (a bad input stays a 400).

Each step's time (its own request, from sending to answer; not the wait for the steps before it) goes
to ``LoadContext.observe_step``: the server keeps it per pipeline and step as a histogram, and counts
the runs over the step's ``budget_ms``; the pipeline request's access-log line lists every step's time
(``steps_ms``), and each step request is an access-log line of its own (id ``<request id>/<step>``).
With tracing on, each step request is a span (``step <name>``) under the pipeline request's span: the
batcher lends the request's span to the pipeline in its ``Work``, and the pipeline passes it on.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import numpy as np

from edgeinfer.backends import LoadContext, StepObserver, StepRunner, ignore_step
from edgeinfer.errors import EdgeInferError, InferenceFailed, ModelLoadError
from edgeinfer.model_config import ModelConfig, PipelineConfig
from edgeinfer.protocol.types import InferRequest, TensorSpec
from edgeinfer.runners import Result, Runner, RunnerSettings, Tensors, Work
from edgeinfer.runners.coroutine import AsyncRunner

# A pipeline request mostly waits for its steps: many run at once, on the event loop.
MIN_CONCURRENT_REQUESTS = 1024


class PipelineBackend:
    """A Backend whose batches run the DAG for every request concurrently (on the event loop)."""

    platform = "ensemble"
    config_platform = "ensemble"
    config_backend = ""
    execution_provider = "pipeline"
    warmup_applies = False  # its steps are warmed up as the models they are
    ep_coverage: Mapping[str, float] = MappingProxyType({})  # no execution providers

    def __init__(
        self,
        name: str,
        config: PipelineConfig,
        run_step: StepRunner | None,
        observe_step: StepObserver = ignore_step,
    ) -> None:
        self.name = name
        self.config = config
        self.inputs = tuple(TensorSpec(t.name, t.datatype, t.shape) for t in config.inputs)
        self.outputs = tuple(TensorSpec(t.name, t.datatype, t.shape) for t in config.outputs)
        self._run_step = run_step
        self._observe_step = observe_step
        _check_wiring(name, config)

    def runner(self, settings: RunnerSettings) -> Runner:
        concurrency = max(settings.concurrency, MIN_CONCURRENT_REQUESTS)
        return AsyncRunner(self.execute, replace(settings, concurrency=concurrency, prefetch=0))

    async def execute(self, batch: list[Work]) -> list[Result]:
        runs = (self._run(work) for work in batch)
        results = await asyncio.gather(*runs, return_exceptions=True)
        return list(results)

    async def _run(self, work: Work) -> Tensors:
        parameters, request_id, steps = work.parameters, work.request_id, work.steps
        if self._run_step is None:
            raise InferenceFailed(f"pipeline {self.name!r} is not connected to its models")
        send, observe = self._run_step, self._observe_step
        values: dict[str, np.ndarray] = dict(work.inputs)
        done: dict[str, asyncio.Future[None]] = {}

        async def run_step(step: Any) -> None:
            needed = {source.split(".", 1)[0] for source in step.inputs.values() if "." in source}
            await asyncio.gather(*(done[other] for other in needed))
            request = InferRequest(
                inputs={name: values[source] for name, source in step.inputs.items()},
                id=f"{request_id}/{step.name}" if request_id else None,
                parameters={
                    key: value for key, value in parameters.items() if key in ("timeout", "priority")
                },
            )
            started = time.perf_counter()
            try:
                outputs = await send(step.model, step.version, request, step.name, work.span)
            except EdgeInferError as error:
                raise type(error)(
                    f"pipeline {self.name!r} step {step.name!r} (model {step.model!r}): {error}"
                ) from None
            seconds = time.perf_counter() - started
            over = step.budget_ms is not None and seconds * 1000 > step.budget_ms
            observe(self.name, step.name, step.model, seconds, over)
            if steps is not None:
                steps[step.name] = seconds
            for output_name, array in outputs.items():
                values[f"{step.name}.{output_name}"] = array

        loop = asyncio.get_running_loop()
        for step in self.config.steps:
            done[step.name] = loop.create_future()
        tasks = []
        for step in self.config.steps:
            task = asyncio.ensure_future(run_step(step))
            task.add_done_callback(functools.partial(_settle, done[step.name]))
            tasks.append(task)
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
        return {output.name: values[output.source] for output in self.config.outputs if output.source}

    def inspect(self) -> dict[str, Any]:
        return {"steps": [step.model for step in self.config.steps]}

    def close(self) -> None:
        self._run_step = None


def _settle(future: asyncio.Future[None], task: asyncio.Task[None]) -> None:
    if future.done():
        return
    if task.cancelled():
        future.cancel()
    elif task.exception() is not None:
        future.set_exception(task.exception())  # type: ignore[arg-type]
        future.exception()  # the gather in _run reports it; do not warn again here
    else:
        future.set_result(None)


def _check_wiring(name: str, config: PipelineConfig) -> None:
    """Every step input and pipeline output names something that exists, and there is no cycle."""
    steps = {step.name: step for step in config.steps}
    if len(steps) != len(config.steps):
        raise ModelLoadError(f"pipeline {name!r}: step names must be unique")
    pipeline_inputs = {tensor.name for tensor in config.inputs}
    for step in config.steps:
        for input_name, source in step.inputs.items():
            if "." in source:
                other = source.split(".", 1)[0]
                if other not in steps:
                    raise ModelLoadError(
                        f"pipeline {name!r} step {step.name!r}: input {input_name!r} comes from unknown "
                        f"step {other!r}"
                    )
            elif source not in pipeline_inputs:
                raise ModelLoadError(
                    f"pipeline {name!r} step {step.name!r}: input {input_name!r} comes from {source!r}, "
                    f"which is neither a pipeline input ({', '.join(sorted(pipeline_inputs))}) "
                    "nor 'step.output'"
                )
    for output in config.outputs:
        if not output.source or output.source.split(".", 1)[0] not in steps:
            raise ModelLoadError(f"pipeline {name!r}: output {output.name!r} needs from: 'step.output'")
    visiting: set[str] = set()
    finished: set[str] = set()

    def visit(step_name: str) -> None:
        if step_name in finished:
            return
        if step_name in visiting:
            raise ModelLoadError(
                f"pipeline {name!r}: steps depend on each other in a cycle through {step_name!r}"
            )
        visiting.add(step_name)
        for source in steps[step_name].inputs.values():
            if "." in source:
                visit(source.split(".", 1)[0])
        visiting.discard(step_name)
        finished.add(step_name)

    for step_name in steps:
        visit(step_name)


def load(path: str, config: ModelConfig, name: str, context: LoadContext) -> PipelineBackend:
    assert config.pipeline is not None
    return PipelineBackend(name, config.pipeline, context.run_step, context.observe_step)
