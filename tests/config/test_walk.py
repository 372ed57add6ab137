from __future__ import annotations

from typing import Literal

import msgspec

from inferd.config.walk import ConfigTable, check_table, decode_entries, well_formed


class Inner(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    size: int = 1
    mode: Literal["a", "b"] = "a"


class Outer(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str = "x"
    inner: Inner | None = None
    limits: dict[str, int] = {}
    entries: dict[str, Inner] = {}


def test_every_bad_key_of_every_sub_table_is_named_with_its_path():
    errors: list[str] = []
    raw = {"name": 3, "typo": 1, "inner": {"size": "big", "mode": "c", "extra": 0}, "limits": {"rpm": "many"}}
    check_table(raw, Outer, "", errors)
    assert errors == [
        "name: expected str, got int",
        "typo: unknown key (expected one of: name, inner, limits, entries)",
        "inner.size: expected int, got str",
        "inner.mode: expected one of 'a', 'b', got 'c'",
        "inner.extra: unknown key (expected one of: size, mode)",
        "limits.rpm: expected int, got str",
    ]


def test_skipped_fields_are_left_to_the_caller_only_at_the_top():
    errors: list[str] = []
    check_table({"entries": {"e": {"size": "no"}}, "inner": {"size": "no"}}, Outer, "", errors, skip=("entries",))
    assert errors == ["inner.size: expected int, got str"]


def test_decode_entries_keeps_the_good_entries_and_names_the_bad_ones():
    errors: list[str] = []
    out = decode_entries({"entries": {"ok": {"size": 2}, "bad": {"size": "two"}}}, "entries", Inner, errors)
    assert out == {"ok": Inner(size=2)} and errors == ["entries.bad.size: expected int, got str"]
    assert decode_entries({"entries": [1]}, "entries", Inner, errors) == {}
    assert errors[-1] == "entries: expected a table, got array"


class Part(ConfigTable):
    name: str = "x"
    size: int = 1


class Whole(ConfigTable):
    port: int = 0
    label: str = "d"
    part: Part = Part()


def test_well_formed_keeps_the_good_keys_of_a_table_with_bad_ones():
    got = well_formed({"port": "80", "label": "ok", "typo": 1, "part": {"name": "n", "size": "big"}}, Whole)
    assert got == Whole(port=0, label="ok", part=Part(name="n", size=1))
    assert well_formed("not a table", Whole) is None
