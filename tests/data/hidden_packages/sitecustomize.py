"""Makes the packages named in ``EDGEINFER_TEST_HIDDEN`` (top-level names, comma-separated) fail to import
as a missing package does, for the tests of what a missing optional extra says (tests/e2e/test_extras.py).
Put on PYTHONPATH, Python imports it at start-up."""

import os
import sys
from importlib.abc import MetaPathFinder

HIDDEN = {name for name in os.environ.get("EDGEINFER_TEST_HIDDEN", "").split(",") if name}


class Hidden(MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if top in HIDDEN:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


sys.meta_path.insert(0, Hidden())
