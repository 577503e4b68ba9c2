"""``edgeinfer optimize``: a smaller or faster ONNX model, written only if it still answers like the original.

    edgeinfer optimize MODEL.onnx -o OUT.onnx [--level basic|extended|all] [--fp16 | --int8 dynamic|static]
                       [--calibration DIR] [--samples DIR] [--max-drop 0.01]

1. the variant: ONNX Runtime's offline graph optimization at ``--level`` (``extended`` by default:
   ``all`` adds layout changes only the CPU provider can run, so such a file is for CPU boxes only);
   or, from the original graph (the converters know standard operators, not ONNX Runtime's fused
   ones; the server optimizes the converted graph when it loads it), FP16 (the onnxconverter-common
   converter that ONNX Runtime ships; inputs and outputs stay FP32 unless ``--fp16-io``) or
   INT8 (ONNX Runtime's quantizer: ``dynamic`` quantizes the weights of MatMul and Gemm and computes
   activation scales at run time; ``static`` quantizes every operator it can, with activation scales
   fixed from ``--calibration`` samples, QDQ format);
2. the original and the new model run on the samples (``--samples``, else the calibration samples,
   else synthetic ones: random normal inputs, which say little about accuracy — the report says so);
   per output: the largest absolute difference and the agreement, which is top-1 agreement for a
   classifier-like output (float, last dimension >= 2) and the share of rows within ``--tolerance``
   (relative to the output's range) for any other; and size and time per sample of both;
3. the drop is 1 - the lowest agreement. Above ``--max-drop`` the new model is not written and the
   command fails (exit 1) saying by how much.

Samples are files in a folder: V2 inference requests (``*.json``, as clients send them) or numpy
archives (``*.npz``, one array per input). The pure parts (agreement, the verdict) have unit tests.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.extras import MissingExtra, need
from edgeinfer.optimize_samples import OptimizeError, Sample, load_samples, synthetic_samples

log = logging.getLogger(__name__)

LEVELS = ("disabled", "basic", "extended", "all")


@dataclass(frozen=True, slots=True)
class OutputAgreement:
    output: str
    rows: int
    agreeing: int
    max_abs_diff: float
    kind: str  # "top-1" or "within tolerance"

    @property
    def ratio(self) -> float:
        return self.agreeing / self.rows if self.rows else 1.0


def agreement(
    name: str, reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray], tolerance: float
) -> OutputAgreement:
    """How ``candidate``'s arrays of one output agree with ``reference``'s, row by row (first dimension),
    sample by sample (samples may differ in their other dimensions: a recogniser's sequence length).

    A float output whose last dimension has two or more classes agrees by top-1 along it, at every
    position (a classifier's row; each step of a sequence); any other numeric output when every value
    is within ``tolerance`` of the reference's range; strings when equal.
    """
    refs, news = [np.asarray(a) for a in reference], [np.asarray(a) for a in candidate]
    rows = sum(a.shape[0] if a.ndim else 1 for a in refs)
    if len(news) != len(refs):  # the new model lacks the output
        return OutputAgreement(name, rows, 0, float("inf"), "missing")
    numeric = all(a.dtype.kind in "fiub" for a in (*refs, *news))
    first = refs[0] if refs else np.zeros(0)
    classes = numeric and first.dtype.kind == "f" and first.ndim >= 2 and first.shape[-1] >= 2
    kind = "top-1" if classes else "within tolerance" if numeric else "equal"
    span = max((float(a.max() - a.min()) for a in refs if numeric and a.size), default=0.0)
    allowed = tolerance * (span if span > 0 else 1.0)
    agreeing, diff = 0, 0.0
    for ref, new in zip(refs, news, strict=True):
        count = ref.shape[0] if ref.ndim else 1
        if ref.shape != new.shape:
            diff = float("inf")
            continue
        if not numeric:
            same = np.all((ref == new).reshape(count, -1), axis=1)
        else:
            ref64, new64 = ref.astype(np.float64), new.astype(np.float64)
            diff = max(diff, float(np.max(np.abs(ref64 - new64))) if ref.size else 0.0)
            if classes:
                same = np.all((np.argmax(ref64, -1) == np.argmax(new64, -1)).reshape(count, -1), axis=1)
            else:
                same = np.all((np.abs(ref64 - new64) <= allowed).reshape(count, -1), axis=1)
        agreeing += int(np.sum(same))
    if not numeric and agreeing < rows:
        diff = float("inf")
    return OutputAgreement(name, rows, agreeing, diff, kind)


def drop(agreements: Sequence[OutputAgreement]) -> float:
    """1 - the lowest agreement of any output: what the new model loses on the samples."""
    return 1.0 - min((item.ratio for item in agreements), default=1.0)


def verdict(agreements: Sequence[OutputAgreement], max_drop: float) -> str | None:
    """None when the drop is within ``max_drop``; else why the model is refused."""
    lost = drop(agreements)
    if lost <= max_drop + 1e-9:  # 1 - 196/200 is 0.020000000000000018: exactly at the limit is within
        return None
    worst = min(agreements, key=lambda item: item.ratio)
    return (
        f"{worst.kind} agreement on output {worst.output!r} is {worst.ratio:.2%} "
        f"({worst.agreeing} of {worst.rows} rows): a drop of {lost:.4f}, over --max-drop {max_drop:g} "
        f"by {lost - max_drop:.4f}"
    )


# ---- the steps ----


class Progress:
    """One line per step; on a terminal it counts up in place (``calibrating 37/100``)."""

    def __init__(self, stream: Any = sys.stderr) -> None:
        self._stream = stream
        self._live = bool(getattr(stream, "isatty", lambda: False)())

    def each(self, label: str, items: Sequence[Any]) -> Iterator[Any]:
        total = len(items)
        started = time.perf_counter()
        for index, item in enumerate(items, start=1):
            if self._live:
                self._stream.write(f"\r{label} {index}/{total}")
                self._stream.flush()
            yield item
        end = "\r" if self._live else ""
        self._stream.write(f"{end}{label}: {total} in {time.perf_counter() - started:.1f} s\n")
        self._stream.flush()

    def step(self, label: str) -> None:
        self._stream.write(f"{label}\n")
        self._stream.flush()


def graph_optimized(source: Path, target: Path, level: str) -> None:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = {
        "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    options.optimized_model_filepath = str(target)
    options.log_severity_level = 3
    try:
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ONNX Runtime's own exception types
        raise OptimizeError(f"ONNX Runtime cannot load {source}: {exc}") from None


def to_fp16(source: Path, target: Path, keep_io_types: bool, fp32_tail: int = 0) -> None:
    """ONNX Runtime's copy of onnxconverter-common's converter: onnxconverter-common 1.16 itself names
    two Cast nodes alike when one FP32 input feeds two nodes with ``keep_io_types`` (an invalid model;
    found on a two-head classifier), and the copy has no such bug and no extra dependency.

    ``fp32_tail``: the last operators in graph order (a model's head, nearest the outputs) stay FP32,
    weights included. A detector's head turns features into a map that is then thresholded, and FP16's
    rounding of its weights moves the thresholded boxes: PP-OCRv4's detector read 4.2 % of 240 lines
    differently in FP16, none with its 10-operator head in FP32, for 2 % more bytes (docs/models.md).
    The converter rounds weights held in Constant nodes (Paddle2ONNX writes them so) even for operators
    it is told to leave alone, so those become initializers first; unnamed operators get names, as the
    converter picks operators by name."""
    onnx = need("onnx", "edgeinfer optimize --fp16")
    float16 = need("onnxruntime.transformers.float16", "edgeinfer optimize --fp16")
    convert_float_to_float16 = float16.convert_float_to_float16

    model = onnx.load(str(source))
    keep: list[str] = []
    if fp32_tail > 0:
        _constants_as_initializers(model.graph)
        _name_nodes(model.graph)
        keep = [node.name for node in model.graph.node[-fp32_tail:]]
    model = convert_float_to_float16(model, keep_io_types=keep_io_types, node_block_list=keep)
    onnx.save(model, str(target))


def _constants_as_initializers(graph: Any) -> None:
    """Constant nodes holding a tensor become initializers of the same name (the model is unchanged)."""
    kept = []
    for node in graph.node:
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
            tensor = graph.initializer.add()
            tensor.CopyFrom(node.attribute[0].t)
            tensor.name = node.output[0]
        else:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)


def _name_nodes(graph: Any) -> None:
    """Every operator gets a name of its own (the unnamed and all but the first of a repeated name)."""
    taken: set[str] = set()
    renamed = []
    for index, node in enumerate(graph.node):
        if node.name and node.name not in taken:
            taken.add(node.name)
        else:
            renamed.append((index, node))
    for index, node in renamed:
        name = f"{node.op_type}_{index}"
        while name in taken:
            name += "_"
        node.name = name
        taken.add(name)


@contextlib.contextmanager
def working_folder(folder: Path) -> Iterator[None]:
    """Where ONNX Runtime's symbolic shape inference drops its debugging copy of a graph it could not
    complete ("sym_shape_infer_temp.onnx" and its weights, in the current directory): our scratch
    folder, not the user's. (The command runs alone in its process; nothing else reads relative
    paths meanwhile.)"""
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def to_int8(
    source: Path, target: Path, mode: str, calibration: list[Sample] | None, progress: Progress
) -> None:
    """ONNX Runtime's quantizer, after its pre-processing: shape inference (without the types, the
    quantizer stops with "Unable to find data type") and weights as initializers (exporters such as
    Paddle2ONNX write them as Constant nodes, which the quantizer does not take)."""
    onnx = need("onnx", "edgeinfer optimize --int8")
    q = need("onnxruntime.quantization", "edgeinfer optimize --int8")

    if mode == "static" and not calibration:
        raise OptimizeError("--int8 static needs --calibration DIR (sample requests)")
    prepared = target.with_suffix(".prepared.onnx")
    try:
        with working_folder(target.parent):
            q.quant_pre_process(str(source.absolute()), str(prepared.absolute()))
    except Exception:  # symbolic shape inference gives up on some exported graphs: ONNX's alone then
        try:  # (it still turns Constant-node weights into initializers, which the quantizer needs)
            q.quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        except Exception as exc:  # the quantizer may still manage without it
            log.warning("quantization pre-processing failed (%s); quantizing the model as it is", exc)
            prepared.write_bytes(source.read_bytes())
    # tensors whose type shape inference still cannot name are FP32 (they are, before quantizing)
    extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}
    try:
        if mode == "dynamic":  # MatMul and Gemm only: ONNX Runtime's ConvInteger is slower than its FP32
            # convolution on CPUs (docs/models.md) and, with INT8 weights, wrong on some models
            # (PP-OCRv4's recogniser read nothing but blanks); convolutional models want --int8 static
            q.quantize_dynamic(
                str(prepared), str(target), weight_type=q.QuantType.QInt8, extra_options=extra,
                op_types_to_quantize=["MatMul", "Gemm"],
            )  # fmt: skip
        else:
            samples = calibration or []

            class Reader(q.CalibrationDataReader):  # type: ignore[misc,name-defined]
                def __init__(self) -> None:
                    self._samples = iter(progress.each("calibrating", samples))

                def get_next(self) -> Sample | None:
                    return next(self._samples, None)

            q.quantize_static(
                str(prepared), str(target), Reader(), quant_format=q.QuantFormat.QDQ,
                activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8, extra_options=extra,
            )  # fmt: skip
    except OptimizeError:
        raise
    except Exception as exc:  # the quantizer's own failures: say what failed, not a traceback
        raise OptimizeError(f"INT8 quantization ({mode}) failed: {type(exc).__name__}: {exc}") from None
    finally:
        prepared.unlink(missing_ok=True)


@dataclass(frozen=True, slots=True)
class Measured:
    size_bytes: int
    ms_per_sample: float
    outputs: dict[str, list[np.ndarray]]


def run_all(path: Path, samples: list[Sample], label: str, progress: Progress) -> Measured:
    """Every sample through ``path`` (1 thread, CPU), best of three timed passes after the first."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise OptimizeError(f"ONNX Runtime cannot load the {label} model: {exc}") from None
    names = [arg.name for arg in session.get_outputs()]
    outputs: dict[str, list[np.ndarray]] = {name: [] for name in names}
    try:
        for sample in progress.each(f"running the {label} model", samples):
            for name, array in zip(names, session.run(names, sample), strict=True):
                outputs[name].append(array)
    except Exception as exc:
        raise OptimizeError(f"the {label} model fails on the samples: {exc}") from None
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for sample in samples:
            session.run(names, sample)
        best = min(best, (time.perf_counter() - started) / len(samples))
    return Measured(path.stat().st_size, best * 1000, outputs)


@dataclass
class Report:
    variant: str
    samples: str
    original: Measured
    optimized: Measured
    agreements: list[OutputAgreement]
    refused: str | None

    def table(self) -> str:
        lines = [
            f"variant: {self.variant}; samples: {self.samples}",
            "| model | size MB | ms per sample |",
            "|---|---|---|",
            *(
                f"| {label} | {measured.size_bytes / 1e6:.3f} | {measured.ms_per_sample:.3f} |"
                for label, measured in (("original", self.original), (self.variant, self.optimized))
            ),
            f"size x{self.optimized.size_bytes / self.original.size_bytes:.2f}, "
            f"speed-up x{self.original.ms_per_sample / self.optimized.ms_per_sample:.2f}",
            "| output | agreement | kind | rows | max abs diff |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {item.output} | {item.ratio:.2%} | {item.kind} | {item.rows} | {item.max_abs_diff:.3g} |"
            for item in self.agreements
        ]
        lines.append(f"drop: {drop(self.agreements):.4f}")
        return "\n".join(lines)


def optimize(
    source: Path,
    target: Path,
    level: str = "extended",
    fp16: bool = False,
    fp16_io: bool = False,
    int8: str | None = None,
    fp32_tail: int = 0,
    calibration: Path | None = None,
    samples: Path | None = None,
    max_drop: float = 0.01,
    tolerance: float = 0.01,
    progress: Progress | None = None,
    synthetic_count: int = 32,
) -> Report:
    """Make the variant, compare it with ``source`` and write it to ``target`` unless refused."""
    import onnxruntime as ort

    progress = progress or Progress()
    if fp16 and int8:
        raise OptimizeError("choose --fp16 or --int8, not both")
    if fp32_tail and not fp16:
        raise OptimizeError("--fp16-keep-tail goes with --fp16")
    calibration_samples = load_samples(calibration) if calibration is not None else None
    if samples is not None:
        evaluation, where = load_samples(samples), f"{samples} ({len(os.listdir(samples))} files)"
    elif calibration_samples:
        evaluation, where = calibration_samples, f"the calibration samples ({len(calibration_samples)})"
    else:
        inputs = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).get_inputs()
        evaluation = synthetic_samples(inputs, synthetic_count)
        where = f"{synthetic_count} synthetic (random normal inputs: give --samples for a real check)"
    with tempfile.TemporaryDirectory(prefix="edgeinfer-optimize-") as folder:
        work = Path(folder)
        # FP16 and INT8 convert the original graph: the converters know the standard operators, not the
        # fused ones ONNX Runtime writes (its quantizer fails on those), and the server optimizes the
        # converted graph itself when it loads it
        if fp16:
            variant, current = "fp16", work / "fp16.onnx"
            if fp32_tail:
                variant += f" (the last {fp32_tail} operators FP32)"
            progress.step("converting to FP16")
            to_fp16(source, current, keep_io_types=not fp16_io, fp32_tail=fp32_tail)
        elif int8:
            variant, current = f"int8 {int8}", work / "int8.onnx"
            progress.step(f"quantizing to INT8 ({int8})")
            to_int8(source, current, int8, calibration_samples, progress)
        else:
            variant, current = f"graph {level}", work / "optimized.onnx"
            progress.step(f"graph optimization ({level})")
            graph_optimized(source, current, level)
        original = run_all(source, evaluation, "original", progress)
        optimized = run_all(current, evaluation, "new", progress)
        agreements = [
            agreement(name, original.outputs[name], optimized.outputs.get(name, []), tolerance)
            for name in original.outputs
        ]
        refused = verdict(agreements, max_drop)
        if refused is None:
            temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            temporary.write_bytes(current.read_bytes())
            os.replace(temporary, target)
    return Report(variant, where, original, optimized, agreements, refused)


def main(args: Any, out: Callable[[str], None] = print) -> int:
    """The CLI's entry: 0 written, 1 refused (drop over --max-drop) or failed, 2 bad arguments."""
    source = Path(args.model)
    if not source.is_file():
        print(f"edgeinfer optimize: no such file: {source}", file=sys.stderr)
        return 2
    try:
        report = optimize(
            source, Path(args.output), args.level, args.fp16, args.fp16_io, args.int8,
            args.fp16_keep_tail, Path(args.calibration) if args.calibration else None,
            Path(args.samples) if args.samples else None, args.max_drop, args.tolerance,
        )  # fmt: skip
    except MissingExtra as error:
        print(f"edgeinfer optimize: {error}", file=sys.stderr)
        return 2
    except OptimizeError as error:
        print(f"edgeinfer optimize: {error}", file=sys.stderr)
        return 1
    out(report.table())
    if report.refused is not None:
        print(f"edgeinfer optimize: refused, {args.output} not written: {report.refused}", file=sys.stderr)
        return 1
    out(f"wrote {args.output}")
    return 0
