"""Canary rollouts through the real daemon: a candidate that costs more, or fails requests, is rolled
back automatically; the audit log says why; every later request lands on stable."""
from __future__ import annotations

import aiohttp
import pytest

from inferd.engine.base import EngineUnavailable
from inferd.models.factory import build_engine
from inferd.observability.audit import read_audit
from tests.daemon.harness import complete, running, sim_model, write_config

CANARY = '''
[aliases.chat]
split = { "m@stable" = 1 }
[rollouts.chat]
stable = "m@stable"
candidate = "m@cand"
steps = [0.5, 1.0]
min_dwell_s = 600
start = "on_load"
window_size = 64
[rollouts.chat.thresholds]
min_samples = 10
max_ttft_p95_ratio = 1000
max_itl_p95_ratio = 1000
latency_slack_s = 1.0
[prices."m@stable"]
prompt_per_1k = 0.001
completion_per_1k = 0.002
'''


def failing_candidate(every: int):
    """An engine factory whose `cand` version refuses every `every`-th request at submit."""
    def factory(name, model, server):
        engine = build_engine(name, model, server)
        submit, count = engine.submit, [0]

        def flaky_submit(request):
            if engine.info.version == "cand":
                count[0] += 1
                if count[0] % every == 0:
                    raise EngineUnavailable("injected failure")
            return submit(request)

        engine.submit = flaky_submit
        return engine
    return factory


@pytest.mark.parametrize("breach", ["cost", "errors"])
async def test_worse_candidate_is_rolled_back_automatically_and_the_audit_log_says_why(tmp_path, breach):
    prices = '[prices."m@cand"]\nprompt_per_1k = 0.003\ncompletion_per_1k = 0.006\n' if breach == "cost" else \
             '[prices."m@cand"]\nprompt_per_1k = 0.001\ncompletion_per_1k = 0.002\n'
    path = write_config(tmp_path / "c.toml", {"m": sim_model(["stable", "cand"], time_scale=0.0)}, CANARY + prices)
    factory = failing_candidate(3) if breach == "errors" else build_engine
    async with running(path, engine_factory=factory) as (daemon, url), aiohttp.ClientSession() as http:
        rollout = daemon.control.rollouts.get("chat")
        assert rollout.phase == "running" and rollout.weight == 0.5
        served = []
        for i in range(200):
            status, headers, _ = await complete(http, url, "chat", user=f"user-{i}")
            served.append((rollout.phase, headers.get("X-Inferd-Model-Version")))
            if rollout.phase == "rolled_back":
                break
        assert rollout.phase == "rolled_back"
        after = [(await complete(http, url, "chat", user=f"late-{i}"))[1]["X-Inferd-Model-Version"]
                 for i in range(20)]
        assert after == ["stable+simulated"] * 20
        assert {v for _, v in served if v} == {"stable+simulated", "cand+simulated"}   # 503s carry none
    (record,) = [r for r in read_audit(tmp_path / "audit.jsonl") if r["action"] == "rollout.rollback"]
    assert record["actor"] == "system" and record["target"] == "chat"
    assert record["reason"].startswith("automatic rollback: " + ("cost_per_1k" if breach == "cost" else "error_rate"))
    assert record["before"]["weights"]["m@cand"] == 0.5 and record["after"]["weights"]["m@cand"] == 0.0
    assert record["detail"]["candidate"]["requests"] >= 10
    starts = [r for r in read_audit(tmp_path / "audit.jsonl") if r["action"] == "rollout.start"]
    assert len(starts) == 1 and starts[0]["actor"] == "system"
