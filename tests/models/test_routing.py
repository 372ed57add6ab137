import random
from collections import Counter

import msgspec
import pytest

from inferd.config.aliases import Arm, RoutingConfigError, Split, TierRule
from inferd.models.errors import InvalidModelField, UnknownModel, VersionNotLoaded, VersionUnavailable
from inferd.models.registry import ModelRegistry
from inferd.models.routing import Route
from inferd.types import ModelVersion

V1 = ModelVersion("llama", "aaaa1111")
V2 = ModelVersion("llama", "bbbb2222")
V3 = ModelVersion("llama", "cccc3333")
Q1 = ModelVersion("qwen", "dddd4444")


def make_registry(*ready: ModelVersion, aliases=None, defaults=None, loading=()):
    reg = ModelRegistry(defaults=defaults if defaults is not None else {"llama": V1.version},
                        aliases=aliases or {}, rng=random.Random(7))
    for key in ready:
        reg.register(key, f"engine-{key}")
        reg.mark_ready(key)
    for key in loading:
        reg.register(key, f"engine-{key}")
    return reg


def split(*weights, shadow=None, fraction=0.0):
    return Split(tuple(Arm(k, w) for k, w in weights), shadow, fraction)


def arm_counts(reg, name, users, tenant="acme"):
    return Counter(reg.resolve(name, tenant, f"user-{i}").target for i in range(users))


def test_sticky_split_matches_weights_over_10000_users():
    reg = make_registry(V1, V2, V3, aliases={"chat": split((V1, 70), (V2, 20), (V3, 10))})
    counts = arm_counts(reg, "chat", 10_000)
    for key, weight in ((V1, 0.7), (V2, 0.2), (V3, 0.1)):
        assert abs(counts[key] / 10_000 - weight) <= 0.03, counts


def test_same_user_always_gets_the_same_arm_and_tenants_are_hashed_apart():
    reg = make_registry(V1, V2, aliases={"chat": split((V1, 50), (V2, 50))})
    first = {u: reg.resolve("chat", "acme", u).target for u in map(str, range(200))}
    for _ in range(3):
        assert {u: reg.resolve("chat", "acme", u).target for u in first} == first
    other = {u: reg.resolve("chat", "globex", u).target for u in first}
    assert other != first   # same user ids under another tenant are assigned independently


def test_growing_the_canary_keeps_every_user_already_on_it():
    reg = make_registry(V1, V2, aliases={"chat": split((V2, 1), (V1, 99))})
    users = [f"u{i}" for i in range(10_000)]
    previous = {u for u in users if reg.resolve("chat", "acme", u).target == V2}
    assert previous
    for pct in (5, 25, 60, 100):
        reg.set_split("chat", split((V2, pct), (V1, 100 - pct)))
        now = {u for u in users if reg.resolve("chat", "acme", u).target == V2}
        assert previous <= now, f"{len(previous - now)} candidate users moved off at {pct}%"
        assert abs(len(now) / len(users) - pct / 100) <= 0.03
        previous = now


def test_arm_order_does_not_matter_for_assignment():
    a = make_registry(V1, V2, aliases={"chat": split((V1, 80), (V2, 20))})
    b = make_registry(V1, V2, aliases={"chat": split((V2, 20), (V1, 80))})
    assert all(a.resolve("chat", "t", u).target == b.resolve("chat", "t", u).target for u in map(str, range(500)))


def test_without_user_the_draw_is_per_request():
    reg = make_registry(V1, V2, aliases={"chat": split((V1, 50), (V2, 50))})
    by_id = {reg.resolve("chat", "acme", None, request_id=f"req-{i}").target for i in range(64)}
    assert by_id == {V1, V2}
    assert reg.resolve("chat", "acme", None, request_id="r9") == reg.resolve("chat", "acme", None, request_id="r9")
    random_draws = Counter(reg.resolve("chat", "acme").target for _ in range(2000))
    assert abs(random_draws[V2] / 2000 - 0.5) < 0.05


def test_model_name_routes_to_its_default_version_and_pins_route_exactly():
    reg = make_registry(V1, V2, aliases={"chat": split((V2, 1))})
    assert reg.resolve("llama", "acme", "u") == Route(V1, None, None)
    assert reg.resolve("llama@bbbb2222", "acme", "u") == Route(V2, None, None)
    assert reg.resolve("chat", "acme", "u") == Route(V2, None, "chat")


def test_model_with_one_loaded_version_and_no_default_routes_to_it():
    reg = make_registry(Q1)
    assert reg.resolve("qwen", "acme").target == Q1


@pytest.mark.parametrize("field, error, status", [
    ("gpt-4", UnknownModel, 404),
    ("gpt-4@abc", UnknownModel, 404),
    ("llama@ffff0000", VersionNotLoaded, 404),
    ("llama@", InvalidModelField, 400),
    ("@aaaa1111", InvalidModelField, 400),
    ("", InvalidModelField, 400),
])
def test_unroutable_model_fields_raise_typed_errors(field, error, status):
    reg = make_registry(V1)
    with pytest.raises(error) as info:
        reg.resolve(field, "acme", "u")
    assert info.value.status == status and info.value.param == "model" and info.value.message


def test_version_still_loading_is_503_with_retry_and_not_routable():
    reg = make_registry(V1, loading=(V2,), aliases={"chat": split((V2, 1))})
    with pytest.raises(VersionUnavailable, match="still loading") as info:
        reg.resolve("llama@bbbb2222", "acme")
    assert info.value.status == 503 and info.value.retry_after_s
    with pytest.raises(VersionUnavailable, match="no version of `chat`"):
        reg.resolve("chat", "acme", "u")


def test_not_ready_arm_is_skipped_and_its_users_return_when_it_is_ready():
    reg = make_registry(V1, loading=(V2,), aliases={"chat": split((V1, 50), (V2, 50))})
    assert {reg.resolve("chat", "acme", str(u)).target for u in range(200)} == {V1}
    reg.mark_ready(V2)
    assert {reg.resolve("chat", "acme", str(u)).target for u in range(200)} == {V1, V2}


def test_retired_version_takes_no_new_requests_but_keeps_its_engine_until_removed():
    reg = make_registry(V1, V2, aliases={"chat": split((V1, 50), (V2, 50))})
    reg.retire(V2)
    assert {reg.resolve("chat", "acme", str(u)).target for u in range(200)} == {V1}
    with pytest.raises(VersionNotLoaded, match="retired"):
        reg.resolve("llama@bbbb2222", "acme")
    assert reg.table.engine(V2) == f"engine-{V2}"        # in-flight streams still reach it
    assert reg.remove(V2) == f"engine-{V2}"
    with pytest.raises(VersionNotLoaded):
        reg.table.engine(V2)


def test_shadow_fraction_is_respected_and_shadow_is_never_the_live_target():
    reg = make_registry(V1, V2, V3, aliases={"chat": split((V1, 50), (V2, 50), shadow=V2, fraction=0.2)})
    routes = [reg.resolve("chat", "acme", f"u{i}", request_id=f"req-{i}") for i in range(10_000)]
    assert all(r.shadow != r.target for r in routes)
    on_v1 = [r for r in routes if r.target == V1]
    mirrored = sum(r.shadow == V2 for r in on_v1)
    assert abs(mirrored / len(on_v1) - 0.2) <= 0.02
    assert not any(r.shadow for r in routes if r.target == V2)
    again = reg.resolve("chat", "acme", "u1", request_id="req-1")
    assert again == routes[1]        # deterministic per request id


def test_shadow_is_skipped_when_the_shadow_version_is_not_ready():
    reg = make_registry(V1, loading=(V3,), aliases={"chat": split((V1, 1), shadow=V3, fraction=1.0)})
    assert reg.resolve("chat", "acme", "u", request_id="r").shadow is None
    reg.mark_ready(V3)
    assert reg.resolve("chat", "acme", "u", request_id="r").shadow == V3


def test_list_models_shows_aliases_models_and_versions_with_weights():
    reg = make_registry(V1, V2, loading=(V3,), aliases={"chat": split((V1, 3), (V2, 1), shadow=V3, fraction=0.1)})
    rows = {m.id: m for m in reg.list_models()}
    chat = rows["chat"]
    assert chat.kind == "alias" and chat.routable and chat.shadow == str(V3) and chat.shadow_fraction == 0.1
    assert [(a.target, a.weight) for a in chat.split] == [(str(V1), 0.75), (str(V2), 0.25)]
    assert rows["llama"].kind == "model" and rows["llama"].version == V1.version
    assert rows[str(V3)].state == "loading" and not rows[str(V3)].routable
    assert msgspec.json.decode(msgspec.json.encode(reg.list_models()))  # JSON-able for the API


def test_alias_clashing_with_a_model_name_or_bad_split_is_rejected():
    with pytest.raises(RoutingConfigError, match="clash"):
        make_registry(V1, aliases={"llama": split((V1, 1))})
    with pytest.raises(RoutingConfigError, match="positive total"):
        split((V1, 0))
    with pytest.raises(RoutingConfigError, match="shadow_fraction"):
        split((V1, 1), shadow=V2, fraction=1.5)
    with pytest.raises(RoutingConfigError, match="twice"):
        split((V1, 1), (V1, 2))


def test_an_arm_leaving_moves_only_its_own_users_and_they_return_when_it_does():
    reg = make_registry(V1, V2, V3, aliases={"chat": split((V1, 60), (V2, 10), (V3, 30))})
    users = [f"u{i}" for i in range(5000)]
    before = {u: reg.resolve("chat", "acme", u).target for u in users}
    reg.retire(V1)
    during = {u: reg.resolve("chat", "acme", u).target for u in users}
    assert all(during[u] == before[u] for u in users if before[u] != V1)
    reg.mark_ready(V1)
    assert {u: reg.resolve("chat", "acme", u).target for u in users} == before


def test_a_lora_adapter_suffix_routes_as_its_base_model_and_rides_on_the_route():
    reg = make_registry(V1, V2)
    assert reg.resolve("llama:support", "acme") == Route(V1, lora="support")
    assert reg.resolve(f"{V2}:support", "acme") == Route(V2, lora="support")
    assert reg.resolve("llama", "acme").lora is None
    for bad in ("llama:", ":support", "llama: "):
        with pytest.raises(InvalidModelField):
            reg.resolve(bad, "acme")
    with pytest.raises(UnknownModel):
        reg.resolve("nope:support", "acme")


def test_requests_naming_an_adapter_are_never_mirrored_to_the_shadow():
    aliases = {"chat": split((V1, 1.0), shadow=V2, fraction=1.0)}
    reg = make_registry(V1, V2, aliases=aliases)
    assert reg.resolve("chat", "acme", request_id="r1").shadow == V2
    assert reg.resolve("chat:support", "acme", request_id="r1") == Route(V1, None, "chat", "support")


def tiered_split(tiers=(), tenants=()):
    """chat: V1 for everyone, with tier rules {class: ((version, weight), ...)} and the same per tenant."""
    def rules(table, pairs):
        return tuple((k, TierRule(f"{table}.{k}", tuple(Arm(v, w) for v, w in arms))) for k, arms in pairs)
    return Split((Arm(V1, 1.0),), V3, 1.0, rules("tenants", tenants), rules("tiers", tiers))


def test_a_tenant_rule_wins_over_its_class_rule_which_wins_over_the_split():
    reg = make_registry(V1, V2, V3, aliases={"chat": tiered_split(tiers=[("batch", [(V2, 1)])],
                                                                  tenants=[("acme", [(V3, 1)])])})
    assert reg.resolve("chat", "acme", priority="batch") == Route(V3, None, "chat", tier="tenants.acme")
    assert reg.resolve("chat", "globex", priority="batch") == Route(V2, None, "chat", tier="tiers.batch")
    interactive = reg.resolve("chat", "globex", priority="interactive", request_id="r1")
    assert interactive == Route(V1, V3, "chat")          # the split's: mirrored to the shadow, no tier
    assert reg.resolve("chat", "acme", priority="batch", tiers=False).target == V1


def test_a_tier_with_weights_splits_its_own_traffic_sticky_per_user():
    reg = make_registry(V1, V2, V3, aliases={"chat": tiered_split(tiers=[("batch", [(V2, 3), (V3, 1)])])})
    counts = Counter(reg.resolve("chat", "bulk", f"user-{i}", priority="batch").target for i in range(4000))
    assert set(counts) == {V2, V3} and abs(counts[V2] / 4000 - 0.75) <= 0.03, counts
    first = {u: reg.resolve("chat", "bulk", u, priority="batch").target for u in map(str, range(100))}
    assert {u: reg.resolve("chat", "bulk", u, priority="batch").target for u in first} == first


def test_a_tier_whose_versions_are_not_ready_follows_the_split_until_one_is():
    reg = make_registry(V1, loading=(V2, V3), aliases={"chat": tiered_split(tiers=[("batch", [(V2, 3), (V3, 1)])])})
    assert reg.resolve("chat", "bulk", priority="batch").target == V1
    reg.mark_ready(V3)
    assert reg.resolve("chat", "bulk", priority="batch") == Route(V3, None, "chat", tier="tiers.batch")


def test_a_rollout_step_keeps_the_tier_rules():
    reg = make_registry(V1, V2, V3, aliases={"chat": tiered_split(tiers=[("batch", [(V3, 1)])])})
    reg.set_split("chat", reg.table.split_for("chat").with_arms(Arm(V1, 50), Arm(V2, 50)))
    assert reg.resolve("chat", "bulk", priority="batch").target == V3
    assert {reg.resolve("chat", "app", f"u{i}", priority="interactive").target for i in range(50)} == {V1, V2}
