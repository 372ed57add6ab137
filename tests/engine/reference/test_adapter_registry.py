"""The reference engine's adapter registry: sources, verification, the LRU of loaded adapters, pins, idling."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from inferd.engine.adapters import AdapterBusy, AdapterLoadError, UnknownAdapter
from inferd.engine.reference.adapter_registry import AdapterRegistry
from inferd.engine.reference.config import LlamaConfig


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def config(tiny_artifact: Path) -> LlamaConfig:
    return LlamaConfig.from_json(tiny_artifact / "config.json")


def registry(sources, config, **kwargs) -> AdapterRegistry:
    kwargs.setdefault("max_loaded", 2)
    reg = AdapterRegistry(sources, **kwargs)
    reg.bind(config)
    return reg


@pytest.fixture
def three(tiny_adapters, config):
    """A registry of three adapters (two share files) holding at most two, on a hand-driven clock."""
    clock = Clock()
    reg = registry({"a": tiny_adapters["all"], "b": tiny_adapters["qvd"], "c": tiny_adapters["qvd"]}, config,
                   idle_unload_s=10.0, clock=clock)
    return reg, clock


def test_an_artifact_name_directory_loads_its_latest_version_verified(tiny_adapters, config):
    reg = registry({"all": tiny_adapters["all"], "qvd": tiny_adapters["qvd"]}, config)
    latest = (tiny_adapters["all"] / "LATEST").read_text().strip()

    assert reg.read("all").version == latest
    assert reg.read("qvd").version is None            # a plain PEFT directory: nothing to verify against
    assert [(i.name, i.loaded) for i in reg.infos()] == [("all", False), ("qvd", False)]


def test_an_altered_artifact_file_is_refused_naming_it(tiny_adapters, config, tmp_path):
    version = tiny_adapters["all"] / (tiny_adapters["all"] / "LATEST").read_text().strip()
    copy = Path(shutil.copytree(version, tmp_path / "v"))
    data = bytearray((copy / "adapter_model.safetensors").read_bytes())
    data[-1] ^= 0x01
    (copy / "adapter_model.safetensors").write_bytes(bytes(data))

    with pytest.raises(AdapterLoadError) as caught:
        registry({"x": copy}, config).read("x")

    assert caught.value.file == "adapter_model.safetensors" and "sha256" in str(caught.value)
    assert registry({"x": copy}, config, verify=False).read("x").rank == 4


def test_an_artifact_that_is_not_an_adapter_is_refused(tiny_artifact, config):
    with pytest.raises(AdapterLoadError, match="not an adapter artifact"):
        registry({"base": tiny_artifact}, config).read("base")


def test_unknown_names_and_reads_before_the_base_model_are_refused(tiny_adapters):
    reg = AdapterRegistry({"a": tiny_adapters["all"]}, max_loaded=1)
    with pytest.raises(AdapterLoadError, match="base model is not loaded"):
        reg.read("a")
    for call in (reg.read, reg.unload, reg.info):
        with pytest.raises(UnknownAdapter) as caught:
            call("nope")
        assert caught.value.adapter == "nope" and "configured: a" in str(caught.value)


def test_the_least_recently_used_adapter_nobody_holds_is_evicted(three):
    reg, clock = three
    a, b, c = (reg.read(n) for n in "abc")
    reg.install("a", a)
    clock.now += 1
    reg.install("b", b)
    clock.now += 1
    assert reg.acquire("a") is a                      # a is now the most recently used, and held
    reg.release("a")

    reg.install("c", c)

    assert [i.name for i in reg.infos() if i.loaded] == ["a", "c"]
    assert reg.acquire("b") is None


def test_an_adapter_in_use_is_never_evicted_or_unloaded(three):
    reg, _ = three
    reg.install("a", reg.read("a"), pins=1)
    reg.install("b", reg.read("b"), pins=2)

    with pytest.raises(AdapterBusy, match="all 2 adapter slots"):
        reg.install("c", reg.read("c"))
    with pytest.raises(AdapterBusy, match="in use by 2"):
        reg.unload("b")
    assert reg.info("b").in_use == 2

    reg.release("a")
    reg.install("c", reg.read("c"))
    assert not reg.is_loaded("a") and reg.unload("c") and not reg.unload("c")


def test_installing_a_loaded_adapter_keeps_the_loaded_one_and_adds_its_holders(three):
    reg, _ = three
    first = reg.install("a", reg.read("a"), pins=1)
    assert reg.install("a", reg.read("a"), pins=1) is first
    assert reg.info("a").in_use == 2


def test_adapters_nobody_holds_unload_after_the_idle_time(three):
    reg, clock = three
    reg.install("a", reg.read("a"))
    reg.install("b", reg.read("b"), pins=1)
    assert reg.idle_wait() == 10.0
    clock.now += 9.5
    assert reg.unload_idle() == [] and reg.idle_wait() == pytest.approx(0.5)
    assert reg.info("a").idle_s == pytest.approx(9.5) and reg.info("b").idle_s is None

    clock.now += 0.5
    assert reg.unload_idle() == ["a"]
    assert reg.idle_wait() is None                    # b is held: it never idles
    reg.release("b")
    assert reg.idle_wait() == 10.0


@pytest.mark.parametrize("kwargs, why", [
    (dict(max_loaded=0), "max_loaded_adapters"),
    (dict(max_loaded=1, idle_unload_s=0), "adapter_idle_unload_s"),
    (dict(max_loaded=1, sources={"": "x"}), "names"),
])
def test_bad_settings_are_refused(kwargs, why):
    with pytest.raises(ValueError, match=why):
        AdapterRegistry(kwargs.pop("sources", {}), **kwargs)
