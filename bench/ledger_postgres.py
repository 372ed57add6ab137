"""The ledger on PostgreSQL: rows/s a cluster's nodes commit, with and without ordered writes.

    .venv/bin/python bench/ledger_postgres.py [--nodes 1 3] [--seconds 5] [--groups-in-flight 4]

Starts a throwaway PostgreSQL server from the distribution's binaries (as the tests do, on a loopback
port; it is removed afterwards). Each "node" is its own PostgresDatabase (its own connection pool),
writing ledger rows in groups of 200 (the ledger's group size, inferd.store.ledger._MAX_BATCH) with
--groups-in-flight groups at once, for --seconds. Two modes, for each --nodes count:
- ordered: what the ledger does (`execute_many(..., ordered=True)`: an advisory lock held through
  COMMIT, so a billing export paged by seq never skips a row; the cluster's groups take turns);
- unordered: the same writes without the lock (what the ledger did before; exports could skip rows).
Prints rows/s for each. A single node's ledger keeps one group in flight (Ledger._flush), so the
`--groups-in-flight 1` figure is what one node's ledger can do; more stand for more nodes.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inferd.store.ledger import _INSERT, _MAX_BATCH, LedgerRow, _values  # noqa: E402
from inferd.store.postgres import PostgresDatabase  # noqa: E402
from tests.pg_server import script_server  # noqa: E402

ROW = LedgerRow(request_id="bench", tenant="t", key_id=None, model="m", version="v", node="n",
                endpoint="completions", stream=False, prompt_tokens=10, cached_tokens=0, completion_tokens=20,
                status=200, finish_reason="length", queue_s=0.0, prefill_s=0.0, decode_s=0.0, total_s=0.0,
                cost=0.0, finished_at=time.time())


async def run(dsn: str, nodes: int, ordered: bool, seconds: float, in_flight: int) -> float:
    dbs = [PostgresDatabase(dsn) for _ in range(nodes)]
    for db in dbs:
        await db.open()
    group = [_values(ROW)] * _MAX_BATCH
    rows = [0]
    end = time.monotonic() + seconds

    async def writer(db: PostgresDatabase) -> None:
        while time.monotonic() < end:
            await db.execute_many(_INSERT, group, ordered=ordered)
            rows[0] += len(group)

    started = time.monotonic()
    try:
        await asyncio.gather(*(writer(db) for db in dbs for _ in range(in_flight)))
    finally:
        for db in dbs:
            await db.close()
    return rows[0] / (time.monotonic() - started)


async def main(args: argparse.Namespace) -> None:
    with script_server() as server:
        for nodes in args.nodes:
            for ordered in (True, False):
                dsn = server.create_database()
                try:
                    rate = await run(dsn, nodes, ordered, args.seconds, args.groups_in_flight)
                finally:
                    server.drop_database(dsn)
                print(f"{nodes} node(s), {args.groups_in_flight} group(s) of {_MAX_BATCH} in flight each, "
                      f"{'ordered  ' if ordered else 'unordered'}: {rate:,.0f} rows/s", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--groups-in-flight", type=int, default=1)
    asyncio.run(main(parser.parse_args()))
