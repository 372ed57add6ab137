import random

import pytest

from inferd.config.aliases import Arm, Split
from inferd.config.rollouts import PriceConfig, RolloutConfig, RolloutThresholds
from inferd.models.registry import ModelRegistry
from inferd.models.rollout import Rollout, RolloutError, RolloutManager, RolloutNotFound
from inferd.observability.audit import AuditLog, read_audit
from inferd.types import ModelVersion

STABLE = ModelVersion("llama", "aaaa1111")
CAND = ModelVersion("llama", "bbbb2222")
SHADOW = ModelVersion("llama", "cccc3333")
STEPS = (0.01, 0.05, 0.25, 1.0)
N = 40  # min_samples in these tests


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def env(tmp_path):
    """A registry with stable and candidate ready behind alias `chat` (100% stable), a clock, an audit log."""
    reg = ModelRegistry(defaults={"llama": STABLE.version},
                        aliases={"chat": Split((Arm(STABLE, 1.0),), SHADOW, 0.1)}, rng=random.Random(1))
    for key in (STABLE, CAND, SHADOW):
        reg.register(key, object())
        reg.mark_ready(key)
    audit = AuditLog(tmp_path / "audit.jsonl")
    clock = Clock()

    def make(**kw) -> Rollout:
        args = dict(stable=STABLE, candidate=CAND, steps=STEPS, min_dwell_s=60.0,
                    thresholds=RolloutThresholds(min_samples=N), audit=audit, clock=clock, rng=random.Random(2))
        args.update(kw)
        return Rollout("chat", reg, **args)

    env = type("Env", (), {})()
    env.reg, env.audit, env.clock, env.make = reg, audit, clock, make
    env.records = lambda: (audit.flush(), read_audit(audit.path))[1]
    yield env
    audit.close()


def feed(rollout, version, n, *, errors=0, ttft=0.1, itl=0.02, prompt=100, completion=50):
    for i in range(n):
        rollout.record(version, i >= errors, ttft, itl, prompt, completion)


def share_on(reg, key, users=2000):
    return sum(reg.resolve("chat", "acme", f"u{i}").target == key for i in range(users)) / users


def test_start_moves_the_first_step_of_traffic_to_the_candidate(env):
    r = env.make(steps=(0.25, 1.0))
    r.start("key_ops", "ship v2")
    assert r.phase == "running" and r.step == 0
    assert abs(share_on(env.reg, CAND) - 0.25) <= 0.03
    split = env.reg.table.split_for("chat")
    assert split.shadow == SHADOW and split.shadow_fraction == 0.1   # the alias keeps its shadow
    (rec,) = env.records()
    assert (rec["actor"], rec["action"], rec["target"], rec["reason"]) == ("key_ops", "rollout.start", "chat", "ship v2")
    assert rec["before"]["phase"] == "idle" and rec["after"]["weights"] == {str(CAND): 0.25, str(STABLE): 0.75}


def test_candidate_with_higher_error_rate_is_rolled_back_within_the_breaching_completion(env):
    r = env.make(steps=(0.5, 1.0))
    r.start()
    feed(r, STABLE, N)
    feed(r, CAND, N - 1, errors=4)
    assert r.phase == "running"                  # one sample short of judging
    r.record(CAND, True, 0.1, 0.02, 100, 50)
    assert r.phase == "rolled_back"
    assert share_on(env.reg, CAND) == 0.0        # the very next request is on stable
    rec = env.records()[-1]
    assert rec["action"] == "rollout.rollback" and rec["actor"] == "system"
    assert rec["reason"].startswith("automatic rollback: error_rate: candidate 10.00% > stable 0.00%")
    assert rec["detail"]["candidate"]["errors"] == 4 and rec["after"]["weights"][str(STABLE)] == 1.0
    assert r.state().reason == rec["reason"]


def test_error_rate_within_the_allowed_increase_is_not_a_breach(env):
    r = env.make(thresholds=RolloutThresholds(min_samples=100, max_error_rate_increase=0.02))
    r.start()
    feed(r, STABLE, 100, errors=1)
    feed(r, CAND, 100, errors=3)                 # 3% <= 1% + 2pp
    assert r.phase == "running" and r.breaches() == []


def test_more_expensive_candidate_is_rolled_back_for_cost(env):
    prices = {str(STABLE): PriceConfig(prompt_per_1k=1.0, completion_per_1k=2.0),
              "llama": PriceConfig(prompt_per_1k=1.2, completion_per_1k=2.4)}   # the model-wide price
    r = env.make(prices=prices)
    r.start()
    feed(r, STABLE, N)
    feed(r, CAND, N)
    assert r.phase == "rolled_back"
    assert "cost_per_1k: candidate 1.6 > 1.1 x stable 1.33333" in env.records()[-1]["reason"]


def test_candidate_with_worse_ttft_p95_is_rolled_back(env):
    r = env.make()
    r.start()
    feed(r, STABLE, N, ttft=0.10)
    feed(r, CAND, N - 5, ttft=0.10)
    feed(r, CAND, 5, ttft=0.50)                  # 12.5% slow requests: the p95 is slow
    assert r.phase == "rolled_back"
    reason = env.records()[-1]["reason"]
    assert "ttft_p95: candidate 500.0 ms > 1.2 x stable 100.0 ms" in reason and "error_rate" not in reason


def test_candidate_with_worse_inter_token_latency_is_rolled_back_from_token_gaps(env):
    r = env.make()
    r.start()
    for _ in range(N):
        r.record(STABLE, True, 0.1, [0.02] * 100, 10, 100)
    for _ in range(N):
        r.record(CAND, True, 0.1, [0.02] * 50 + [0.05] * 50, 10, 100)
    assert r.phase == "rolled_back" and "itl_p95" in env.records()[-1]["reason"]


def test_latency_slack_absorbs_noise_at_tiny_latencies(env):
    r = env.make(thresholds=RolloutThresholds(min_samples=N, latency_slack_s=0.005))
    r.start()
    feed(r, STABLE, N, ttft=0.002)
    feed(r, CAND, N, ttft=0.004)                 # 2x, but 4 ms <= 1.2 * 2 ms + 5 ms
    assert r.phase == "running"


def test_healthy_candidate_is_promoted_through_every_step_after_the_dwell(env):
    r = env.make()
    r.start()
    for step, weight in enumerate(STEPS):
        assert r.step == step and r.weight == weight
        assert r.state().candidate_window.requests == 0           # windows reset at each step
        if weight < 1.0:
            feed(r, STABLE, N)
        feed(r, CAND, N)
        assert r.step == step                                     # samples alone do not advance
        env.clock.now += 59.0
        r.tick()
        assert r.step == step and r.phase == "running"            # nor does less than the dwell
        env.clock.now += 1.0
        r.tick()
    assert r.phase == "promoted" and r.reason == "healthy through every step"
    assert share_on(env.reg, CAND) == 1.0
    actions = [(rec["action"], rec["actor"]) for rec in env.records()]
    assert actions == [("rollout.start", "system")] + [("rollout.step", "system")] * 3 + [("rollout.promote", "system")]


def test_final_step_judges_the_candidate_against_the_last_stable_baseline(env):
    r = env.make(steps=(0.5, 1.0), min_dwell_s=0.0)
    r.start()
    feed(r, STABLE, N)
    feed(r, CAND, N)
    assert r.step == 1 and r.state().stable_window.requests == N  # baseline kept at 100%
    feed(r, CAND, N, errors=N // 2)
    assert r.phase == "rolled_back"


def test_dwell_passed_but_too_few_samples_waits_for_evidence(env):
    r = env.make(steps=(0.1, 1.0))
    r.start()
    env.clock.now += 3600
    feed(r, STABLE, N)
    feed(r, CAND, N - 1)
    assert r.step == 0
    r.record(CAND, True, 0.1, 0.02, 100, 50)
    assert r.step == 1


def test_paused_rollout_does_not_advance_but_still_rolls_back_on_a_breach(env):
    r = env.make()
    r.start()
    r.pause("key_alice", "investigating latency")
    assert r.state().reason == "investigating latency"
    feed(r, STABLE, N)
    feed(r, CAND, N)
    env.clock.now += 3600
    r.tick()
    assert (r.phase, r.step) == ("paused", 0)
    feed(r, CAND, N, errors=N)
    assert r.phase == "rolled_back"


def test_operator_controls_are_recorded_with_their_actor(env):
    r = env.make()
    r.start("key_ops")
    r.pause("key_alice", "holding for the launch")
    r.resume("key_bob")
    r.rollback("key_alice", "customer report")
    assert share_on(env.reg, CAND) == 0.0
    r2 = env.make()
    r2.start("key_ops")
    r2.promote("key_bob", "looks good")
    assert share_on(env.reg, CAND) == 1.0
    got = [(rec["actor"], rec["action"], rec["reason"]) for rec in env.records()]
    assert got == [("key_ops", "rollout.start", None), ("key_alice", "rollout.pause", "holding for the launch"),
                   ("key_bob", "rollout.resume", None), ("key_alice", "rollout.rollback", "customer report"),
                   ("key_ops", "rollout.start", None), ("key_bob", "rollout.promote", "looks good")]


def test_resume_restarts_the_dwell_of_the_current_step(env):
    r = env.make()
    r.start()
    env.clock.now += 50
    r.pause("key_ops")
    r.resume("key_ops")
    feed(r, STABLE, N)
    feed(r, CAND, N)
    env.clock.now += 50                          # 100 s since start, 50 since resume
    r.tick()
    assert r.step == 0
    env.clock.now += 10
    r.tick()
    assert r.step == 1


@pytest.mark.parametrize("control", ["pause", "resume", "promote", "rollback"])
def test_controls_the_state_does_not_allow_raise(env, control):
    r = env.make()
    with pytest.raises(RolloutError, match="it is idle"):
        getattr(r, control)("key_ops", "why")
    r.start()
    r.promote("key_ops")
    with pytest.raises(RolloutError, match="promoted"):
        getattr(r, control)("key_ops", "why")
    with pytest.raises(RolloutError):
        r.start()


def test_start_refuses_a_candidate_that_is_not_ready(env):
    env.reg.retire(CAND)
    with pytest.raises(RolloutError, match="not loaded and ready"):
        env.make().start()
    assert env.reg.table.split_for("chat").arms == (Arm(STABLE, 1.0),)


def test_rollout_of_a_model_name_overrides_its_default(env):
    r = Rollout("llama", env.reg, stable=STABLE, candidate=CAND, steps=(0.5, 1.0), min_dwell_s=0,
                thresholds=RolloutThresholds(min_samples=N), clock=env.clock)
    r.start()
    assert {env.reg.resolve("llama", "t", str(u)).target for u in range(100)} == {STABLE, CAND}
    r.rollback("key_ops", "no")
    assert {env.reg.resolve("llama", "t", str(u)).target for u in range(100)} == {STABLE}


def test_manager_feeds_each_rollout_only_its_versions(env):
    mgr = RolloutManager()
    r = env.make()
    mgr.add(r)
    r.start()
    mgr.record(SHADOW, False, None, None, 1, 0)
    mgr.record(STABLE, True, 0.1, 0.02, 10, 10)
    mgr.record(CAND, False, None, None, 10, 0)
    state = mgr.get("chat").state()
    assert (state.stable_window.requests, state.candidate_window.errors) == (1, 1)
    with pytest.raises(RolloutError, match="running"):
        mgr.add(env.make())
    with pytest.raises(RolloutNotFound):
        mgr.get("nope")
    r.rollback("key_ops", "done")
    mgr.add(env.make())                          # a finished rollout may be replaced
    assert [s.phase for s in mgr.states()] == ["idle"]


def test_rollout_from_config_resolves_targets_and_keeps_thresholds(env):
    cfg = RolloutConfig(stable="llama", candidate="llama@bbbb2222", steps=(0.05, 1.0), min_dwell_s=300,
                        thresholds=RolloutThresholds(max_ttft_p95_ratio=1.5))
    r = Rollout.from_config("chat", cfg, env.reg, defaults={"llama": STABLE.version}, clock=env.clock)
    assert (r.stable, r.candidate, r.steps, r.min_dwell_s) == (STABLE, CAND, (0.05, 1.0), 300)
    assert r.thresholds.max_ttft_p95_ratio == 1.5


def test_a_reload_keeps_rollout_decisions_until_the_rollout_is_removed(env):
    mgr = RolloutManager()
    running, promoted = env.make(steps=(0.25, 1.0)), Rollout(
        "llama", env.reg, stable=STABLE, candidate=CAND, steps=(0.5, 1.0), clock=env.clock)
    mgr.add(running)
    mgr.add(promoted)
    running.start()
    promoted.start()
    promoted.promote("key_ops")
    configured = {"chat": Split((Arm(STABLE, 1.0),))}

    def reload(t):
        return mgr.overlay(t.with_routes(defaults={"llama": STABLE.version}, aliases=configured))

    env.reg.swap(reload)
    assert abs(share_on(env.reg, CAND) - 0.25) <= 0.03
    assert env.reg.resolve("llama", "acme", "u").target == CAND
    with pytest.raises(RolloutError, match="running"):
        mgr.remove("chat")
    mgr.remove("llama")
    env.reg.swap(reload)
    assert env.reg.resolve("llama", "acme", "u").target == STABLE
    env.reg.swap(lambda t: mgr.overlay(t.with_routes(defaults={"llama": STABLE.version}, aliases={})))
    assert "chat" not in env.reg.table.aliases   # a route the config dropped is left alone
    running.rollback("system", "route gone")          # no crash when the route has vanished
    assert running.phase == "rolled_back"
