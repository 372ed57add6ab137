"""The strict walk of a decoded TOML document against msgspec structs, collecting every error.

msgspec stops at the first bad key; `check-config` should name them all. `check_table` walks a
table field by field (unknown key, wrong type, recursing into sub-tables) and appends one
`path: problem` line per bad key; `decode_entries` does the same for each `[key.<name>]` entry and
decodes the ones that pass. Nothing here knows inferd's tables: inferd.config.root declares them.
"""
from __future__ import annotations

import enum
from collections.abc import Collection
from typing import Any, Literal, get_args, get_origin

import msgspec


class ConfigTable(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every config table: immutable, keyword-only, unknown keys rejected."""


def type_name(value: Any) -> str:
    return {dict: "table", list: "array", str: "str", int: "int", float: "float", bool: "bool"}.get(
        type(value), type(value).__name__
    )


def _struct_of(tp: Any) -> type[msgspec.Struct] | None:
    """The Struct class a field holds, directly or as `Struct | None`."""
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp
    structs = [a for a in get_args(tp) if isinstance(a, type) and issubclass(a, msgspec.Struct)]
    return structs[0] if structs and get_origin(tp) is not dict else None


def _describe(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):     # e.g. tenants.*.priority
        return "one of " + ", ".join(repr(m.value) for m in tp)
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _leaf_error(path: str, value: Any, tp: Any) -> str | None:
    if get_origin(tp) is dict and isinstance(value, dict):  # check entries one by one to name the key
        key_tp, value_tp = get_args(tp)
        errs = [(_leaf_error(f"{path}.{k}", k, key_tp) if key_tp is not str else None)
                or _leaf_error(f"{path}.{k}", v, value_tp) for k, v in value.items()]
        return "; ".join(e for e in errs if e) or None
    try:
        msgspec.convert(value, tp)
    except msgspec.ValidationError as exc:
        if get_origin(tp) is Literal or (isinstance(tp, type) and issubclass(tp, enum.Enum)):
            return f"{path}: expected {_describe(tp)}, got {value!r}"
        if str(exc).startswith("Expected"):
            return f"{path}: expected {_describe(tp)}, got {type_name(value)}"
        return f"{path}: {exc}"
    return None


def check_table(raw: Any, cls: type[msgspec.Struct], path: str, errors: list[str], *,
                skip: Collection[str] = ()) -> None:
    """Append one error per unknown key or mistyped value in `raw` (recursing into sub-tables).
    Fields named in `skip` are left to the caller (checked entry by entry, say)."""
    if not isinstance(raw, dict):
        errors.append(f"{path or '<root>'}: expected a table, got {type_name(raw)}")
        return
    fields = {f.encode_name: f for f in msgspec.structs.fields(cls)}
    prefix = f"{path}." if path else ""
    for key, value in raw.items():
        field = fields.get(key)
        here = f"{prefix}{key}"
        if field is None:
            errors.append(f"{here}: unknown key (expected one of: {', '.join(fields)})")
            continue
        if field.name in skip:
            continue
        sub = _struct_of(field.type)
        if sub is not None and value is not None:
            check_table(value, sub, here, errors)
            continue
        err = _leaf_error(here, value, field.type)
        if err:
            errors.append(err)


def well_formed(raw: Any, cls: type[msgspec.Struct]) -> msgspec.Struct | None:
    """`raw` decoded without the keys check_table faults (they take their defaults), so the semantic
    checks can still judge the rest and check-config names every error at once; None when even that
    does not decode (a required key is missing or bad)."""
    try:
        return msgspec.convert(_well_formed_part(raw, cls), cls) if isinstance(raw, dict) else None
    except msgspec.ValidationError:
        return None


def _well_formed_part(raw: dict[str, Any], cls: type[msgspec.Struct]) -> dict[str, Any]:
    fields = {f.encode_name: f for f in msgspec.structs.fields(cls)}
    out = {}
    for key, value in raw.items():
        field = fields.get(key)
        if field is None:
            continue
        sub = _struct_of(field.type)
        if sub is not None and value is not None:
            if isinstance(value, dict):
                out[key] = _well_formed_part(value, sub)
        elif _leaf_error(key, value, field.type) is None:
            out[key] = value
    return out


def decode_entries(raw: dict[str, Any], key: str, cls: type[msgspec.Struct],
                   errors: list[str]) -> dict[str, Any]:
    """Decode the entries of one `[key.<name>]` table that pass the structural check."""
    table = raw.get(key, {})
    if not isinstance(table, dict):
        errors.append(f"{key}: expected a table, got {type_name(table)}")
        return {}
    out = {}
    for name, value in table.items():
        entry_errors: list[str] = []
        check_table(value, cls, f"{key}.{name}", entry_errors)
        errors.extend(entry_errors)
        if not entry_errors:
            try:
                out[name] = msgspec.convert(value, cls)
            except msgspec.ValidationError as exc:   # a required key is missing
                errors.append(f"{key}.{name}: {exc}")
    return out
