"""Cluster gossip on loopback: convergence, failure detection (with false positives under loss), and
forged or replayed datagrams. One result per line on stdout; details as JSON lines on stderr.

Every gossip node is its own process (this script with `--role node`): the real
inferd.cluster.gossip.Gossip on uvloop, bound to 127.0.0.1 on a free port, dropping `--drop-rate` of
its outgoing datagrams on purpose. It prints JSON lines on stdout (`up` once started; `change` on every
membership state change it accepts, with a CLOCK_MONOTONIC stamp, comparable across processes on Linux,
and its member counts; `stats` when asked) and reads JSON commands on stdin (`join`, `stats`). It exits
when its stdin closes or after `--lifetime-s`; the driver kills every node it started on the way out.

  convergence   N nodes start with no seeds; once all are up, all but the first are told (at once) to join
                through the first. Figure: from that moment until every node sees all N alive (its last
                `change` event reaching N alive). The median and max over `--runs` fresh clusters.
  failure       N nodes, every one dropping 10% of what it sends. After convergence and a settling pause,
                `--fp-seconds` of observation with nobody killed: false positives are `dead` verdicts about
                live nodes, one per node that takes one; suspicions (distinct member and incarnation; all
                refuted unless they became false positives) are counted apart. Then one node gets SIGKILL;
                figure: until every other node holds it dead.
  security      One node; crafted datagrams: wrong key, one altered byte, stale (and future) timestamps, sealed
                for another node, a Ping naming no receiver, and valid datagrams sent twice (the second copy
                is the replay). Figure: the node's rejected
                counters (their growth) over the bad datagrams sent; the valid originals must be answered.

  spillover     Three real daemons (sim, H100 Llama 3 8B timing, 8 sequence slots each, a 500 ms TTFT SLO);
                every request goes to node 0, streamed, at 2x and 3.5x the capacity measured on node 0 alone,
                with a 1.5 s deadline. Figures, spillover on / the same run with it off: TTFT goodput (first
                content chunk within the SLO, per second); with it on, node 0's refusals while a peer had a
                free slot. And at 2x with a `--slo` deadline, whole answers within it (bench/cluster_spill.py).
  tpm           Three real daemons; one tenant with tokens_per_minute set sends round-robin over them at three
                times its limit. Figure: admitted tokens per minute / the limit, after a warm-up.
  rotation      Three real daemons rotate their key (install, use, remove; one node --rotation-stagger ahead
                each step) by SIGHUP. Figure: deaths any node declared (bench/cluster_keys.py).
  quota         The same with 8 daemons, few and large requests (0.2 req/s per node, 406 tokens each): the
                hard case for each node's share of the limit (bench/cluster_quota.py).
  convergence_max, partition   bench/cluster_heal.py: the maximum over cold starts through shared seeds, and
                a partition of three daemons healed (run in a fresh network namespace with `unshare -n`).

    .venv/bin/python bench/cluster.py [--only convergence,failure,security,spillover,tpm] [--nodes 16] [--fp-seconds 60]

More measurements plug in as `async def name(args, workdir) -> list[str]` in MEASUREMENTS.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cluster_heal  # noqa: E402 (bench/ is this script's own directory)
import cluster_keys  # noqa: E402
import cluster_quota  # noqa: E402
import cluster_spill  # noqa: E402
from cluster_daemons import detail  # noqa: E402
from daemon_process import run_daemon  # noqa: E402

from inferd.cluster.gossip import Gossip  # noqa: E402
from inferd.cluster.messages import MemberUpdate, Ping, State, Sync  # noqa: E402
from inferd.cluster.wire import Keyring, Sealer, load_key  # noqa: E402
from inferd.config import ClusterConfig  # noqa: E402

START_TIMEOUT_S = 60.0          # every bounded wait of the driver
SETTLE_S = 2.0                  # after convergence, before counting false positives (join updates drain)


# -- the node process ----------------------------------------------------------------------------------
def node_main(args: argparse.Namespace) -> int:
    import uvloop

    def emit(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    async def run() -> None:
        config = ClusterConfig(bind_host="127.0.0.1", bind_port=args.bind_port, key_file=args.key,
                               probe_interval_s=args.probe_interval, probe_timeout_s=args.probe_timeout,
                               gossip_interval_s=args.gossip_interval, sync_interval_s=args.sync_interval,
                               seeds=tuple(s for s in args.seeds.split(",") if s))
        gossip = Gossip(config, Keyring(load_key(args.key)), http_url="http://127.0.0.1:9")
        gossip.drop_rate = args.drop_rate
        await gossip.start()
        membership = gossip.membership

        def changed(member, previous: State | None) -> None:
            counts = membership.counts()
            emit({"ev": "change", "t": time.monotonic(), "member": member.node, "state": member.state.name,
                  "incarnation": member.incarnation,
                  "prev": previous.name if previous is not None else None,
                  **{state.name.lower(): n for state, n in counts.items()}})

        membership.on_change = changed
        emit({"ev": "up", "node": gossip.node_id, "addr": "%s:%d" % gossip.address, "t": time.monotonic()})
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        deadline = loop.time() + args.lifetime_s
        try:
            while (left := deadline - loop.time()) > 0:
                try:
                    line = await asyncio.wait_for(reader.readline(), left)
                except asyncio.TimeoutError:
                    break
                if not line:                        # the driver went away
                    break
                cmd = json.loads(line)
                if cmd["cmd"] == "join":
                    config = msgspec.structs.replace(config, seeds=tuple(cmd["seeds"]))
                    gossip.reconfigure(config)
                elif cmd["cmd"] == "stats":
                    s = gossip.stats
                    emit({"ev": "stats", "sent": s.sent, "received": s.received, "rejected": s.rejected,
                          "probes": s.probes, "indirect_probes": s.indirect_probes, "probe_failures": s.probe_failures,
                          "rtt_count": s.probe_rtt_count, "rtt_sum_s": s.probe_rtt_sum_s})
        finally:
            await gossip.close()

    uvloop.run(run())
    return 0


# -- the driver's view of its nodes ----------------------------------------------------------------------
class Node:
    def __init__(self, proc: asyncio.subprocess.Process, changed: asyncio.Event) -> None:
        self.proc = proc
        self.changed = changed
        self.node_id = ""
        self.addr = ""
        self.up_at = 0.0
        self.counts: dict[str, int] = {"alive": 1}
        self.view: dict[str, tuple[str, float]] = {}       # member -> (state, when it became that)
        self.events: list[dict] = []
        self.full_at: dict[int, float] = {}                # alive count -> first time this node saw it
        self.stats: dict | None = None
        self.killed = False
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            event = json.loads(raw)
            if event["ev"] == "up":
                self.node_id, self.addr, self.up_at = event["node"], event["addr"], event["t"]
            elif event["ev"] == "change":
                self.events.append(event)
                self.view[event["member"]] = (event["state"], event["t"])
                self.counts = {k: event[k] for k in ("alive", "suspect", "dead", "left")}
                self.full_at.setdefault(event["alive"], event["t"])
            elif event["ev"] == "stats":
                self.stats = event
            self.changed.set()

    async def send(self, cmd: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        await self.proc.stdin.drain()

    async def fetch_stats(self, cluster: Cluster) -> dict:
        self.stats = None
        await self.send({"cmd": "stats"})
        await cluster.wait(lambda: self.stats is not None, "stats")
        assert self.stats is not None
        return self.stats


class Cluster:
    """Node processes; every one is killed on exit (also on errors and Ctrl-C)."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args, self.workdir = args, workdir
        self.nodes: list[Node] = []
        self.changed = asyncio.Event()

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for node in self.nodes:
            node.killed = True
            if node.proc.returncode is None:
                node.proc.kill()
        for node in self.nodes:
            await node.proc.wait()
            node.reader.cancel()
        await asyncio.gather(*(n.reader for n in self.nodes), return_exceptions=True)

    async def spawn(self, n: int, *, drop_rate: float = 0.0) -> list[Node]:
        a = self.args
        argv = [sys.executable, str(Path(__file__).resolve()), "--role", "node", "--key", str(a.key),
                "--probe-interval", str(a.probe_interval), "--probe-timeout", str(a.probe_timeout),
                "--gossip-interval", str(a.gossip_interval), "--sync-interval", str(a.sync_interval),
                "--drop-rate", str(drop_rate), "--lifetime-s", str(a.lifetime_s)]
        new = []
        for _ in range(n):
            with (self.workdir / f"node-{len(self.nodes)}.log").open("ab") as log:
                proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE,
                                                            stdout=asyncio.subprocess.PIPE, stderr=log)
            node = Node(proc, self.changed)
            self.nodes.append(node)
            new.append(node)
        await self.wait(lambda: all(node.node_id for node in new), f"{n} nodes up")
        return new

    async def wait(self, condition: Callable[[], bool], what: str, timeout_s: float = START_TIMEOUT_S) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not condition():
            crashed = [i for i, n in enumerate(self.nodes) if n.proc.returncode is not None and not n.killed]
            if crashed:
                log = (self.workdir / f"node-{crashed[0]}.log").read_text()[-2000:]
                raise RuntimeError(f"node {crashed[0]} exited ({self.nodes[crashed[0]].proc.returncode}): {log}")
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), min(left, 0.5))
            except asyncio.TimeoutError:
                pass

    async def join_all(self, nodes: list[Node]) -> float:
        """Tell all but the first node to join through the first; the moment the commands went out."""
        started = time.monotonic()
        await asyncio.gather(*(node.send({"cmd": "join", "seeds": [nodes[0].addr]}) for node in nodes[1:]))
        return started


def all_see_all(nodes: list[Node]) -> bool:
    return all(node.counts.get("alive") == len(nodes) for node in nodes)


# -- measurements ----------------------------------------------------------------------------------------
async def convergence(args: argparse.Namespace, workdir: Path) -> list[str]:
    n, times = args.nodes, []
    for run in range(args.runs):
        async with Cluster(args, workdir) as cluster:
            nodes = await cluster.spawn(n)
            await asyncio.sleep(0.5)                   # let the processes finish starting up (imports, first loops)
            started = await cluster.join_all(nodes)
            await cluster.wait(lambda: all_see_all(nodes), f"{n} nodes to converge")
            per_node = sorted(node.full_at[n] - started for node in nodes)
            times.append(per_node[-1])
            detail("convergence", run=run, nodes=n, seconds=round(per_node[-1], 3),
                   per_node=[round(t, 3) for t in per_node])
    summary = f"median of {len(times)}, max {max(times):.2f} s" if len(times) > 1 else "1 run"
    return [f"convergence N={n}: {statistics.median(times):.2f} s ({summary})"]


async def failure_detection(args: argparse.Namespace, workdir: Path) -> list[str]:
    n, drop = args.nodes, args.drop_rate
    async with Cluster(args, workdir) as cluster:
        nodes = await cluster.spawn(n, drop_rate=drop)
        await cluster.join_all(nodes)
        await cluster.wait(lambda: all_see_all(nodes), f"{n} nodes to converge at {drop:.0%} drop")
        await asyncio.sleep(SETTLE_S)
        marks = [len(node.events) for node in nodes]
        await asyncio.sleep(args.fp_seconds)
        window = [e for node, mark in zip(nodes, marks) for e in node.events[mark:]]
        false_dead = sum(1 for e in window if e["state"] == "DEAD")                   # marks, any node's
        dead_episodes = len({(e["member"], e["incarnation"]) for e in window if e["state"] == "DEAD"})
        suspicions = len({(e["member"], e["incarnation"]) for e in window if e["state"] == "SUSPECT"})

        victim, others = nodes[-1], nodes[:-1]
        killed = time.monotonic()
        victim.killed = True
        victim.proc.kill()                              # SIGKILL: no goodbye
        await cluster.wait(lambda: all(o.view.get(victim.node_id, ("",))[0] == "DEAD" for o in others),
                           "every other node to hold the killed one dead")
        per_node = sorted(o.view[victim.node_id][1] - killed for o in others)
        after = [e for node, mark in zip(others, marks) for e in node.events[mark:]
                 if e["t"] >= killed and e["member"] != victim.node_id]
        stats = [await o.fetch_stats(cluster) for o in others[:3]]
    detail("failure", nodes=n, drop_rate=drop, fp_seconds=args.fp_seconds, false_dead=false_dead,
           dead_episodes=dead_episodes, suspicions=suspicions, detection_s=round(per_node[-1], 3),
           first_detection_s=round(per_node[0], 3),
           other_changes_after_kill=len(after), sample_stats=stats)
    return [f"failure detection: {per_node[-1]:.2f} s, false positives: {false_dead} "
            f"(suspicions: {suspicions} in {args.fp_seconds:g} s; N={n}, drop {drop:.0%})"]


async def forged_replayed(args: argparse.Namespace, workdir: Path) -> list[str]:
    loop = asyncio.get_running_loop()
    per_kind = 20

    class Inbox(asyncio.DatagramProtocol):
        def __init__(self) -> None:
            self.got = 0

        def datagram_received(self, data: bytes, addr: object) -> None:
            self.got += 1

    async with Cluster(args, workdir) as cluster:
        (node,) = await cluster.spawn(1)
        target = (node.addr.rsplit(":", 1)[0], int(node.addr.rsplit(":", 1)[1]))
        transport, inbox = await loop.create_datagram_endpoint(Inbox, local_addr=("127.0.0.1", 0))
        try:
            here = "%s:%d" % transport.get_extra_info("sockname")[:2]
            right, wrong = Keyring(load_key(str(args.key))), Keyring(os.urandom(32))
            claim = Sync((MemberUpdate("intruder", here, "http://127.0.0.1:9", State.ALIVE, 9, "intruder"),), True)
            rng = random.Random(1)
            bad: dict[str, list[bytes]] = {"wrong key": [], "altered byte": [], "stale": [], "future": [],
                                           "other receiver": [], "no receiver": [], "replay": []}
            good: list[bytes] = []
            forger, peer = Sealer("forger", wrong), Sealer("peer", right)
            old = Sealer("old-peer", right, wall_clock=lambda: time.time() - 3600)
            ahead = Sealer("ahead-peer", right, wall_clock=lambda: time.time() + 3600)
            me = node.node_id
            for i in range(per_kind):
                bad["wrong key"].append(forger.seal(claim, (), me)[0])
                datagram = bytearray(peer.seal(Ping(1000 + i, me), (), me)[0])
                datagram[rng.randrange(3, len(datagram))] ^= 1 << rng.randrange(8)     # past the magic
                bad["altered byte"].append(bytes(datagram))
                bad["stale"].append(old.seal(claim, (), me)[0])
                bad["future"].append(ahead.seal(claim, (), me)[0])
                bad["other receiver"].append(peer.seal(Ping(2000 + i, me), (), "127.0.0.1:9")[0])   # a copy of A->B
                bad["no receiver"].append(peer.seal(Ping(3000 + i, me), (), "")[0])
                original = peer.seal(Ping(i, me), (), me)[0]
                good.append(original)
                bad["replay"].append(original)
            before = await node.fetch_stats(cluster)
            sent = 0
            for datagram in good + [d for kind in bad.values() for d in kind]:   # originals before their replays
                transport.sendto(datagram, target)
                sent += 1
                if sent % 10 == 0:
                    await asyncio.sleep(0.005)             # paced: a burst could overflow the node's socket buffer
            total_bad = sum(len(v) for v in bad.values())

            async def received() -> int:
                return (await node.fetch_stats(cluster))["received"] - before["received"]

            deadline = loop.time() + 10.0
            while await received() < sent and loop.time() < deadline:
                await asyncio.sleep(0.05)
            after = await node.fetch_stats(cluster)
        finally:
            transport.close()
    reasons = {k: v - before["rejected"].get(k, 0) for k, v in after["rejected"].items()}
    rejected = sum(reasons.values())
    detail("security", sent_bad=total_bad, rejected=rejected, reasons=reasons, valid_sent=len(good),
           valid_answered=inbox.got, received=after["received"] - before["received"])
    return [f"forged/replayed rejected: {rejected}/{total_bad} (valid originals answered: {inbox.got}/{len(good)})"]


async def spillover(args: argparse.Namespace, workdir: Path) -> list[str]:
    loads = tuple(float(x) for x in args.spill_loads.split(","))
    out = await cluster_spill.spillover_ttft(args.spill_seconds, args.capacity_seconds, args.slo, loads,
                                             args.spill_deadline)
    detail("spillover", **out)
    return cluster_spill.lines(out)


async def tpm(args: argparse.Namespace, workdir: Path) -> list[str]:
    lines = []
    for shared in (True, False) if args.tpm_baseline else (True,):
        out = await cluster_quota.cluster_tpm_ratio(args.tpm_seconds, args.tpm_warmup, shared=shared)
        detail("tpm", **out)
        label = "cluster TPM ratio" if shared else "cluster TPM ratio without shared quotas (baseline)"
        lines.append(f"{label}: {out['ratio']:.2f} (admitted {out['admitted_tpm']:.0f} tokens/min, limit "
                     f"{out['limit_tpm']}, offered {out['offered_tpm']} round-robin over 3 nodes)")
    return lines


Measurement = Callable[[argparse.Namespace, Path], Awaitable[list[str]]]
MEASUREMENTS: dict[str, Measurement] = {
    "convergence": convergence,
    "failure": failure_detection,
    "security": forged_replayed,
    "spillover": spillover,
    "tpm": tpm,
    "rotation": cluster_keys.rotation,
    "quota": cluster_quota.quota,
    "convergence_max": cluster_heal.convergence_max,
    "partition": cluster_heal.partition,
}


async def run_all(args: argparse.Namespace, names: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="inferd-cluster-bench-") as tmp:
        workdir = Path(tmp)
        args.key = workdir / "cluster.key"
        args.key.write_text(os.urandom(32).hex() + "\n")
        args.key.chmod(0o600)
        for name in names:
            for line in await MEASUREMENTS[name](args, workdir):
                print(line, flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(MEASUREMENTS),
                   help=f"comma-separated measurements to run, of: {', '.join(MEASUREMENTS)} (default: all)")
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--runs", type=int, default=3, help="convergence: fresh clusters to measure")
    cluster_heal.add_convergence_arguments(p, runs_flag="--cold-runs")
    p.add_argument("--reconnect-interval", type=float, default=1.0, help="partition: [cluster] reconnect_interval_s")
    p.add_argument("--fp-seconds", type=float, default=60.0, help="failure: observation window for false positives")
    p.add_argument("--drop-rate", type=float, default=0.1, help="failure: outgoing datagrams each node drops")
    p.add_argument("--probe-interval", type=float, default=0.2)
    p.add_argument("--probe-timeout", type=float, default=0.1)
    p.add_argument("--gossip-interval", type=float, default=0.2)
    p.add_argument("--sync-interval", type=float, default=30.0)
    p.add_argument("--lifetime-s", type=float, default=900.0, help="a node process exits after this long regardless")
    p.add_argument("--spill-seconds", type=float, default=30.0, help="spillover: open-loop arrivals, each way")
    p.add_argument("--capacity-seconds", type=float, default=8.0, help="spillover: node 0's capacity measurement")
    p.add_argument("--slo", type=float, default=5.0, help="spillover: a request counts within this many seconds")
    p.add_argument("--spill-loads", default="2,3.5", help="spillover: offered loads, as multiples of node 0's capacity")
    p.add_argument("--spill-deadline", type=float, default=1.5, help="spillover: streamed requests' deadline (s)")
    p.add_argument("--tpm-seconds", type=float, default=65.0)
    p.add_argument("--tpm-warmup", type=float, default=35.0,
                   help="tpm: not measured (the buckets start full: a limit's worth of burst, drained at 2x the limit)")
    p.add_argument("--tpm-baseline", action="store_true", help="tpm: also run with shared_quotas = false")
    p.add_argument("--rotation-stagger", type=float, default=10.0,
                   help="rotation: seconds one node reloads ahead of the others at each step")
    p.add_argument("--rotation-baseline", action="store_true",
                   help="rotation: then also replace the key in one step (what splits a cluster)")
    cluster_quota.add_arguments(p)
    p.add_argument("--role", choices=("driver", "node", "daemon"), default="driver", help=argparse.SUPPRESS)
    p.add_argument("--key", help=argparse.SUPPRESS)
    p.add_argument("--seeds", default="", help=argparse.SUPPRESS)          # node: "host:port,..." to join at start
    p.add_argument("--bind-port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "node":
        return node_main(args)
    if args.role == "daemon":
        run_daemon(args.config)
        return 0
    names = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in names if name not in MEASUREMENTS]
    if unknown:
        p.error(f"unknown measurement(s) {', '.join(unknown)}; known: {', '.join(MEASUREMENTS)}")
    try:
        asyncio.run(run_all(args, names))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
