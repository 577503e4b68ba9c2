"""The OCR example's pure steps: connected regions, DB boxes, input sizing, CTC decoding."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tests.support import ROOT

sys.path.insert(0, str(ROOT / "examples" / "ocr"))
from steps import ctc_decode, db_boxes, det_input, fitted, label_regions, reading_order


def test_regions_are_8_connected_and_boxed():
    mask = np.zeros((6, 10), bool)
    mask[1, 1:4] = True  # a bar ...
    mask[2, 4] = True  # ... joined diagonally to a dot
    mask[4:6, 7:9] = True  # a separate square
    mask[0, 9] = True  # a lone pixel
    assert sorted(label_regions(mask)) == [(1, 1, 4, 2), (7, 4, 8, 5), (9, 0, 9, 0)]
    u_shape = np.array([[1, 0, 1], [1, 0, 1], [1, 1, 1]], bool)  # two arms met only at the bottom
    assert label_regions(u_shape) == [(0, 0, 2, 2)]
    assert label_regions(np.zeros((3, 3), bool)) == []


def test_db_boxes_keep_confident_regions_unclipped_and_scaled():
    probability = np.zeros((40, 100), np.float32)
    probability[10:20, 10:60] = 0.9  # a line of text
    probability[30:32, 80:82] = 0.9  # too small
    probability[25:35, 5:20] = 0.35  # above the threshold, but not confident enough
    boxes, scores = db_boxes(probability, (80, 200))  # the image is twice the map's size
    assert boxes.shape == (1, 4)
    assert scores[0] > 0.5
    width, height = 51, 11  # dilated by one pixel to the right and down
    distance = width * height * 1.6 / (2 * (width + height))
    expected = [(10 - distance) * 2, (10 - distance) * 2, (61 + distance) * 2, (21 + distance) * 2]
    assert boxes[0].tolist() == pytest.approx(expected, rel=1e-5)


def test_the_detector_input_is_at_most_960_long_in_multiples_of_32():
    image = np.full((100, 300, 3), 255, np.uint8)
    batch = det_input(image)
    assert batch.shape == (1, 3, 96, 288), "small images keep their size (rounded to 32)"
    assert det_input(np.zeros((1500, 3000, 3), np.uint8)).shape == (1, 3, 480, 960)
    assert batch.dtype == np.float32
    assert float(batch.max()) == pytest.approx(1.0)
    assert fitted(image, 48, 320).shape == (3, 48, 320)
    assert np.all(fitted(image, 48, 320)[:, :, 144:] == 0), (
        "3:1 at height 48 is 144 wide; the rest is padding"
    )


def test_ctc_merges_repeats_and_drops_blanks():
    characters = ["blank", "a", "b", " "]
    best = [[1, 1, 0, 1, 2, 2, 0, 3, 2], [0, 0, 0, 0, 0, 0, 0, 0, 0]]
    probabilities = np.zeros((2, 9, 4), np.float32)
    for row, indices in enumerate(best):
        probabilities[row, np.arange(9), indices] = 0.8
    texts, scores = ctc_decode(probabilities, characters)
    assert texts == ["aab b", ""]
    assert scores == [pytest.approx(0.8), 0.0]


def test_reading_order_is_by_line_then_left_to_right():
    boxes = [
        [200, 14, 260, 40],  # line 1, right (its top is a little lower)
        [10, 60, 90, 90],  # line 2
        [10, 16, 150, 44],  # line 1, left
        [100, 58, 180, 92],  # line 2, right
    ]
    assert reading_order(boxes) == [2, 0, 1, 3]


def test_rendering_refuses_to_fall_back_to_another_font(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """The rendered text's expectations are for DejaVu Sans: without it rendering fails, naming the
    package, instead of silently drawing in Pillow's default font."""
    import render

    assert render.FONT.is_file(), "fonts-dejavu-core is installed (make system-packages)"
    monkeypatch.setattr(render, "FONT", tmp_path / "missing.ttf")
    with pytest.raises(FileNotFoundError, match="install Debian's fonts-dejavu-core"):
        render.render(["text"])
