"""The README's benchmark table is generated from bench/results/reference.md (bench/run.py --reference):
a table edited by hand, or a reference run whose table was not carried into the README, fails here."""

from __future__ import annotations

from bench import run
from tests.support import ROOT


def test_the_readme_table_is_the_one_the_reference_run_makes():
    readme = (ROOT / "README.md").read_text()
    reference = (ROOT / "bench" / "results" / "reference.md").read_text()
    assert run.readme_with_reference(readme, reference) == readme, (
        "the README's table differs from bench/results/reference.md: run `python bench/run.py --reference`"
    )


def test_a_changed_table_is_found():
    readme = (ROOT / "README.md").read_text()
    reference = (ROOT / "bench" / "results" / "reference.md").read_text()
    edited = readme.replace("| edgeinfer | 1 | tiny | json | 1 |", "| edgeinfer | 1 | tiny | json | 2 |", 1)
    assert edited != readme
    assert run.readme_with_reference(edited, reference) != edited
