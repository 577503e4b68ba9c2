"""HTTP content coding: gzip and deflate request bodies in, compressed responses out.

Decompression is bounded: the decompressed size counts against the body limit, so a small compressed
body cannot expand into gigabytes (a zip bomb) before anyone checks.
"""

from __future__ import annotations

import zlib

from edgeinfer.errors import InvalidInput, TooLarge

_WBITS = {b"gzip": 16 + zlib.MAX_WBITS, b"x-gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}


def decompress(body: bytes, encoding: bytes, limit: int) -> bytes:
    coding = encoding.strip().lower()
    if coding in (b"", b"identity"):
        return body
    wbits = _WBITS.get(coding)
    if wbits is None:
        raise InvalidInput(
            f"Content-Encoding {coding.decode(errors='replace')!r} is not supported; use gzip or deflate"
        )
    try:
        return _bounded(body, wbits, limit)
    except zlib.error:
        if coding != b"deflate":
            raise InvalidInput(f"the {coding.decode()} request body cannot be decompressed") from None
    try:  # some clients send raw deflate without the zlib wrapper
        return _bounded(body, -zlib.MAX_WBITS, limit)
    except zlib.error as exc:
        raise InvalidInput(f"the deflate request body cannot be decompressed: {exc}") from None


def _bounded(body: bytes, wbits: int, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits)
    out = inflater.decompress(body, limit + 1)
    if len(out) > limit or inflater.unconsumed_tail:
        raise TooLarge(
            f"the request body decompresses to more than the limit of {limit} bytes "
            "(server.max_request_size_mb)",
            "decompressed_size",
        )
    if not inflater.eof:
        raise zlib.error("truncated stream")
    return out


def choose_encoding(accept_encoding: bytes | None) -> bytes | None:
    """gzip or deflate if the client accepts it (a q=0 entry refuses it)."""
    if not accept_encoding:
        return None
    accepted = set()
    for part in accept_encoding.lower().split(b","):
        coding, _, params = part.strip().partition(b";")
        if params.replace(b" ", b"") in (b"q=0", b"q=0.0", b"q=0.00", b"q=0.000"):
            continue
        accepted.add(coding.strip())
    for coding in (b"gzip", b"deflate"):
        if coding in accepted:
            return coding
    return None


def compress(body: bytes, coding: bytes) -> bytes:
    if coding == b"gzip":
        compressor = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    else:
        compressor = zlib.compressobj(1, zlib.DEFLATED, zlib.MAX_WBITS)
    return compressor.compress(body) + compressor.flush()
