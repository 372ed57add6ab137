"""Real daemons on loopback and the cluster's keys: a live three-step rotation, forwarded requests' tokens
bound to one node, and gossip nobody can read or redirect.

The daemons are in-process (as tests/daemon/test_cluster.py runs them), each with its own key file that
the test rewrites before a reload (what an operator's SIGHUP does), at 100 ms probe intervals (a death
takes 0.4 s of silence)."""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from pathlib import Path

import aiohttp
import msgspec

from inferd.cluster.identity import verify_token
from inferd.cluster.keyring import Keyring, fingerprint
from inferd.cluster.messages import Load, MemberUpdate, State
from inferd.cluster.wire import Opener
from tests.daemon.harness import cluster_daemons, until
from tests.daemon.test_cluster import LONG, SHORT, _busy, _has_room

OLD = "ab" * 32
NEW = "cd" * 32
CLUSTER = """
[cluster]
bind_port = 0
key_file = "cluster.key"
key_grace_s = {grace}
seeds = [{seeds}]
probe_interval_s = 0.1
probe_timeout_s = 0.05
gossip_interval_s = 0.02
load_interval_s = 0.05
load_max_age_s = 1.0
spill_wait_s = 0.01
"""


@contextlib.asynccontextmanager
async def keyed_cluster(tmp_path: Path, n: int, *, grace_s: float = 60.0):
    """n daemons, the first every other's seed, each reading its own node<i>/cluster.key (OLD at start).
    Yields [(daemon, base_url)] once every node sees every other alive."""
    async with cluster_daemons(tmp_path, n, lambda i, seeds: CLUSTER.format(seeds=seeds, grace=grace_s),
                               key=OLD + "\n") as nodes:
        daemons = [d for d, _ in nodes]
        await until(lambda: _all_alive(daemons), f"all {n} nodes to see each other alive")
        yield nodes


async def _all_alive(daemons: list) -> bool:
    return all(d.state.cluster.counts()["alive"] == len(daemons) for d in daemons)


def watch_states(daemons: list) -> list[tuple[str, str, str]]:
    """Every membership change any node accepts from now on: (observer, member, new state)."""
    seen: list[tuple[str, str, str]] = []
    for d in daemons:
        membership = d.state.cluster.gossip.membership
        before = membership.on_change

        def changed(member, previous, before=before, me=d.state.cluster.node_id) -> None:
            seen.append((me, member.node, member.state.name.lower()))
            if before is not None:
                before(member, previous)

        membership.on_change = changed
    return seen


async def reload_keys(tmp_path: Path, i: int, daemon, keys: list[str]) -> None:
    """Node i's key file now holds `keys` (one a line, primary first); then its reload (a SIGHUP)."""
    node = tmp_path / f"node{i}"
    (node / "cluster.key").write_text("# cluster keys, the first one sends\n" + "\n".join(keys) + "\n")
    result = await daemon.reload(node / "inferd.toml")
    assert result.ok, result.errors


def bad_macs(daemons: list) -> int:
    return sum(d.state.cluster.stats.rejected.get("bad_mac", 0) for d in daemons)


async def test_a_live_cluster_rotates_its_key_in_three_staggered_reloads_without_a_death(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    # A short grace: the old key must be truly gone at the end, and the steps must not need it.
    async with keyed_cluster(tmp_path, 3, grace_s=0.3) as nodes, aiohttp.ClientSession() as http:
        daemons = [d for d, _ in nodes]
        # Each step, one node reloads well before the other two: 2.5 suspicion timeouts (suspect to dead),
        # so a peer that could not read it would have declared it dead.
        stagger = 2.5 * daemons[0].state.cluster.gossip.membership.suspicion_timeout(0)
        seen, rejected = watch_states(daemons), bad_macs(daemons)
        for step, keys in enumerate(([OLD, NEW], [NEW, OLD], [NEW])):        # install, use, remove
            ahead = step % 3
            await reload_keys(tmp_path, ahead, daemons[ahead], keys)
            await asyncio.sleep(stagger)
            for i, d in enumerate(daemons):
                if i != ahead:
                    await reload_keys(tmp_path, i, d, keys)
            await asyncio.sleep(stagger)
        assert [s for s in seen if s[2] == "dead"] == [], seen
        assert bad_macs(daemons) == rejected, "a node dropped a peer's datagram during the rotation"
        assert await _all_alive(daemons)
        # Gossip and spillover still work, under the new key alone (the old one's grace is long over).
        a, a_url = nodes[0]
        assert all(d.state.cluster.keyring.decrypt(b"x", Keyring(bytes.fromhex(OLD)).encrypt(b"x", b"y")) is None
                   for d in daemons)
        await until(lambda: _has_room(a, daemons[1]), "node 0 to hear a peer has room")
        busy = asyncio.ensure_future(http.post(a_url + "/v1/completions", json=LONG))
        try:
            await until(lambda: _busy(a), "node 0's only slot to be taken")
            async with http.post(a_url + "/v1/completions", json=SHORT) as resp:
                assert resp.status == 200
                assert resp.headers["X-Inferd-Node"] != a.state.cluster.node_id
        finally:
            busy.cancel()
        assert [s for s in seen if s[2] == "dead"] == [], seen
    # Each node logged which key is primary: a fingerprint, never the key.
    changes = [r.fields for r in caplog.records if r.msg == "cluster_keys_changed"]
    assert [c["primary_key"] for c in changes] == [fingerprint(bytes.fromhex(OLD))] * 3 + \
        [fingerprint(bytes.fromhex(NEW))] * 6
    secrets = (OLD, NEW, repr(bytes.fromhex(OLD))[2:-1], repr(bytes.fromhex(NEW))[2:-1])
    assert not any(key in r.getMessage() + repr(getattr(r, "fields", "")) for r in caplog.records for key in secrets)


async def test_replacing_the_key_in_one_step_splits_the_cluster(tmp_path):
    """What docs/cluster.md says not to do: the new key alone in one node's file. Its peers cannot read
    what it sends (it still reads theirs, in its grace period), so they declare it dead."""
    async with keyed_cluster(tmp_path, 3) as nodes:
        daemons = [d for d, _ in nodes]
        seen = watch_states(daemons)
        ahead = daemons[0].state.cluster.node_id
        await reload_keys(tmp_path, 0, daemons[0], [NEW])

        async def declared_dead() -> bool:
            return any(member == ahead and state == "dead" for _, member, state in seen)
        await until(declared_dead, "a peer to declare the node with only the new key dead")
        assert bad_macs(daemons[1:]) > 0


async def test_a_captured_forward_token_is_refused_by_every_node_but_its_destination_and_only_once(tmp_path):
    async with keyed_cluster(tmp_path, 3) as nodes, aiohttp.ClientSession() as http:
        (a, a_url), by_id = nodes[0], {d.state.cluster.node_id: url for d, url in nodes}
        captured: list[str] = []
        sign = a.state.cluster.sign
        a.state.cluster.sign = lambda ident: captured.append(sign(ident)) or captured[-1]  # what a sniffer sees
        await until(lambda: _has_room(a, nodes[1][0]), "node 0 to hear a peer has room")
        busy = asyncio.ensure_future(http.post(a_url + "/v1/completions", json=LONG))
        try:
            await until(lambda: _busy(a), "node 0's only slot to be taken")
            body = json.dumps(SHORT).encode()
            async with http.post(a_url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 200
                served_by = resp.headers["X-Inferd-Node"]
        finally:
            busy.cancel()
        assert served_by in by_id and served_by != a.state.cluster.node_id and len(captured) == 1
        token = captured[0]
        ident = verify_token(a.state.cluster.keyring, token)
        assert ident.body_sha256 == hashlib.sha256(body).digest()
        other = next(node for node in by_id if node not in (served_by, a.state.cluster.node_id))

        async def replay(url: str) -> tuple[int, dict]:
            async with http.post(url + "/v1/completions", data=body, headers={
                    "Content-Type": "application/json", "X-Inferd-Forwarded": token}) as resp:
                return resp.status, await resp.json()

        for target, reason in ((by_id[other], "wrong_node"), (a_url, "wrong_node"), (by_id[served_by], "replay")):
            status, answer = await replay(target)
            assert status == 401, (target, answer)
            assert answer["error"]["code"] == "invalid_forwarded_identity"
            assert f"({reason})" in answer["error"]["message"]


async def test_sniffed_gossip_is_unreadable_and_a_copy_sent_to_another_node_is_refused(tmp_path):
    """A spy (a UDP socket this test owns) is made a member of node 0's view, so node 0 sends it what it
    sends every peer, its load report (the tenants' demand) included."""
    loop = asyncio.get_running_loop()
    got: list[bytes] = []

    class Spy(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: object) -> None:
            got.append(data)

    transport, _ = await loop.create_datagram_endpoint(Spy, local_addr=("127.0.0.1", 0))
    try:
        async with keyed_cluster(tmp_path, 2) as nodes, aiohttp.ClientSession() as http:
            (a, a_url), (b, _) = nodes
            async with http.post(a_url + "/v1/completions", json=SHORT) as resp:
                assert resp.status == 200               # tenant `local` now has demand in node 0's reports
            spy_addr = "%s:%d" % transport.get_extra_info("sockname")[:2]
            incarnation = 0

            async def sniffed_a_load() -> bool:
                nonlocal incarnation                    # the spy never acks: keep it alive in node 0's view
                incarnation += 1
                a.state.cluster.gossip.membership.apply(
                    MemberUpdate("spy", spy_addr, "http://127.0.0.1:9", State.ALIVE, incarnation, "spy"))
                return len(got) >= 30
            await until(sniffed_a_load, "datagrams from node 0 to the spy")
            assert not any(b"local" in d for d in got), "a tenant's name is on the wire in clear"
            assert not any(a.state.cluster.node_id.encode() in d for d in got)
            # A key holder (this test) can open them: among them, a load report naming the tenant.
            opener = Opener(Keyring(bytes.fromhex(OLD)), node_id="spy", window_s=30.0)
            packets = [(d, opener.open(d)) for d in got]
            loads = [(d, p) for d, p in packets if isinstance(p.body, Load) and p.body.demand]
            assert loads and loads[0][1].body.demand[0].tenant == "local"
            datagram, packet = loads[0]
            clear = msgspec.msgpack.encode(packet)
            assert not any(clear[i:i + 8] in datagram for i in range(len(clear) - 8))
            # The genuine node 0 -> spy datagram, replayed to node 1: refused (it was sealed for the spy).
            before = b.state.cluster.stats.rejected["bad_mac"]
            transport.sendto(datagram, b.state.cluster.gossip.address)

            async def refused() -> bool:
                return b.state.cluster.stats.rejected["bad_mac"] > before
            await until(refused, "node 1 to refuse the copy")
    finally:
        transport.close()
