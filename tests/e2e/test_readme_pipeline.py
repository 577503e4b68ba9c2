"""The pipeline calls in the README run as written against the example server."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support import ROOT, ServerProcess


def test_readme_curl_and_tritonclient_pipeline_examples(example_server: ServerProcess):
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Pipelines") : readme.index("## Endpoints")]
    curl = section[section.index("```bash\n") + 8 : section.index("```", section.index("```bash\n") + 8)]
    command = "\n".join(line for line in curl.splitlines() if not line.startswith("#"))
    command = command.replace("localhost:8080", f"127.0.0.1:{example_server.port}")
    result = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, cwd=ROOT, timeout=30, check=True
    )
    assert '"data":["blue","black","white"]' in result.stdout
    python = re.search(r"```python\n(import numpy as np\nimport tritonclient.http.*?)```", section, re.S)
    assert python is not None
    code = python.group(1).replace("localhost:8080", f"127.0.0.1:{example_server.port}")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60, check=True
    )
    assert "[[b'blue' b'black' b'white']]" in result.stdout
