"""``load_model`` and ``warm_up``: the batch policy a version gets from its config and its model, the
warm-up through the version's own runner, and load errors that name what is wrong. Real ONNX Runtime
models and the Python models of tests/python_models."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from edgeinfer.backends import LoadContext
from edgeinfer.errors import ModelLoadError
from edgeinfer.model_config import ModelConfig
from edgeinfer.repository.loader import DEFAULT_MAX_BATCH_SIZE, LoadedModel, WarmupReport, load_model, warm_up
from edgeinfer.repository.sources import ModelSource
from edgeinfer.runners import RunnerSettings
from tests.python_models.models import Doubler, PositiveOnly, RaisesOnZeros
from tests.support import dynamic_model, infer_body, matmul_model


def onnx(path: Path, **config: Any) -> LoadedModel:
    return load_model(ModelSource("m", "1", str(path), ModelConfig(**config)), LoadContext())


def python(model: object, **config: Any) -> LoadedModel:
    config = ModelConfig(backend="python", model_class="tests.python_models.models:Doubler", **config)
    return load_model(ModelSource("p", "1", "", config, instance=model), LoadContext())


def warmed(loaded: LoadedModel) -> WarmupReport:
    """Warm ``loaded`` up through a runner of its own, as the registry does; then free it."""

    async def main() -> WarmupReport:
        backend, policy = loaded.backend, loaded.policy
        runner = backend.runner(RunnerSettings("m-1", batching=policy.max_batch_size > 0))
        try:
            return await warm_up(runner, backend, policy, loaded.source.config.warmup, loaded.source.name)
        finally:
            await runner.close()
            backend.close()

    return asyncio.run(main())


def test_a_batchable_model_gets_the_default_batch_size_and_an_unbatchable_one_none(tmp_path: Path):
    batchable = onnx(matmul_model(tmp_path / "m.onnx"))
    assert batchable.policy.max_batch_size == DEFAULT_MAX_BATCH_SIZE
    assert batchable.local_path == str(tmp_path / "m.onnx")
    assert batchable.load_s > 0
    fixed = onnx(matmul_model(tmp_path / "fixed.onnx", fixed_batch=2))
    assert fixed.policy.max_batch_size == 0, "no dynamic first dimension: no batching"
    for loaded in (batchable, fixed):
        loaded.backend.close()


def test_the_batch_policy_takes_the_configured_size_delay_and_only_preferred_sizes_that_fit(tmp_path: Path):
    loaded = onnx(
        matmul_model(tmp_path / "m.onnx"),
        max_batch_size=4,
        batch_timeout_ms=2.5,
        preferred_batch_sizes=(2, 4, 16),
    )
    policy = loaded.policy
    assert policy.max_batch_size == 4
    assert policy.max_queue_delay_s == pytest.approx(0.0025)
    assert policy.adaptive is False, "a batch timeout: fixed batching"
    assert policy.preferred_batch_sizes == (2, 4), "16 is over max_batch_size"
    loaded.backend.close()
    unbatched = onnx(matmul_model(tmp_path / "m.onnx"), max_batch_size=0)
    assert (unbatched.policy.max_batch_size, unbatched.policy.max_queue_delay_s) == (0, 0.0)
    assert unbatched.policy.adaptive is True, "no batch timeout: adaptive batching"
    unbatched.backend.close()


def test_batching_a_model_without_a_dynamic_first_dimension_fails_naming_its_tensors(tmp_path: Path):
    path = matmul_model(tmp_path / "fixed.onnx", fixed_batch=2)
    with pytest.raises(ModelLoadError) as raised:
        onnx(path, max_batch_size=4)
    message = str(raised.value)
    assert "model 'm': max_batch_size 4 needs a dynamic first dimension" in message
    assert "X [2, 16], Y [2, 16]" in message
    assert "set max_batch_size: 0" in message


def test_a_file_onnx_runtime_cannot_load_is_named_in_the_error(tmp_path: Path):
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match=r"ONNX Runtime cannot load .*broken\.onnx"):
        onnx(tmp_path / "broken.onnx")
    with pytest.raises(ModelLoadError, match=r"ONNX Runtime cannot load .*absent\.onnx"):
        onnx(tmp_path / "absent.onnx")


def test_warm_up_runs_zeros_at_one_and_the_largest_batch_then_every_sample(tmp_path: Path):
    sample = tmp_path / "sample.json"
    sample.write_bytes(orjson.dumps(infer_body({"X": np.ones((3, 16), np.float32)})))
    report = warmed(onnx(matmul_model(tmp_path / "m.onnx"), warmup={"samples": [str(sample)]}))
    assert (report.synthetic, report.samples, report.unwarmed) == (2, 1, 0)
    assert report.seconds > 0
    chosen = warmed(onnx(matmul_model(tmp_path / "m.onnx"), warmup={"batch_sizes": [2, 3, 5]}))
    assert chosen.synthetic == 3
    assert warmed(onnx(matmul_model(tmp_path / "m.onnx"), warmup={"batch_sizes": []})).synthetic == 0
    disabled = warmed(onnx(matmul_model(tmp_path / "m.onnx"), warmup={"enabled": False}))
    assert disabled == WarmupReport(0, 0, 0.0)


def test_an_input_with_dynamic_dimensions_is_warmed_only_with_a_configured_shape(tmp_path: Path):
    path = dynamic_model(tmp_path / "dynamic.onnx")
    assert warmed(onnx(path)).synthetic == 0, "X [batch, n]: no guess at n"
    assert warmed(onnx(path, warmup={"shapes": {"X": [7]}})).synthetic == 2
    with pytest.raises(ModelLoadError, match=r"warmup shape \[7, 1\] for input 'X' does not fit its shape"):
        warmed(onnx(path, warmup={"shapes": {"X": [7, 1]}}))


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (None, "cannot be read"),
        (b"{not json", "is not a valid V2 request"),
        (orjson.dumps(infer_body({"X": np.ones((1, 3), np.float32)})), "does not fit the model"),
    ],
    ids=["missing", "not-json", "wrong-shape"],
)
def test_a_warmup_sample_that_cannot_be_used_fails_the_load_naming_the_file(
    tmp_path: Path, content: bytes | None, error: str
):
    sample = tmp_path / "sample.json"
    if content is not None:
        sample.write_bytes(content)
    with pytest.raises(ModelLoadError, match=f"warmup sample {sample} {error}"):
        warmed(onnx(matmul_model(tmp_path / "m.onnx"), warmup={"samples": [str(sample)]}))


def test_a_model_whose_own_code_raises_on_the_zeros_fails_its_load():
    with pytest.raises(
        ModelLoadError, match="warmup failed at batch size 1: ValueError: a bug, not a bad request"
    ):
        warmed(python(RaisesOnZeros()))


def test_a_model_that_refuses_the_zeros_as_a_bad_request_still_loads(caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.WARNING, logger="edgeinfer.repository.loader"):
        report = warmed(python(PositiveOnly()))
    assert (report.synthetic, report.unwarmed) == (2, 0), "it ran: it refused them"
    warnings = [r.getMessage() for r in caplog.records if r.name == "edgeinfer.repository.loader"]
    assert any("model 'p'" in line and "x must be positive" in line for line in warnings), warnings


def test_a_python_model_given_as_an_object_is_served_as_it_is():
    model = Doubler(factor=5)
    loaded = python(model, max_batch_size=2)
    assert loaded.local_path == ""
    assert loaded.policy.max_batch_size == 2
    assert [spec.name for spec in loaded.backend.inputs] == ["x"]
    assert warmed(loaded).synthetic == 2
    assert model.factor == 5.0, "the object given was loaded, not a new one"
