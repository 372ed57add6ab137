"""Admin rollout controls through the daemon: start (defined in the body), read, pause, promote,
conflicting controls answer 409, and every change is audited with the caller as actor."""
from __future__ import annotations

import aiohttp

from inferd.observability.audit import read_audit
from tests.daemon.harness import complete, running, sim_model, write_config


async def test_operator_starts_pauses_and_promotes_a_rollout_and_each_step_is_audited(tmp_path):
    path = write_config(tmp_path / "c.toml", {"m": sim_model(["a", "b"], time_scale=0.0)},
                        '[aliases.chat]\nsplit = { "m@a" = 1 }\n')
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        async with http.post(f"{url}/admin/rollouts/chat/start",
                             json={"stable": "m@a", "candidate": "m@b", "steps": [0.5, 1.0],
                                   "reason": "try b"}) as resp:
            assert resp.status == 200
            state = await resp.json()
        assert state["phase"] == "running" and state["candidate_weight"] == 0.5
        served = {(await complete(http, url, "chat", user=f"u{i}"))[1]["X-Inferd-Model-Version"] for i in range(40)}
        assert served == {"a+simulated", "b+simulated"}
        async with http.post(f"{url}/admin/rollouts/chat/pause", json={"reason": "look at dashboards"}) as resp:
            assert resp.status == 200 and (await resp.json())["phase"] == "paused"
        async with http.post(f"{url}/admin/rollouts/chat/start") as resp:
            assert resp.status == 409 and (await resp.json())["error"]["code"] == "rollout_conflict"
        async with http.post(f"{url}/admin/rollouts/chat/promote") as resp:
            assert resp.status == 200 and (await resp.json())["phase"] == "promoted"
        served = {(await complete(http, url, "chat", user=f"v{i}"))[1]["X-Inferd-Model-Version"] for i in range(20)}
        assert served == {"b+simulated"}
        async with http.get(f"{url}/admin/rollouts/chat") as resp:
            assert (await resp.json())["phase"] == "promoted"
        async with http.get(f"{url}/admin/rollouts/nope") as resp:
            assert resp.status == 404
        async with http.post(f"{url}/admin/rollouts/chat/start", json={"stable": "m@a"}) as resp:
            assert resp.status == 400
    records = read_audit(tmp_path / "audit.jsonl")
    assert [r["action"] for r in records] == ["rollout.start", "rollout.pause", "rollout.promote"]
    assert {r["actor"] for r in records} == {"tenant:local"}       # auth off: the anonymous tenant acts
    assert records[0]["reason"] == "try b" and records[1]["reason"] == "look at dashboards"
    assert records[2]["before"]["phase"] == "paused" and records[2]["after"]["weights"]["m@b"] == 1.0
