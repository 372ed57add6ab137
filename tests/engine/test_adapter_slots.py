"""engine.adapter_slots: the loaded-adapter table every backend shares (slots, holders, LRU, idling)."""
from __future__ import annotations

import pytest

from inferd.engine.adapter_slots import AdapterSlots
from inferd.engine.adapters import AdapterBusy, UnknownAdapter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def slots(max_loaded: int | None = 2, **kwargs) -> AdapterSlots[str]:
    return AdapterSlots(dict.fromkeys("abc", ""), max_loaded=max_loaded, **kwargs)


def test_a_full_table_evicts_the_least_recently_used_adapter_nobody_holds() -> None:
    table = slots()
    table.install("a", "A")
    table.install("b", "B")
    table.acquire("a")                      # a is now the most recently used, and held
    table.release("a")
    table.install("c", "C")
    assert [n for n in "abc" if table.is_loaded(n)] == ["a", "c"]


def test_when_every_slot_is_held_install_and_unload_say_busy() -> None:
    table = slots(max_loaded=1)
    table.install("a", "A", pins=1)
    assert not table.has_room()
    with pytest.raises(AdapterBusy):
        table.install("b", "B")
    with pytest.raises(AdapterBusy):
        table.unload("a")
    table.release("a")
    assert table.has_room() and table.unload("a") and not table.unload("a")


def test_without_a_limit_nothing_is_evicted() -> None:
    table = slots(max_loaded=None)
    for name in "abc":
        table.install(name, name.upper())
    assert all(table.is_loaded(n) for n in "abc") and table.loaded("b") == "B"


def test_an_adapter_idle_for_idle_unload_s_is_unloaded_and_a_held_one_never() -> None:
    clock = Clock()
    table = slots(idle_unload_s=10.0, clock=clock)
    table.install("a", "A")
    table.install("b", "B", pins=1)
    clock.now += 4
    assert table.idle_wait() == 6.0 and table.use("a").idle_s == 4.0 and table.use("b").idle_s is None
    clock.now += 6
    assert table.unload_idle() == ["a"] and table.is_loaded("b") and table.idle_wait() is None


def test_an_unconfigured_name_is_unknown() -> None:
    with pytest.raises(UnknownAdapter):
        slots().install("z", "Z")
