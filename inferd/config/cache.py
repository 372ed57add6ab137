"""`[cache]`: the exact-match response cache (inferd.cache); tenants opt in with `cache_responses = true`."""
from __future__ import annotations

import math

from inferd.config.walk import ConfigTable


class CacheConfig(ConfigTable):
    max_bytes: int = 64 * 1024 * 1024     # the node's cache, all tenants; least recently used entries go first
    ttl_s: float = 3600.0                 # an entry older than this is never served
    bill_hits: bool = True                # a hit's ledger row costs what the generation did; false: no cost


def cache_errors(c: CacheConfig, path: str = "cache") -> list[str]:
    errors = []
    if c.max_bytes < 0:
        errors.append(f"{path}.max_bytes: must be >= 0 (0 turns the cache off), got {c.max_bytes}")
    if not 0 < c.ttl_s < math.inf:
        errors.append(f"{path}.ttl_s: must be a positive number of seconds, got {c.ttl_s}")
    return errors
