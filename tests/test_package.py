"""inferd's root package: what every package imports from it."""
from __future__ import annotations

from inferd import tomllib


def test_tomllib_parses_toml():
    assert tomllib.loads('a = 1\n[t]\nb = "x"') == {"a": 1, "t": {"b": "x"}}
