"""The accuracy gate of `edgeinfer optimize`: agreement per output, the drop, and the refusal's words."""

from __future__ import annotations

import numpy as np
import pytest

from edgeinfer.optimize import OutputAgreement, agreement, drop, verdict
from edgeinfer.optimize_samples import OptimizeError, load_samples

LOGITS = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1], [0.2, 0.3, 0.5], [0.4, 0.35, 0.25]], np.float32)


@pytest.mark.parametrize(
    ("candidate", "agreeing", "kind"),
    [
        (LOGITS, 4, "top-1"),
        (LOGITS + 0.01, 4, "top-1"),  # shifted alike: the same classes win
        (LOGITS[:, ::-1].copy(), 1, "top-1"),  # reversed: only the row whose middle class wins agrees
    ],
)
def test_top1_agreement_for_classifier_outputs(candidate, agreeing, kind):
    result = agreement("logits", [LOGITS[:2], LOGITS[2:]], [candidate[:2], candidate[2:]], 0.01)
    assert (result.rows, result.agreeing, result.kind) == (4, agreeing, kind)
    assert result.max_abs_diff == pytest.approx(float(np.max(np.abs(candidate - LOGITS))))


def test_other_outputs_agree_within_a_share_of_their_range():
    scores = [np.array([[0.0], [10.0]]), np.array([[5.0]])]  # range 10: 1 % is 0.1
    close = [np.array([[0.05], [10.09]]), np.array([[4.95]])]
    far = [np.array([[0.05], [10.2]]), np.array([[5.0]])]
    assert agreement("score", scores, close, 0.01).agreeing == 3
    assert agreement("score", scores, far, 0.01).agreeing == 2
    assert agreement("score", scores, far, 0.01).kind == "within tolerance"


def test_shapes_that_differ_or_a_missing_output_agree_nowhere():
    assert agreement("y", [LOGITS], [LOGITS[:, :2]], 0.01).agreeing == 0
    missing = agreement("y", [LOGITS], [], 0.01)
    assert (missing.kind, missing.agreeing, missing.ratio) == ("missing", 0, 0.0)


def test_strings_must_be_equal():
    words = np.array([[b"a"], [b"b"]], dtype=object)
    assert agreement("w", [words], [np.array([[b"a"], [b"c"]], dtype=object)], 0.01).agreeing == 1


def test_the_drop_is_the_worst_output_and_the_refusal_says_by_how_much():
    items = [OutputAgreement("logits", 200, 196, 0.1, "top-1"), OutputAgreement("score", 200, 200, 0.2, "x")]
    assert drop(items) == pytest.approx(0.02)
    assert verdict(items, 0.02) is None
    assert verdict(items, 0.01) == (
        "top-1 agreement on output 'logits' is 98.00% (196 of 200 rows): a drop of 0.0200, over "
        "--max-drop 0.01 by 0.0100"
    )
    assert drop([]) == 0.0


def test_sequences_agree_position_by_position_and_may_differ_in_length_between_samples():
    """A CTC recogniser's [rows, positions, classes]: each sample has its own sequence length."""
    rng = np.random.default_rng(0)
    short, long = rng.random((2, 5, 7)), rng.random((3, 9, 7))
    changed = long.copy()
    changed[1, 4] = changed[1, 4, ::-1]  # one position of one row now has another best class
    result = agreement("probs", [short, long], [short, changed], 0.01)
    assert (result.rows, result.agreeing, result.kind) == (5, 4, "top-1")
    shape_changed = agreement("probs", [short, long], [short, long[:, :8]], 0.01)
    assert (shape_changed.agreeing, shape_changed.max_abs_diff) == (2, float("inf"))


def test_sample_folders_that_cannot_be_read_say_which_file(tmp_path):
    with pytest.raises(OptimizeError) as empty:
        load_samples(tmp_path)
    assert str(empty.value) == f"{tmp_path} has no samples (*.json V2 requests or *.npz arrays)"
    (tmp_path / "a.json").write_text(
        '{"inputs": [{"name": "X", "datatype": "FP32", "shape": [2], "data": [1]}]}'
    )
    with pytest.raises(OptimizeError) as bad:
        load_samples(tmp_path)
    assert str(bad.value) == (
        f"sample {tmp_path / 'a.json'} cannot be read: input 'X': shape [2] needs 2 elements but 'data' has 1"
    )
