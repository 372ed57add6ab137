"""The ledger as a billing system reads it: usage totals and rows as CSV, JSON lines, or a table.

`inferd usage` (inferd.store.usage_cli) and `GET /admin/usage` (inferd.api.admin.usage) both use these,
so the file a billing job downloads is the same whichever way it is fetched.
"""
from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from datetime import datetime, timezone

import msgspec

from inferd.store.ledger import LedgerRow, UsageFilter, UsageTotal

FORMATS = ("table", "csv", "jsonl", "json")
TOTAL_FIELDS = tuple(f.name for f in msgspec.structs.fields(UsageTotal))
ROW_FIELDS = ("seq",) + tuple(f.name for f in msgspec.structs.fields(LedgerRow))


class UsageArgumentError(ValueError):
    """A filter the caller gave is malformed; the message names it."""


def parse_day(text: str | None, name: str) -> float | None:
    """Unix seconds of a UTC day ("2026-11-24") or instant ("2026-11-24T10:00:00Z", or unix seconds)."""
    if text is None or text == "":
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageArgumentError(f"{name}: expected a date (2026-11-24), an ISO time or unix seconds, "
                                 f"got {text[:40]!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def usage_filter(tenant: str | None, model: str | None, since: str | None, until: str | None) -> UsageFilter:
    return UsageFilter(tenant=tenant or None, model=model or None, since=parse_day(since, "since"),
                       until=parse_day(until, "until"))


def totals_text(totals: list[UsageTotal], fmt: str, *, by_version: bool = False) -> str:
    fields = TOTAL_FIELDS if by_version else tuple(f for f in TOTAL_FIELDS if f != "version")
    return _render([msgspec.to_builtins(t) for t in totals], fields, fmt)


def rows_text(rows: Iterable[tuple[int, LedgerRow]], fmt: str) -> str:
    return _render([{"seq": seq, **msgspec.to_builtins(row)} for seq, row in rows], ROW_FIELDS, fmt)


def _render(records: list[dict], fields: tuple[str, ...], fmt: str) -> str:
    if fmt == "jsonl":
        return "".join(msgspec.json.encode(r).decode() + "\n" for r in records)
    if fmt == "json":
        return msgspec.json.encode({"object": "list", "data": records}).decode()
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
        return out.getvalue()
    widths = {f: max([len(f), *(len(_cell(r[f])) for r in records)]) for f in fields}
    lines = ["  ".join(f.ljust(widths[f]) for f in fields)]
    lines += ["  ".join(_cell(r[f]).ljust(widths[f]) for f in fields) for r in records]
    return "\n".join(lines) + "\n"


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else str(value)
