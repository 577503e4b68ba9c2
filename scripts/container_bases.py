"""Build the Dockerfile's two base images from Debian's own packages, for machines that reach Debian's
mirror but no image registry (this project's CI machines are such).

    python scripts/container_bases.py [--engine podman] [--workdir build/container]

makes two local images:

- ``localhost/edgeinfer-build:bookworm`` — Debian 12 minbase with python3-venv, standing in for
  ``debian:bookworm-slim`` (the build stage installs what else it needs with apt);
- ``localhost/edgeinfer-runtime:bookworm`` — only the files of Debian's Python 3.11 packages and the
  packages they depend on (no shell, no apt, no dpkg), with distroless' users: the same recipe as
  ``gcr.io/distroless/python3-debian12``, which it stands in for.

An image that already exists is kept (``--rebuild`` to make it again). The root filesystem comes from
``debootstrap``; images are made with ``<engine> import``.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BUILD_IMAGE = f"localhost/edgeinfer-build:{SUITE}"
RUNTIME_IMAGE = f"localhost/edgeinfer-runtime:{SUITE}"
# What a Python program needs at run time beyond the interpreter: C++ runtime (ONNX Runtime), TLS roots,
# time zones, /etc/services and /etc/protocols, and the files every Debian system has.
RUNTIME_ROOTS = (
    "python3.11",
    "python3-minimal",
    "libstdc++6",
    "ca-certificates",
    "tzdata",
    "netbase",
    "base-files",
)
# Dependencies that exist only to install or configure packages: a system that never installs has no use.
NOT_AT_RUN_TIME = frozenset(("dpkg", "debconf", "perl-base", "debianutils", "readline-common", "openssl"))
PASSWD = "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"
PASSWD += "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
GROUP = "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\ntty:x:5:\nstaff:x:50:\n"
TRIM = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", default=os.environ.get("CONTAINER_ENGINE", "podman"))
    parser.add_argument("--workdir", type=Path, default=Path("build/container"))
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args()
    build_bases(args.engine, args.workdir, args.rebuild)
    return 0


def build_bases(engine: str, workdir: Path, rebuild: bool = False) -> tuple[str, str]:
    """Make both images unless they exist; return their names (build, runtime)."""
    wanted = [image for image in (BUILD_IMAGE, RUNTIME_IMAGE) if rebuild or not _exists(engine, image)]
    if wanted:
        rootfs = workdir / f"rootfs-{SUITE}"
        if rebuild or not (rootfs / "usr/bin/python3").exists():
            _debootstrap(rootfs)
        for path in TRIM:
            shutil.rmtree(rootfs / path, ignore_errors=True)
            (rootfs / path).mkdir(parents=True, exist_ok=True)
        if BUILD_IMAGE in wanted:
            _import(engine, BUILD_IMAGE, rootfs, _files_under(rootfs, exclude=("var/cache/apt/archives",)))
        if RUNTIME_IMAGE in wanted:
            _import_runtime(engine, rootfs, workdir)
    return BUILD_IMAGE, RUNTIME_IMAGE


def _exists(engine: str, image: str) -> bool:
    return subprocess.run([engine, "image", "exists", image], check=False).returncode == 0


def _debootstrap(rootfs: Path) -> None:
    shutil.rmtree(rootfs, ignore_errors=True)
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    command = ["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates"]
    subprocess.run([*command, SUITE, str(rootfs), MIRROR], check=True, stdout=subprocess.DEVNULL)


def _import(
    engine: str, image: str, rootfs: Path, members: list[str], extra: dict[str, str] | None = None
) -> None:
    tar_path = rootfs.parent / (image.split("/")[-1].replace(":", "-") + ".tar")
    with tarfile.open(tar_path, "w") as tar:
        for member in members:
            tar.add(rootfs / member, arcname=member, recursive=False)
        for name, text in (extra or {}).items():
            info = tarfile.TarInfo(name)
            data = text.encode()
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    subprocess.run([engine, "import", str(tar_path), image], check=True, stdout=subprocess.DEVNULL)
    tar_path.unlink()


def _files_under(rootfs: Path, exclude: tuple[str, ...] = ()) -> list[str]:
    members = []
    for directory, dirnames, filenames in os.walk(rootfs):
        relative = os.path.relpath(directory, rootfs)
        if any(relative == skip or relative.startswith(skip + "/") for skip in exclude):
            dirnames.clear()
            continue
        if relative != ".":
            members.append(relative)
        linked = [name for name in dirnames if os.path.islink(os.path.join(directory, name))]
        members.extend(os.path.normpath(os.path.join(relative, name)) for name in [*filenames, *linked])
    return members


def _import_runtime(engine: str, rootfs: Path, workdir: Path) -> None:
    packages = _closure(rootfs, RUNTIME_ROOTS)
    members: set[str] = set()
    for package in sorted(packages):
        listing = rootfs / "var/lib/dpkg/info" / f"{package}.list"
        if not listing.exists():
            listing = next((rootfs / "var/lib/dpkg/info").glob(f"{package}:*.list"))
        for line in listing.read_text().splitlines():
            path = _canonical(rootfs, line.strip().lstrip("/"))
            trimmed = any(path == t or path.startswith(t + "/") for t in TRIM)
            if path and not trimmed and ((rootfs / path).exists() or (rootfs / path).is_symlink()):
                members.add(path)
    # Debian 12 merges /bin, /lib and /sbin into /usr: the top-level links and the loader must be there.
    members.update(name for name in ("bin", "lib", "lib64", "sbin") if (rootfs / name).is_symlink())
    members.update(_parents(members))
    members.update(("etc/ssl/certs/ca-certificates.crt", "tmp", "etc/ld.so.cache"))
    for name in ("tmp", "home/nonroot", "root"):
        (rootfs / name).mkdir(parents=True, exist_ok=True)
    members.update(("home", "home/nonroot", "root"))
    extra = {"etc/passwd": PASSWD, "etc/group": GROUP}
    _import(engine, RUNTIME_IMAGE, rootfs, sorted(members - set(extra)), extra)
    print(f"{RUNTIME_IMAGE}: {len(packages)} packages: {' '.join(sorted(packages))}", file=sys.stderr)


def _canonical(rootfs: Path, path: str) -> str:
    """``lib/x86_64-linux-gnu/libc.so.6`` as ``usr/lib/...``: a tar may not write through the /lib link."""
    if not path or path == ".":
        return ""
    root = os.path.realpath(rootfs)
    parent = os.path.realpath(os.path.join(root, os.path.dirname(path)))
    return os.path.relpath(os.path.join(parent, os.path.basename(path)), root)


def _parents(paths: set[str]) -> set[str]:
    parents = set()
    for path in paths:
        parent = os.path.dirname(path)
        while parent and parent not in parents:
            parents.add(parent)
            parent = os.path.dirname(parent)
    return parents


def _closure(rootfs: Path, roots: tuple[str, ...]) -> set[str]:
    """The installed packages that ``roots`` need, following Depends and Pre-Depends."""
    depends: dict[str, list[str]] = {}
    provides: dict[str, str] = {}
    for stanza in (rootfs / "var/lib/dpkg/status").read_text().split("\n\n"):
        fields = dict(re.findall(r"^([\w-]+): (.*)$", stanza, flags=re.MULTILINE))
        if "Package" not in fields or "installed" not in fields.get("Status", ""):
            continue
        name = fields["Package"]
        alternatives = ", ".join(fields.get(key, "") for key in ("Pre-Depends", "Depends"))
        depends[name] = [group for group in alternatives.split(",") if group.strip()]
        for provided in fields.get("Provides", "").split(","):
            if provided.strip():
                provides[provided.split()[0].strip()] = name
    needed: set[str] = set()
    pending = list(roots)
    while pending:
        name = pending.pop()
        name = name if name in depends else provides.get(name, name)
        if name in needed or name in NOT_AT_RUN_TIME or name not in depends:
            continue
        needed.add(name)
        for group in depends[name]:  # the first installed alternative of each "a | b" group
            choices = [choice.split()[0].split(":")[0] for choice in group.split("|")]
            installed = [c for c in choices if c in depends or c in provides]
            if installed:
                pending.append(installed[0])
    return needed


if __name__ == "__main__":
    sys.exit(main())
