"""Job ids: time-ordered UUIDs (version 7, RFC 9562 section 5.7).

The first 48 bits are the Unix time in milliseconds, the other 74 (beside
version and variant) random. Jobs created together sit together in the
primary key: a claim of 1,000 jobs scheduled in the same second touches a
few index pages, not 1,000 random ones, which is what keeps firing beside
10M stored jobs as fast as beside none. The shard (0-63) comes from the
random last 32 bits, so it stays uniform (migration 0007).
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Iterator

_VERSION_7 = 0x7 << 76
_VARIANT_RFC = 0x2 << 62
_RAND_B = (1 << 62) - 1
_UNKNOWN_SAFETY = uuid.SafeUUID.unknown


def new_job_id(shard: int | None = None) -> uuid.UUID:
    """A new job id: a UUID version 7 of the current time (RFC 9562, section 5.7). ``shard``
    (0-63), if given, sets the id's low 6 random bits, which are its shard."""
    rand = int.from_bytes(os.urandom(10))
    if shard is not None:
        rand = rand & ~63 | shard
    return _uuid(_v7(time.time_ns() // 1_000_000, rand))


def shard_of_key(key: str) -> int:
    """The shard (0-63) of a keyed job: from its key (BLAKE2b of its UTF-8), so that every job of
    one key lives on one shard, and so on one database of ``SHARD_DATABASES``."""
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()[-1] & 63


def job_ids(batch: int = 1024) -> Iterator[uuid.UUID]:
    """New job ids as ``new_job_id()`` makes them, the random bits read ``batch`` ids at a time
    (for bulk inserts). Each id takes the time at which it is handed out."""
    clock = time.time_ns
    while True:
        raw = os.urandom(10 * batch)
        for start in range(0, len(raw), 10):
            yield _uuid(_v7(clock() // 1_000_000, int.from_bytes(raw[start : start + 10])))


def _v7(ms: int, rand: int) -> int:
    """48 bits of ``ms``, version 7, 12 bits of rand_a, the RFC variant, 62 bits of rand_b (of 80 random bits)."""
    return (ms & 0xFFFF_FFFF_FFFF) << 80 | _VERSION_7 | (rand >> 68) << 64 | _VARIANT_RFC | rand & _RAND_B


def _uuid(value: int) -> uuid.UUID:
    """``uuid.UUID(int=value)`` without its argument checks (~1 µs), as CPython 3.14's ``UUID._from_int``."""
    u = object.__new__(uuid.UUID)
    object.__setattr__(u, "int", value)
    object.__setattr__(u, "is_safe", _UNKNOWN_SAFETY)
    return u
