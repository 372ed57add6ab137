"""Ledger: recording (grouped, committed on return), totals per tenant/model/UTC day, paging, spend."""
from __future__ import annotations

import asyncio
import calendar
import time

import msgspec
import pytest

from inferd.store import REQUEST_DEADLINE, Ledger, LedgerRow, StoreError, UsageFilter, UsageTotal, totals_text

DAY1 = calendar.timegm((2026, 11, 23, 0, 0, 0))
DAY2 = DAY1 + 86_400


def row(i: int = 0, **changes) -> LedgerRow:
    base = LedgerRow(request_id=f"req-{i}", tenant="acme", key_id="key-1", model="llama", version="v1", node="n1",
                     endpoint="chat.completions", stream=False, prompt_tokens=10, cached_tokens=2,
                     completion_tokens=5, status=200, finish_reason="stop", queue_s=0.01, prefill_s=0.02,
                     decode_s=0.3, total_s=0.35, cost=0.5, finished_at=DAY1 + 3600)
    return msgspec.structs.replace(base, **changes)


@pytest.fixture
def ledger(db) -> Ledger:
    return Ledger(db)


async def test_a_recorded_row_reads_back_exactly(ledger):
    odd = row(1, key_id=None, stream=True, finish_reason=None, queue_s=None, prefill_s=None, decode_s=None,
              status=499, cost=0.0)
    await ledger.record(row(0))
    await ledger.record(odd)
    assert [r for _, r in await ledger.rows(UsageFilter())] == [row(0), odd]


async def test_concurrent_records_share_statements_and_commits(db, ledger):
    before = db.stats().commits
    await asyncio.gather(*(ledger.record(row(i)) for i in range(500)))
    stats = db.stats()
    assert stats.commits - before < 50 and stats.pending_writes == 0
    assert len(await ledger.rows(UsageFilter(), limit=1000)) == 500


async def test_a_bad_row_fails_only_its_own_record(ledger):
    bad = row(99, prompt_tokens=2**70)      # not representable in a BIGINT
    results = await asyncio.gather(*(ledger.record(r) for r in [row(1), bad, row(2)]), return_exceptions=True)
    assert results[0] is None and results[2] is None and isinstance(results[1], StoreError)
    assert [r.request_id for _, r in await ledger.rows(UsageFilter())] == ["req-1", "req-2"]


async def test_totals_group_by_utc_day_tenant_and_model(ledger):
    rows = [
        row(1, finished_at=DAY1 + 10), row(2, finished_at=DAY1 + 86_399.5, cost=0.25),     # 2026-11-23
        row(3, finished_at=DAY2, model="mistral"),                                         # 2026-11-24
        row(4, finished_at=DAY2 + 5, tenant="beta", prompt_tokens=100, cached_tokens=0, completion_tokens=1),
        row(5, finished_at=DAY2 + 6, tenant="Zeta"),
    ]
    for r in rows:
        await ledger.record(r)
    totals = await ledger.totals(UsageFilter())
    assert totals == [
        UsageTotal(tenant="acme", model="llama", day="2026-11-23", requests=2, prompt_tokens=20, cached_tokens=4,
                   completion_tokens=10, cost=0.75),
        UsageTotal(tenant="Zeta", model="llama", day="2026-11-24", requests=1, prompt_tokens=10, cached_tokens=2,
                   completion_tokens=5, cost=0.5),
        UsageTotal(tenant="acme", model="mistral", day="2026-11-24", requests=1, prompt_tokens=10, cached_tokens=2,
                   completion_tokens=5, cost=0.5),
        UsageTotal(tenant="beta", model="llama", day="2026-11-24", requests=1, prompt_tokens=100, cached_tokens=0,
                   completion_tokens=1, cost=0.5),
    ]
    assert all(type(t.requests) is int and type(t.prompt_tokens) is int and type(t.cost) is float for t in totals)


async def test_totals_by_version_keep_each_versions_cost_apart(ledger):
    """A precision tier is a version: its cost, at its own price, is a total of its own."""
    for r in (row(1, finished_at=DAY1, version="bf16", cost=0.5), row(2, finished_at=DAY1 + 1, version="int8",
              cost=0.125), row(3, finished_at=DAY1 + 2, version="int8", cost=0.125)):
        await ledger.record(r)
    by_version = await ledger.totals(UsageFilter(), by_version=True)
    assert [(t.version, t.requests, t.cost) for t in by_version] == [("bf16", 1, 0.5), ("int8", 2, 0.25)]
    assert [(t.version, t.requests, t.cost) for t in await ledger.totals(UsageFilter())] == [(None, 3, 0.75)]
    csv_lines = totals_text(by_version, "csv", by_version=True).splitlines()
    assert csv_lines[0].startswith("tenant,model,version,day,") and csv_lines[2].startswith("acme,llama,int8,")
    assert "version" not in totals_text(await ledger.totals(UsageFilter()), "csv").splitlines()[0]


async def test_filters_narrow_totals_and_rows(ledger):
    for r in [row(1, finished_at=DAY1), row(2, finished_at=DAY2), row(3, finished_at=DAY2, tenant="beta"),
              row(4, finished_at=DAY2 + 1, model="mistral")]:
        await ledger.record(r)

    async def ids(f: UsageFilter) -> list[str]:
        return [r.request_id for _, r in await ledger.rows(f)]

    assert await ids(UsageFilter(tenant="acme")) == ["req-1", "req-2", "req-4"]
    assert await ids(UsageFilter(model="mistral")) == ["req-4"]
    assert await ids(UsageFilter(since=DAY2)) == ["req-2", "req-3", "req-4"]            # inclusive
    assert await ids(UsageFilter(until=DAY2)) == ["req-1"]                              # exclusive
    assert await ids(UsageFilter(tenant="acme", since=DAY1, until=DAY2 + 1)) == ["req-1", "req-2"]
    assert [(t.day, t.requests) for t in await ledger.totals(UsageFilter(tenant="acme", model="llama"))] == \
        [("2026-11-23", 1), ("2026-11-24", 1)]
    assert await ledger.totals(UsageFilter(tenant="nobody")) == []


async def test_rows_page_in_recording_order(ledger):
    for i in range(7):
        await ledger.record(row(i, tenant="acme" if i % 2 == 0 else "beta"))
    pages, after = [], 0
    while page := await ledger.rows(UsageFilter(tenant="acme"), limit=2, after=after):
        pages.append([r.request_id for _, r in page])
        after = page[-1][0]
    assert pages == [["req-0", "req-2"], ["req-4", "req-6"]]
    seqs = [seq for seq, _ in await ledger.rows(UsageFilter())]
    assert seqs == sorted(seqs) and len(set(seqs)) == 7
    with pytest.raises(ValueError, match="limit"):
        await ledger.rows(UsageFilter(), limit=0)


async def test_spent_sums_cost_and_tokens_since_a_time(ledger):
    assert await ledger.spent("acme", 0) == (0.0, 0)
    await ledger.record(row(1, finished_at=DAY1, cost=1.5))
    await ledger.record(row(2, finished_at=DAY2, cost=0.25, prompt_tokens=7, completion_tokens=3))
    await ledger.record(row(3, finished_at=DAY2, tenant="beta", cost=9.0))
    assert await ledger.spent("acme", DAY1) == (1.75, 25)
    assert await ledger.spent("acme", DAY2) == (0.25, 10)
    assert await ledger.spent("acme", DAY2 + 1) == (0.0, 0)


class SlowStore:
    """A Database stand-in for the ledger: each execute_many notes the bound it ran under, then does what
    `outcome` says (None: commits)."""

    where = "slow-store"

    def __init__(self, outcome=None) -> None:
        from inferd.store.sqlite import SqliteDatabase

        self._bounds = SqliteDatabase("/nonexistent/unused.db", timeout_s=5.0)     # its call_timeout() rule
        self.outcome, self.deadlines, self.committed = outcome, [], []

    async def execute_many(self, sql, rows, *, ordered=False):
        self.deadlines.append((REQUEST_DEADLINE.get(), self._bounds.call_timeout()))
        if self.outcome is not None:
            raise self.outcome
        self.committed += rows


async def test_the_group_commit_is_not_bound_by_the_deadline_of_the_request_that_started_it():
    store = SlowStore()
    ledger = Ledger(store)

    async def request(i: int, deadline_s: float) -> None:       # each request sets its own deadline
        REQUEST_DEADLINE.set(time.monotonic() + deadline_s)
        await ledger.record(row(i))

    await asyncio.gather(asyncio.ensure_future(request(0, 0.01)), asyncio.ensure_future(request(1, 600)))
    assert len(store.committed) == 2
    assert store.deadlines and all(d is None and bound == 5.0 for d, bound in store.deadlines)


async def test_a_commit_that_timed_out_fails_its_callers_but_starts_no_outage():
    from inferd.store import StoreTimeout, StoreUnavailable

    ledger = Ledger(SlowStore(StoreTimeout("slow-store: write: no answer within 5.00 s")))
    with pytest.raises(StoreTimeout):
        await ledger.record(row(0))
    assert ledger.failure is None and ledger.unavailable_for() == 0     # readiness and requests unaffected
    ledger = Ledger(SlowStore(StoreUnavailable("slow-store: disk is full")))
    with pytest.raises(StoreUnavailable):
        await ledger.record(row(0))
    assert ledger.unavailable_for() > 0                                 # a real failure still does


async def test_a_commit_that_timed_out_while_committing_reports_what_became_of_it():
    from inferd.store import StoreTimeout

    committed = asyncio.get_running_loop().create_future()
    store = SlowStore(StoreTimeout("slow-store: write: commit under way", pending=committed))
    ledger = Ledger(store)
    recording = asyncio.ensure_future(ledger.record(row(0)))
    while not store.deadlines:              # until the group commit has tried
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not recording.done()             # it waits for the COMMIT's outcome rather than report "not recorded"
    committed.set_result(None)
    await recording                          # committed after all: its caller is told so
