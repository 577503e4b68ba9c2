"""Remote model repositories, mirrored into a local cache directory that the rest of the server reads.

* ``s3://bucket/prefix`` (fsspec + s3fs, imported only when used; credentials from the usual AWS
  environment variables; ``repository.s3_endpoint_url`` for MinIO-style or local stores). ``sync``
  copies ``<model>/config.yaml`` and ``<model>/<version>/model.onnx`` objects that changed and deletes
  local files whose objects are gone, so the poller sees new, changed and removed models as it does on
  disk.
* ``http(s)://`` URLs of single model files, with an optional ``sha256``.

Every download goes to a temporary file beside its destination, is checked (the size the listing
announced and, for S3, the MD5 in a single-part upload's ETag; for URLs, the given sha256), and only
then renamed over the old file: a corrupt or partial download never replaces a working version.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from edgeinfer.errors import ConfigError, ModelLoadError
from edgeinfer.extras import need

log = logging.getLogger(__name__)

_WANTED = re.compile(r"^[^/.][^/]*/(config\.yaml|\d+/model\.onnx)$")
_CHUNK = 1 << 20


def is_remote(path: str) -> bool:
    return "://" in path


def _cache_name(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:16]


class S3Mirror:
    """A local copy of ``s3://bucket/prefix``, brought up to date by ``sync``."""

    def __init__(self, url: str, cache_dir: Path, endpoint_url: str | None) -> None:
        if not url.startswith("s3://"):
            raise ConfigError(f"model_store_path {url!r}: only s3:// remote repositories are supported")
        s3fs = need("s3fs", f"the s3:// model repository {url}")
        client_kwargs: dict[str, Any] = {"endpoint_url": endpoint_url} if endpoint_url else {}
        self.fs = s3fs.S3FileSystem(
            client_kwargs=client_kwargs, skip_instance_cache=True, use_listings_cache=False
        )
        self.url = url
        self.root = url.removeprefix("s3://").rstrip("/")
        self.local = cache_dir / f"s3-{_cache_name(url)}"
        self.local.mkdir(parents=True, exist_ok=True)
        self._manifest_path = self.local / ".manifest.json"

    def sync(self) -> None:
        """Download what changed, delete what is gone. Raises ConfigError if the bucket cannot be read."""
        try:
            listing = self.fs.find(self.root, detail=True)
        except (OSError, ValueError) as exc:  # s3fs raises FileNotFoundError/PermissionError/OSError
            raise ConfigError(f"cannot list {self.url}: {exc}") from None
        manifest = self._read_manifest()
        seen = set()
        for key, info in listing.items():
            relative = key[len(self.root) + 1 :]
            if not _WANTED.match(relative):
                continue
            seen.add(relative)
            stamp = f"{info.get('ETag', '')}:{info.get('size')}"
            target = self.local / relative
            if manifest.get(relative) == stamp and target.exists():
                continue
            try:
                self._download(key, target, int(info.get("size", -1)), str(info.get("ETag", "")))
            except ModelLoadError as error:
                log.error("%s; keeping the cached copy", error)
                continue
            manifest[relative] = stamp
            log.info("fetched s3://%s", key)
        for relative in list(manifest):
            if relative not in seen:
                (self.local / relative).unlink(missing_ok=True)
                del manifest[relative]
        _remove_empty_dirs(self.local)
        self._manifest_path.write_text(json.dumps(manifest))

    def _download(self, key: str, target: Path, size: int, etag: str) -> None:
        digest = hashlib.md5(usedforsecurity=False)
        with _Download(target, f"s3://{key}") as download:
            with self.fs.open(key, "rb") as source:
                download.copy(source, digest)
            got = download.size()
            plain_md5 = etag.strip('"')
            if got != size or (re.fullmatch(r"[0-9a-f]{32}", plain_md5) and plain_md5 != digest.hexdigest()):
                raise ModelLoadError(
                    f"s3://{key} arrived corrupt or partial ({got} of {size} bytes, or checksum)"
                )

    def _read_manifest(self) -> dict[str, str]:
        try:
            manifest: dict[str, str] = json.loads(self._manifest_path.read_text())
            return manifest
        except (OSError, ValueError):
            return {}


def fetch_url(url: str, sha256: str | None, cache_dir: Path) -> Path:
    """A local copy of a model file at an http(s) URL; with ``sha256`` a matching cached copy is reused."""
    import urllib.request  # only servers with URL models pay for urllib's imports (http, email, ssl)

    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / f"url-{_cache_name(url)}.onnx"
    if sha256 and target.exists() and _sha256(target) == sha256.lower():
        return target
    digest = hashlib.sha256()
    with _Download(target, url) as download:
        with urllib.request.urlopen(url, timeout=60) as response:
            expected = response.headers.get("Content-Length")
            download.copy(response, digest)
        if expected is not None and download.size() != int(expected):
            raise ModelLoadError(f"downloading {url} stopped after {download.size()} of {expected} bytes")
        if sha256 and digest.hexdigest() != sha256.lower():
            raise ModelLoadError(f"{url} has sha256 {digest.hexdigest()}, not the configured {sha256}")
    return target


class _Download:
    """Writes to ``<target>.partial``; on a clean exit renames it over ``target``, on any error deletes it.

    So a corrupt or partial download never replaces the file that is there.
    """

    def __init__(self, target: Path, what: str) -> None:
        self.target = target
        self.what = what
        self.partial = target.with_name(target.name + ".partial")

    def __enter__(self) -> _Download:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self._out = self.partial.open("wb")
        return self

    def copy(self, source: Any, digest: Any) -> None:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
            self._out.write(chunk)
        self._out.flush()

    def size(self) -> int:
        return self.partial.stat().st_size

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: Any) -> None:
        self._out.close()
        if error is None:
            os.replace(self.partial, self.target)
            return
        self.partial.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise ModelLoadError(f"downloading {self.what} failed: {error}") from None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _remove_empty_dirs(root: Path) -> None:
    for folder in sorted((path for path in root.rglob("*") if path.is_dir()), key=lambda p: -len(p.parts)):
        if not any(folder.iterdir()):
            folder.rmdir()
