"""The console's Now view: each loaded engine's batch fill, KV use, queue depth and oldest wait, tokens/s."""
from __future__ import annotations

from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.console import pages

REFRESH_S = 5


async def render(request: web.Request, session, sessions) -> str:
    state = request.app[keys.STATE]
    rows = []
    for name, engine in sorted(state.engines.items()):
        try:
            stats, info = engine.stats(), engine.info
        except Exception:  # one engine failing must not take the page down
            continue
        queued, oldest_s = state.tenancy.queue_for(name, engine).pressure()
        fill = stats.running / info.max_batch_size if info.max_batch_size else 0.0
        kv = stats.kv_blocks_used / stats.kv_blocks_total if stats.kv_blocks_total else 0.0
        rows.append([pages.esc(name), pages.esc(info.version), pages.esc(info.backend),
                     pages.esc(info.precision or "-"),
                     f"{pages.percent(fill)} ({stats.running} of {info.max_batch_size})",
                     f"{pages.percent(kv)} ({stats.kv_blocks_used:,} of {stats.kv_blocks_total:,} blocks)",
                     f"{queued} ({pages.number(oldest_s, 's', 1)} oldest)",
                     pages.number(stats.tokens_per_s, "tokens/s"),
                     f'<div class="spark" data-engine="{pages.esc(name)}" data-field="tokens_per_s" '
                     f'aria-label="tokens/s over the last 15 minutes"></div>'])
    body = pages.table(("model", "version", "backend", "precision", "batch fill", "KV cache", "queued",
                        "throughput", "last 15 min"), rows, empty="No engine is loaded.")
    return pages.page("Now", body + f"<p>Refreshed every {REFRESH_S} s.</p>", view="now",
                      logout_token=sessions.form_token(session), refresh_s=REFRESH_S)
