"""The console's SLOs, Cluster and Jobs views: what the burn-rate alerts would say now, the peers as gossip
sees them, and the batch jobs with their progress."""
from __future__ import annotations

from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.console import pages
from inferd.slo import ALERT_WINDOWS
from inferd.store import BatchStore

MAX_JOBS = 100


def _alerting(burn: dict[str, float]) -> str:
    """The severest alert both of whose windows burn faster than its factor (inferd.slo.rules), or "-"."""
    for severity, long_w, short_w, factor in ALERT_WINDOWS:
        if burn.get(long_w, 0.0) > factor and burn.get(short_w, 0.0) > factor:
            return f"{severity} ({long_w}/{short_w} over {factor:g}x)"
    return "-"


async def slos(request: web.Request, session, sessions) -> str:
    snapshots = request.app[keys.STATE].slos.snapshot()
    windows = [w for _, w, _, _ in ALERT_WINDOWS] + [w for _, _, w, _ in ALERT_WINDOWS]
    labels = sorted(set(windows), key=lambda w: (w[-1] != "m", w[-1] != "h", float(w[:-1])))
    rows = [[pages.esc(s.name), pages.esc(s.model), pages.esc(s.sli), f"{s.objective:.2%}",
             f"{s.good:,} good, {s.bad:,} bad", *(f"{s.burn_rates.get(w, 0.0):.2f}x" for w in labels),
             pages.percent(s.budget_remaining), pages.esc(_alerting(s.burn_rates))] for s in snapshots]
    body = pages.table(("SLO", "model", "indicator", "objective", "events", *(f"burn {w}" for w in labels),
                        "budget left", "alerting"), rows, empty="No [slos.*] configured.")
    return pages.page("SLOs", body, view="slos", logout_token=sessions.form_token(session), refresh_s=15)


async def cluster(request: web.Request, session, sessions) -> str:
    node = request.app[keys.STATE].cluster
    if node is None:
        body = "<p>This node is not in a cluster ([cluster] is not configured).</p>"
    else:
        view = node.peers_view()
        rows = []
        for p in view["peers"]:
            hints = "; ".join(f"{pages.esc(model)}@{pages.esc(version)}: {h['free_slots']} free slots, wait "
                              f"{h['est_wait_s']:.2f} s{' (stale)' if h['stale'] else ''}"
                              for model, versions in sorted(p["models"].items()) for version, h in versions.items())
            rows.append([pages.esc(p["node_id"]), pages.esc(p["state"]), f"{p['state_for_s']:.0f} s",
                         "-" if p["age_s"] is None else f"{p['age_s']:.1f} s", hints or "-"])
        body = (f"<p>This node: {pages.esc(view['self'])}</p>"
                + pages.table(("peer", "state", "for", "last report", "load hints"), rows, empty="No peers."))
    return pages.page("Cluster", body, view="cluster", logout_token=sessions.form_token(session), refresh_s=5)


async def jobs(request: web.Request, session, sessions) -> str:
    db = request.app[keys.STATE].store
    if db is None:
        body = "<p>No durable store is open: no batch jobs.</p>"
    else:
        found = await BatchStore(db).list(None, limit=MAX_JOBS)
        rows = [[pages.esc(b.id), pages.esc(b.tenant), pages.esc(b.endpoint), pages.esc(b.status),
                 f"{b.completed:,} done, {b.failed:,} failed of {b.total:,}"
                 + (f" ({(b.completed + b.failed) / b.total:.0%})" if b.total else ""),
                 pages.when(b.created_at)] for b in found]
        body = pages.table(("batch", "tenant", "endpoint", "status", "progress", "created"), rows,
                           empty="No batch jobs.")
    return pages.page("Jobs", body, view="jobs", logout_token=sessions.form_token(session), refresh_s=10)
