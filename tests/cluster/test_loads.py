"""inferd.cluster.loads: peers' load hints, their age and staleness."""
from inferd.cluster.loads import PeerLoads
from inferd.cluster.messages import Load, TenantDemand, VersionLoad


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def hint(model="small", version="v1", free_slots=4, wait=0.0):
    return VersionLoad(model=model, version=version, ready=True, free_slots=free_slots, free_kv_blocks=100,
                       queued=(0, 0, 0), est_wait_s=wait, tokens_per_s=1000.0)


def test_a_hint_ages_from_when_it_was_measured_not_when_it_arrived():
    clock = Clock()
    loads = PeerLoads(max_age_s=3.0, clock=clock)
    loads.heard("b", Load(age_s=1.0, versions=(hint(),), demand=()))
    [(v, age)] = loads.versions("b")
    assert age == 1.0
    clock.t += 1.5
    assert loads.fresh_version("b", "small", "v1") == v
    clock.t += 1.0                                  # 3.5 s old now
    assert loads.fresh_version("b", "small", "v1") is None


def test_parts_of_one_report_each_replace_only_what_they_carry():
    clock = Clock()
    loads = PeerLoads(max_age_s=3.0, clock=clock)
    loads.heard("b", Load(age_s=0.0, versions=(hint("small"),), demand=(), part=0, parts=2))
    loads.heard("b", Load(age_s=0.0, versions=(hint("big", free_slots=0),), demand=(), part=1, parts=2))
    loads.heard("b", Load(age_s=0.0, versions=(hint("small", free_slots=1),), demand=(), part=0, parts=2))
    assert loads.fresh_version("b", "small", "v1").free_slots == 1
    assert loads.fresh_version("b", "big", "v1").free_slots == 0


def test_demand_is_stale_when_the_whole_report_is_and_forget_drops_a_peer():
    clock = Clock()
    loads = PeerLoads(max_age_s=3.0, clock=clock)
    assert loads.fresh_demand("b") is None                         # never heard
    loads.heard("b", Load(age_s=0.0, versions=(hint(),), demand=()))
    assert loads.fresh_demand("b") == {}                           # heard: no tenant has demand there
    loads.heard("b", Load(age_s=0.0, versions=(), demand=(TenantDemand("acme", 2.0, 1),)))
    assert loads.fresh_demand("b")["acme"].requests_per_s == 2.0
    clock.t += 4
    assert loads.fresh_demand("b") is None
    loads.forget("b")
    assert loads.versions("b") == []
