"""The console's Tenants view: requests, tokens and spend today and over 30 days from the usage ledger, and
the requests refused before admission (by reason) since start."""
from __future__ import annotations

import datetime

from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.console import pages
from inferd.store import usage_filter

DAYS = 30


def _today() -> datetime.date:
    return datetime.datetime.now(datetime.timezone.utc).date()


async def render(request: web.Request, session, sessions) -> str:
    state = request.app[keys.STATE]
    ledger = state.ledger
    today = _today()
    usage = {}
    if ledger is not None:
        since = (today - datetime.timedelta(days=DAYS - 1)).isoformat()
        for t in await ledger.totals(usage_filter(None, None, since, None)):
            row = usage.setdefault(t.tenant, {"today": [0, 0, 0.0], "month": [0, 0, 0.0]})
            for period in ("month", "today") if t.day == today.isoformat() else ("month",):
                row[period][0] += t.requests
                row[period][1] += t.prompt_tokens + t.completion_tokens
                row[period][2] += t.cost
    rows = [[pages.esc(tenant),
             *(f"{r[p][0]:,} requests, {pages.number(r[p][1], 'tokens')}, {r[p][2]:,.4f} spent" for p in ("today",
                                                                                                         "month"))]
            for tenant, r in sorted(usage.items())]
    body = ("<p>No usage ledger on this server (no store is open).</p>" if ledger is None else
            pages.table(("tenant", "today (UTC)", f"last {DAYS} days"), rows, empty="No usage recorded yet."))
    if usage:
        body += ('<h3>Tokens per day, last 30 days</h3><div class="daily" role="img" '
                 'aria-label="tokens per tenant per day over the last 30 days (the table above has the totals)"></div>')
    snapshot = state.tenancy.metrics_snapshot()
    quota = [[pages.esc(label), f"{q['in_flight']:,}",
              "-" if q["remaining_requests"] is None else pages.number(q["remaining_requests"], "requests"),
              "-" if q["remaining_tokens"] is None else pages.number(q["remaining_tokens"], "tokens"),
              pages.esc(", ".join(f"{r}: {n:,}" for r, n in sorted(q["rejections"].items())) or "-")]
             for label, q in sorted(snapshot["quota"].items())]
    body += "<h3>Quota now</h3>" + pages.table(
        ("tenant", "in flight", "left this minute", "tokens left this minute", "refused by quota"), quota,
        empty="No tenant has made a request since start.")
    refusals = snapshot["rejections"]
    refused = [[pages.esc(label), pages.esc(", ".join(f"{reason}: {n:,}" for reason, n in sorted(reasons.items())))]
               for label, reasons in sorted(refusals.items())]
    body += "<h3>Refused before admission, since start</h3>" + pages.table(
        ("tenant", "by reason"), refused, empty="None refused.")
    return pages.page("Tenants", body, view="tenants", logout_token=sessions.form_token(session))


async def daily(request: web.Request, session, sessions) -> dict:
    """Tokens (prompt + completion) per tenant per UTC day over the last DAYS days: the chart's data."""
    ledger = request.app[keys.STATE].ledger
    today = _today()
    days = [(today - datetime.timedelta(days=DAYS - 1 - i)) for i in range(DAYS)]
    index = {d.isoformat(): i for i, d in enumerate(days)}
    tenants: dict[str, list[int]] = {}
    if ledger is not None:
        for t in await ledger.totals(usage_filter(None, None, days[0].isoformat(), None)):
            if t.day in index:
                tenants.setdefault(t.tenant, [0] * DAYS)[index[t.day]] += t.prompt_tokens + t.completion_tokens
    epoch = datetime.datetime(1970, 1, 1).date()
    return {"days": [(d - epoch).days * 86400 for d in days], "tenants": tenants}
