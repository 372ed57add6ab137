"""Per-tenant cost controls: `max_spend` per UTC day or month, `max_tokens_per_day`, from the usage ledger.

Spend is what the ledger records (cost from [prices], prompt + completion tokens). At start the daemon
loads each budgeted tenant's spend in the current periods from the ledger (`load`), and every row
recorded afterwards adds to it (`add`), so budgets survive restarts. In a cluster, peers' spend
arrives with their load reports (`set_peers`): each node enforces the sum. Checked with the cheap
checks, before the body is read: a tenant that has spent its budget gets 429 `budget_exceeded`,
naming the budget and when it resets (Retry-After: until then). Crossing `budget_warn_fraction`
is reported once per period (`crossed`: the caller audits it) and shows in the metrics.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone

from inferd.config import TenantConfig, TenantRegistry

Clock = Callable[[], float]
_ADJ = {"day": "daily", "month": "monthly"}
# (tenant, spend period start, day start) -> (the peers' cost in that period, their tokens that day)
PeerSpend = Callable[[str, float, float], tuple[float, int]]


class BudgetExceeded(Exception):
    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


# period -> [start, end) of the last period asked for: every recorded row asks, and datetime arithmetic
# for each would cost more than the rest of the budget's bookkeeping.
_last_period: dict[str, tuple[float, float]] = {}


def period_start(now: float, period: str) -> float:
    """Unix seconds of the start of the UTC day or month containing `now`."""
    return _period(now, period)[0]


def period_end(now: float, period: str) -> float:
    return _period(now, period)[1]


def _period(now: float, period: str) -> tuple[float, float]:
    bounds = _last_period.get(period)
    if bounds is None or not bounds[0] <= now < bounds[1]:
        bounds = _last_period[period] = _bounds(now, period)
    return bounds


def _bounds(now: float, period: str) -> tuple[float, float]:
    t = datetime.fromtimestamp(now, timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    if period != "month":
        return t.timestamp(), t.timestamp() + 86_400
    t = t.replace(day=1)
    end = t.replace(year=t.year + 1, month=1) if t.month == 12 else t.replace(month=t.month + 1)
    return t.timestamp(), end.timestamp()


class _Spend:
    __slots__ = ("period", "cost", "day", "tokens", "warned")

    def __init__(self, period: float, day: float) -> None:
        self.period, self.cost = period, 0.0      # the spend period's start, and cost since
        self.day, self.tokens = day, 0            # today's start, and tokens since
        self.warned = -1.0                        # the period start of the last warning


def budgeted(cfg: TenantConfig) -> bool:
    return cfg.max_spend is not None or cfg.max_tokens_per_day is not None


class Budgets:
    """Loop thread only."""

    def __init__(self, tenants: TenantRegistry, clock: Clock = time.time) -> None:
        self.tenants = tenants
        self._clock = clock
        self._spend: dict[str, _Spend] = {}
        self._peers: PeerSpend | None = None

    def now(self) -> float:
        return self._clock()

    def set_peers(self, peers: PeerSpend | None) -> None:
        self._peers = peers

    def _get(self, tenant: str, now: float) -> _Spend:
        cfg = self.tenants.get(tenant)
        period, day = period_start(now, cfg.spend_period), period_start(now, "day")
        st = self._spend.get(tenant)
        if st is None:
            st = self._spend[tenant] = _Spend(period, day)
        if st.period != period:               # a new period: nothing spent yet
            st.period, st.cost = period, 0.0
        if st.day != day:
            st.day, st.tokens = day, 0
        return st

    def load(self, tenant: str, cost: float, tokens_today: int) -> None:
        """This node's spend from the ledger at start (the current period's cost, today's tokens)."""
        st = self._get(tenant, self._clock())
        st.cost, st.tokens = cost, tokens_today

    def add(self, tenant: str, cost: float, tokens: int) -> str | None:
        """A recorded row. Returns a message when this crosses the tenant's warning threshold (once a period)."""
        now = self._clock()
        st = self._get(tenant, now)
        st.cost += cost
        st.tokens += tokens
        cfg = self.tenants.get(tenant)
        ratio = self.used(tenant)
        if ratio is None or ratio < cfg.budget_warn_fraction or st.warned == st.period:
            return None
        st.warned = st.period
        return f"tenant {tenant!r} has used {ratio:.0%} of its budget (warning at {cfg.budget_warn_fraction:.0%})"

    def totals(self, tenant: str) -> tuple[float, int]:
        """(cost this period, tokens today), this node's and its peers'."""
        st = self._get(tenant, self._clock())
        peer_cost, peer_tokens = self._peers(tenant, st.period, st.day) if self._peers is not None else (0.0, 0)
        return st.cost + peer_cost, st.tokens + peer_tokens

    def own(self, tenant: str) -> tuple[float, int]:
        """This node's own spend (what it tells its peers)."""
        st = self._get(tenant, self._clock())
        return st.cost, st.tokens

    def used(self, tenant: str) -> float | None:
        """The larger of spend / max_spend and tokens / max_tokens_per_day; None when unbudgeted."""
        cfg = self.tenants.get(tenant)
        if not budgeted(cfg):
            return None
        cost, tokens = self.totals(tenant)
        ratios = []
        if cfg.max_spend is not None:
            ratios.append(cost / cfg.max_spend)
        if cfg.max_tokens_per_day is not None:
            ratios.append(tokens / cfg.max_tokens_per_day)
        return max(ratios)

    def check(self, tenant: str) -> None:
        """BudgetExceeded if the tenant has spent a budget (with what and when it resets)."""
        cfg = self.tenants.get(tenant)
        if not budgeted(cfg):
            return
        now = self._clock()
        cost, tokens = self.totals(tenant)
        if cfg.max_spend is not None and cost >= cfg.max_spend:
            end = period_end(now, cfg.spend_period)
            raise BudgetExceeded(f"tenant {tenant!r} has spent its {_ADJ[cfg.spend_period]} budget of "
                                 f"{cfg.max_spend:g} (spent {cost:.4g}); it resets at {_iso(end)}", end - now)
        if cfg.max_tokens_per_day is not None and tokens >= cfg.max_tokens_per_day:
            end = period_end(now, "day")
            raise BudgetExceeded(f"tenant {tenant!r} has used its {cfg.max_tokens_per_day} tokens for today; "
                                 f"it resets at {_iso(end)}", end - now)

    def snapshot(self) -> dict[str, float]:
        """Tenant -> budget used (0..), for budgeted tenants seen so far."""
        return {t: ratio for t in list(self._spend) if (ratio := self.used(t)) is not None}


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


async def load_spend(budgets: Budgets, ledger, node: str) -> None:
    """Each budgeted tenant's spend in its current periods, from the rows this node recorded (peers
    report theirs: a shared PostgreSQL ledger holds every node's rows, counted once that way)."""
    now = budgets.now()
    for tenant in budgets.tenants.names:
        cfg = budgets.tenants.get(tenant)
        if not budgeted(cfg):
            continue
        period, day = period_start(now, cfg.spend_period), period_start(now, "day")
        cost, tokens = await ledger.spent(tenant, period, node)
        if period != day:                   # a monthly budget: today's tokens are a query of their own
            _, tokens = await ledger.spent(tenant, day, node)
        budgets.load(tenant, cost, tokens)
