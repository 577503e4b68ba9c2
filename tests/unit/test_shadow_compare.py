"""Comparing a shadow candidate's outputs with the primary's, without a server."""

from __future__ import annotations

import numpy as np
import pytest

from edgeinfer.shadow import Comparison, compare, compare_output


def objects(*items: bytes) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = list(items)
    return array


@pytest.mark.parametrize(
    ("primary", "candidate", "expected"),
    [
        # classifier scores: top-1 per row; the diff is the largest of all
        (np.array([[0.1, 0.9], [0.8, 0.2]]), np.array([[0.2, 0.8], [0.4, 0.6]]), Comparison(0.4, 1, 2)),
        (np.array([[1.0, 2.0, 3.0]]), np.array([[1.0, 2.0, 3.0]]), Comparison(0.0, 1, 1)),
        # one value per row (a regression): equality per row
        (np.array([[1.0], [2.0]]), np.array([[1.0], [2.5]]), Comparison(0.5, 1, 2)),
        (np.array([1.0, 2.0]), np.array([1.0, 2.0]), Comparison(0.0, 2, 2)),
        # labels as integers: the whole row must match
        (np.array([[1, 2], [3, 4]]), np.array([[1, 2], [3, 5]]), Comparison(1.0, 1, 2)),
        # text
        (objects(b"cat", b"dog"), objects(b"cat", b"cow"), Comparison(None, 1, 2)),
        # another shape disagrees on every row
        (np.zeros((2, 3)), np.zeros((2, 4)), Comparison(float("inf"), 0, 2)),
        (np.zeros((0, 3)), np.zeros((0, 3)), Comparison(0.0, 0, 0)),
    ],
)
def test_compare_output(primary: np.ndarray, candidate: np.ndarray, expected: Comparison):
    got = compare_output(primary, candidate)
    assert got.rows_agreeing == expected.rows_agreeing
    assert got.rows == expected.rows
    if expected.max_abs_diff is None:
        assert got.max_abs_diff is None
    else:
        assert got.max_abs_diff == pytest.approx(expected.max_abs_diff)


def test_only_outputs_both_have_are_compared():
    result = compare({"a": np.ones(2), "b": np.ones(2)}, {"a": np.ones(2), "c": np.ones(2)})
    assert set(result) == {"a"}


def test_two_workers_comparisons_add_up_in_one_exposition():
    from prometheus_client.parser import text_string_to_metric_families

    from edgeinfer.exposition import exposition
    from edgeinfer.metrics import Metrics, merge

    snapshots = []
    for diff in (0.5, 0.001):
        metrics = Metrics()
        stats = metrics.shadow("resnet", "resnet/2")
        stats.compared({"probs": Comparison(diff, 3, 4)})
        stats.result("dropped")
        snapshots.append(metrics.snapshot([]))
    text = exposition(merge(snapshots), {}, None).decode()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    labels = (("candidate", "resnet/2"), ("model", "resnet"))
    assert samples["edgeinfer_shadow_requests_total", (*labels, ("result", "compared"))] == 2
    assert samples["edgeinfer_shadow_requests_total", (*labels, ("result", "dropped"))] == 2
    assert samples["edgeinfer_shadow_rows_total", (("agree", "true"), *labels, ("output", "probs"))] == 6
    assert samples["edgeinfer_shadow_rows_total", (("agree", "false"), *labels, ("output", "probs"))] == 2
    assert samples["edgeinfer_shadow_max_abs_diff_sum", (*labels, ("output", "probs"))] == pytest.approx(
        0.501
    )
