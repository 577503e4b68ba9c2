"""A pipeline's wiring is checked when it loads: every step input and output names something that exists,
step names are unique, and no steps depend on each other in a cycle."""

from __future__ import annotations

import pytest

from edgeinfer.backends.pipeline import PipelineBackend
from edgeinfer.errors import ModelLoadError
from edgeinfer.model_config import PipelineConfig

IO = {
    "inputs": [{"name": "IN", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "OUT", "datatype": "FP32", "shape": [-1, 4], "from": "b.y"}],
}


def wiring(*steps: dict) -> PipelineConfig:
    return PipelineConfig.model_validate({**IO, "steps": list(steps)})


def test_a_well_wired_pipeline_loads():
    config = wiring(
        {"name": "a", "model": "m", "inputs": {"x": "IN"}},
        {"name": "b", "model": "m", "inputs": {"x": "a.y"}},
    )
    backend = PipelineBackend("p", config, None)
    assert [spec.name for spec in backend.outputs] == ["OUT"]


@pytest.mark.parametrize(
    ("steps", "words"),
    [
        (
            [
                {"name": "a", "model": "m", "inputs": {"x": "b.y"}},
                {"name": "b", "model": "m", "inputs": {"x": "a.y"}},
            ],
            "steps depend on each other in a cycle through 'a'",
        ),
        ([{"name": "b", "model": "m", "inputs": {"x": "b.y"}}], "in a cycle through 'b'"),
        (
            [{"name": "b", "model": "m", "inputs": {"x": "ghost.y"}}],
            "input 'x' comes from unknown step 'ghost'",
        ),
        (
            [
                {"name": "b", "model": "m", "inputs": {"x": "IN"}},
                {"name": "b", "model": "n", "inputs": {"x": "IN"}},
            ],
            "step names must be unique",
        ),
        ([{"name": "b", "model": "m", "inputs": {"x": "NOPE"}}], "which is neither a pipeline input (IN)"),
        ([{"name": "a", "model": "m", "inputs": {"x": "IN"}}], "output 'OUT' needs from: 'step.output'"),
    ],
    ids=["cycle", "self", "unknown step", "duplicate", "unknown input", "output from nowhere"],
)
def test_bad_wiring_is_refused_with_what_is_wrong(steps, words):
    with pytest.raises(ModelLoadError) as caught:
        PipelineBackend("p", wiring(*steps), None)
    assert words in str(caught.value)
    assert str(caught.value).startswith("pipeline 'p'")
