"""The Python steps of the OCR pipeline (examples/ocr/config.yaml): PaddleOCR's PP-OCRv4 as a server pipeline.

IMAGE (PNG/JPEG bytes) -> ocr_pre: RGB->BGR, a single line letterboxed, the long side at most 960
                          (sides in multiples of 32), normalised
                       -> ocr_det (ONNX): text probability map
                       -> ocr_boxes: DB post-processing: threshold, dilate, connected regions, score,
                          unclip -> text boxes in image coordinates, and each box's crop for the classifier
                       -> ocr_cls (ONNX): is the line upside down?
                       -> ocr_crops: crops (turned 180 degrees where the classifier is sure) at the
                          recogniser's height, padded to the widest
                       -> ocr_rec (ONNX): per position, the probability of each of 6,625 characters
                       -> ocr_decode: CTC greedy decoding with the recogniser's character list; texts
                          it is less than 0.5 sure of are dropped with their boxes
                       -> TEXT (one string per box), SCORES, BOXES (x0, y0, x1, y1)

The pre- and post-processing follow rapidocr-onnxruntime 1.4.4's (the package the models come from),
with numpy and Pillow instead of OpenCV: boxes are axis-aligned rectangles (the connected regions'
bounding boxes, unclipped by DB's rule), so a rotated line of text is read from its bounding box.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from pathlib import Path
from typing import TypeAlias

import numpy as np
from PIL import Image, UnidentifiedImageError

import edgeinfer

# PaddleOCR's own detector sizing (det_limit_side_len 960, det_limit_type max): large images are scaled
# down so the long side is 960, small ones are left as they are. rapidocr's (short side up to 736) blew
# rendered text up past what the detector was trained on: lines split into words and 28 of 40 test
# images were read right, against 36 of 40, in a quarter of the time, this way (bench/ocr.py's lines).
DET_LONG_SIDE = 960
MIN_HEIGHT, WIDTH_HEIGHT_RATIO = 30, 8  # a flatter image is letterboxed before detection
THRESH, BOX_THRESH, UNCLIP_RATIO, MIN_SIDE = 0.3, 0.5, 1.6, 3
CLS_SHAPE = (3, 48, 192)
CLS_THRESH = 0.9
REC_HEIGHT, REC_MIN_RATIO = 48, 320 / 48
TEXT_SCORE = 0.5  # a box whose text the recogniser is less sure of is dropped (rapidocr's text_score)
Answer: TypeAlias = "dict[str, np.ndarray] | edgeinfer.ModelError"


def decode_image(blob: bytes) -> np.ndarray:
    """PNG/JPEG bytes (raw, or base64 from JSON clients) -> uint8 [H, W, 3], BGR as PaddleOCR reads."""
    if not blob.startswith((b"\x89PNG", b"\xff\xd8")):
        blob = base64.b64decode(blob, validate=True)
    with Image.open(io.BytesIO(blob)) as image:
        rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)
    return np.ascontiguousarray(rgb[:, :, ::-1])


def _normalise(bgr: np.ndarray) -> np.ndarray:
    """uint8 [H, W, 3] -> float32 [3, H, W] in [-1, 1] (mean 0.5, std 0.5)."""
    return ((bgr.astype(np.float32) / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)


def _resize(bgr: np.ndarray, width: int, height: int) -> np.ndarray:
    image = Image.fromarray(np.ascontiguousarray(bgr))
    return np.asarray(image.resize((max(1, width), max(1, height)), Image.Resampling.BILINEAR))


def letterboxed(bgr: np.ndarray) -> tuple[np.ndarray, int]:
    """A single line of text (flatter than 8:1, or under 30 pixels) padded with black above and below,
    as rapidocr does, so that the detector sees some room around it. The padding's height."""
    height, width = bgr.shape[:2]
    if height > MIN_HEIGHT and width / height <= WIDTH_HEIGHT_RATIO:
        return bgr, 0
    padding = abs(max(int(width / WIDTH_HEIGHT_RATIO), MIN_HEIGHT) * 2 - height) // 2
    return np.pad(bgr, ((padding, padding), (0, 0), (0, 0))), padding


def det_input(bgr: np.ndarray) -> np.ndarray:
    """The detector's input: the long side at most 960, both sides rounded to multiples of 32 (boxes are
    scaled back by the map's size, so the ratio need not be kept exactly)."""
    height, width = bgr.shape[:2]
    ratio = min(1.0, DET_LONG_SIDE / max(height, width))
    new_h = max(32, round(height * ratio / 32) * 32)
    new_w = max(32, round(width * ratio / 32) * 32)
    return _normalise(_resize(bgr, new_w, new_h))[np.newaxis]


def label_regions(mask: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Bounding boxes (x0, y0, x1, y1; inclusive) of the 8-connected regions of a boolean mask.

    Run-length based: each row's runs of True are found with numpy, runs that touch a run of the row
    above (8-connectivity: overlapping or diagonal) are joined with a union-find. Text maps have few
    runs per row, so this is fast without OpenCV or SciPy.
    """
    parent: list[int] = []
    boxes: list[list[int]] = []

    def find(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    previous: list[tuple[int, int, int]] = []  # (start, end, run id) of the row above
    for y, row in enumerate(mask):
        padded = np.concatenate(([False], row, [False]))
        edges = np.flatnonzero(padded[1:] != padded[:-1])
        current = []
        for start, end in zip(edges[::2], edges[1::2] - 1, strict=True):
            run = len(parent)
            parent.append(run)
            boxes.append([int(start), y, int(end), y])
            for above_start, above_end, above in previous:
                if above_start <= end + 1 and above_end >= start - 1:
                    root_a, root_b = find(run), find(above)
                    if root_a != root_b:
                        parent[root_b] = root_a
            current.append((int(start), int(end), run))
        previous = current
    merged: dict[int, list[int]] = {}
    for run, box in enumerate(boxes):
        root = find(run)
        if root not in merged:
            merged[root] = list(box)
        else:
            into = merged[root]
            into[0], into[1] = min(into[0], box[0]), min(into[1], box[1])
            into[2], into[3] = max(into[2], box[2]), max(into[3], box[3])
    return [(box[0], box[1], box[2], box[3]) for box in merged.values()]


def db_boxes(probability: np.ndarray, image_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """DB post-processing of a [H', W'] probability map into boxes of the original image.

    Threshold at 0.3, dilate by one pixel (rapidocr's 2x2 kernel), take each connected region's box,
    keep those whose mean probability inside is at least 0.5, enlarge each side by DB's unclip distance
    (area x 1.6 / perimeter), scale to the image and clip. Sorted top to bottom, then left to right.
    """
    mask = probability > THRESH
    dilated = mask.copy()
    dilated[1:, :] |= mask[:-1, :]  # OpenCV's 2x2 dilation: each region grows a pixel right and down
    dilated[:, 1:] |= mask[:, :-1]
    dilated[1:, 1:] |= mask[:-1, :-1]
    map_h, map_w = probability.shape
    image_h, image_w = image_shape
    boxes, scores = [], []
    for x0, y0, x1, y1 in label_regions(dilated):
        width, height = x1 - x0 + 1, y1 - y0 + 1
        if min(width, height) < MIN_SIDE:
            continue
        score = float(probability[y0 : y1 + 1, x0 : x1 + 1].mean())
        if score < BOX_THRESH:
            continue
        distance = width * height * UNCLIP_RATIO / (2 * (width + height))
        left, top = (x0 - distance) * image_w / map_w, (y0 - distance) * image_h / map_h
        right, bottom = (x1 + 1 + distance) * image_w / map_w, (y1 + 1 + distance) * image_h / map_h
        box = [max(0.0, left), max(0.0, top), min(float(image_w), right), min(float(image_h), bottom)]
        if box[2] - box[0] <= MIN_SIDE or box[3] - box[1] <= MIN_SIDE:
            continue
        boxes.append(box)
        scores.append(score)
    if not boxes:
        return np.zeros((0, 4), np.float32), np.zeros((0,), np.float32)
    order = reading_order(boxes)
    return np.array([boxes[i] for i in order], np.float32), np.array([scores[i] for i in order], np.float32)


def reading_order(boxes: list[list[float]]) -> list[int]:
    """Indices of ``boxes`` top to bottom, and left to right within a line: a box whose vertical middle
    lies within the line's first box joins that line."""
    order = sorted(range(len(boxes)), key=lambda i: boxes[i][1])
    lines: list[list[int]] = []
    for index in order:
        middle = (boxes[index][1] + boxes[index][3]) / 2
        if lines and boxes[lines[-1][0]][1] <= middle <= boxes[lines[-1][0]][3]:
            lines[-1].append(index)
        else:
            lines.append([index])
    return [index for line in lines for index in sorted(line, key=lambda i: boxes[i][0])]


def crop(bgr: np.ndarray, box: np.ndarray) -> np.ndarray:
    x0, y0, x1, y1 = (round(float(value)) for value in box)
    piece = bgr[y0:y1, x0:x1]
    if piece.shape[0] >= 1.5 * piece.shape[1]:  # a vertical line: read it turned, as rapidocr does
        piece = np.rot90(piece)
    return piece


def fitted(piece: np.ndarray, height: int, width: int) -> np.ndarray:
    """A crop at ``height`` keeping its ratio (at most ``width`` wide), normalised, zero-padded to width."""
    h, w = piece.shape[:2]
    resized_w = min(width, math.ceil(height * w / h))
    out = np.zeros((3, height, width), np.float32)
    out[:, :, :resized_w] = _normalise(_resize(piece, resized_w, height))
    return out


def ctc_decode(probabilities: np.ndarray, characters: list[str]) -> tuple[list[str], list[float]]:
    """Greedy CTC: the best class per position, repeats merged, blanks (class 0) dropped."""
    best = probabilities.argmax(axis=2)
    confidence = probabilities.max(axis=2)
    texts, scores = [], []
    for indices, probs in zip(best, confidence, strict=True):
        keep = np.ones(len(indices), bool)
        keep[1:] = indices[1:] != indices[:-1]
        keep &= indices != 0
        texts.append("".join(characters[i] for i in indices[keep]))
        scores.append(float(probs[keep].mean()) if keep.any() else 0.0)
    return texts, scores


def read_characters(path: Path) -> list[str]:
    """The recogniser's classes: blank, the characters of ``keys.txt``, and a space (rapidocr's order)."""
    return ["blank", *path.read_text(encoding="utf-8").splitlines(), " "]


# ---- the pipeline's Python models ----


class OcrPreprocess(edgeinfer.Model):
    """IMAGE bytes -> the detector's input and the image itself (for cropping later)."""

    inputs = [edgeinfer.TensorSpec("IMAGE", "BYTES", (1,))]
    outputs = [
        edgeinfer.TensorSpec("DET_INPUT", "FP32", (1, 3, -1, -1)),
        edgeinfer.TensorSpec("ORIGINAL", "UINT8", (-1, -1, 3)),  # letterboxed
        edgeinfer.TensorSpec("PADDING", "INT64", (2,)),  # the letterbox's height above, the image's height
    ]

    def predict(self, requests: list[edgeinfer.Request]) -> list[Answer]:
        answers: list[Answer] = []
        for request in requests:
            try:
                bgr = decode_image(request.inputs["IMAGE"].reshape(-1)[0])
            except (UnidentifiedImageError, OSError, ValueError, binascii.Error) as exc:
                answers.append(edgeinfer.ModelError(f"IMAGE is not a PNG or JPEG image: {exc}"))
                continue
            boxed, padding = letterboxed(bgr)
            shape = np.array([padding, bgr.shape[0]], np.int64)
            answers.append({"DET_INPUT": det_input(boxed), "ORIGINAL": boxed, "PADDING": shape})
        return answers


class OcrBoxes(edgeinfer.Model):
    """The detector's map -> text boxes and their crops at the classifier's size."""

    inputs = [
        edgeinfer.TensorSpec("MAP", "FP32", (1, 1, -1, -1)),
        edgeinfer.TensorSpec("ORIGINAL", "UINT8", (-1, -1, 3)),
    ]
    outputs = [
        edgeinfer.TensorSpec("BOXES", "FP32", (-1, 4)),
        edgeinfer.TensorSpec("BOX_SCORES", "FP32", (-1,)),
        edgeinfer.TensorSpec("CLS_INPUT", "FP32", (-1, *CLS_SHAPE)),
    ]

    def predict_batch(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        bgr = inputs["ORIGINAL"]
        boxes, scores = db_boxes(inputs["MAP"][0, 0], bgr.shape[:2])
        crops = [fitted(crop(bgr, box), CLS_SHAPE[1], CLS_SHAPE[2]) for box in boxes]
        cls_input = np.stack(crops) if crops else np.zeros((0, *CLS_SHAPE), np.float32)
        return {"BOXES": boxes, "BOX_SCORES": scores, "CLS_INPUT": cls_input}


class OcrCrops(edgeinfer.Model):
    """Direction probabilities -> the crops for the recogniser, turned where a line is upside down."""

    inputs = [
        edgeinfer.TensorSpec("DIRECTION", "FP32", (-1, 2)),
        edgeinfer.TensorSpec("BOXES", "FP32", (-1, 4)),
        edgeinfer.TensorSpec("ORIGINAL", "UINT8", (-1, -1, 3)),
    ]
    outputs = [edgeinfer.TensorSpec("REC_INPUT", "FP32", (-1, 3, REC_HEIGHT, -1))]

    def predict_batch(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        bgr, direction = inputs["ORIGINAL"], inputs["DIRECTION"]
        pieces = []
        for box, probs in zip(inputs["BOXES"], direction, strict=True):
            piece = crop(bgr, box)
            if int(np.argmax(probs)) == 1 and float(np.max(probs)) > CLS_THRESH:  # labels: 0, 180
                piece = np.rot90(piece, 2)
            pieces.append(piece)
        if not pieces:  # the recogniser cannot take zero crops (a Reshape fails): one blank crop,
            # which ocr_decode drops again (it keeps one text per box)
            return {"REC_INPUT": np.zeros((1, 3, REC_HEIGHT, int(REC_HEIGHT * REC_MIN_RATIO)), np.float32)}
        ratio = max(REC_MIN_RATIO, *(piece.shape[1] / piece.shape[0] for piece in pieces))
        width = int(REC_HEIGHT * ratio)
        return {"REC_INPUT": np.stack([fitted(piece, REC_HEIGHT, width) for piece in pieces])}


class OcrDecode(edgeinfer.Model):
    """The recogniser's probabilities -> one string per box and its mean confidence."""

    inputs = [
        edgeinfer.TensorSpec("PROBABILITIES", "FP32", (-1, -1, -1)),
        edgeinfer.TensorSpec("BOXES", "FP32", (-1, 4)),
        edgeinfer.TensorSpec("PADDING", "INT64", (2,)),
    ]
    outputs = [
        edgeinfer.TensorSpec("TEXT", "BYTES", (-1,)),
        edgeinfer.TensorSpec("SCORES", "FP32", (-1,)),
        edgeinfer.TensorSpec("BOXES", "FP32", (-1, 4)),
    ]

    def load(self) -> None:
        keys = Path(self.parameters.get("keys", Path(__file__).with_name("keys.txt")))
        self.characters = read_characters(keys)

    def predict_batch(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        probabilities = inputs["PROBABILITIES"]
        if probabilities.shape[-1] != len(self.characters):
            raise ValueError(
                f"the recogniser has {probabilities.shape[-1]} classes, the character list "
                f"{len(self.characters)}: keys.txt is not this model's"
            )
        boxes = inputs["BOXES"]
        texts, scores = ctc_decode(probabilities[: len(boxes)], self.characters)
        kept = [index for index, score in enumerate(scores) if score >= TEXT_SCORE]
        top, height = (int(value) for value in inputs["PADDING"])
        in_image = boxes[kept].reshape(-1, 4).copy()
        in_image[:, [1, 3]] = np.clip(in_image[:, [1, 3]] - top, 0, height)  # without the letterbox
        return {
            "TEXT": np.array([texts[index].encode() for index in kept], dtype=object),
            "SCORES": np.array([scores[index] for index in kept], np.float32),
            "BOXES": in_image,
        }
