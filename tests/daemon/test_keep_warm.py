"""keep_warm_s through the real daemon: a version a reload drops stays loaded, unrouted, so a rollback
reload gets the very same engine back at once; after the time it unloads."""
from __future__ import annotations

import gc
import weakref

import aiohttp

from inferd.types import ModelVersion
from tests.daemon.harness import complete, running, sim_model, write_config


def config(path, version: str, keep_warm_s: float):
    head, sim, tail = sim_model(version=version).partition("[MODEL.sim]")     # keep_warm_s is [models.m]'s
    return write_config(path, {"m": head + f"keep_warm_s = {keep_warm_s}\n" + sim + tail})


async def test_a_dropped_version_stays_warm_and_a_rollback_reuses_its_engine(tmp_path):
    path = config(tmp_path / "c.toml", "v1", 60)
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        v1 = ModelVersion("m", "v1")
        engine = daemon.state.registry.table.engine(v1)
        config(path, "v2", 60)                          # "promote" v2: the config no longer lists v1
        assert (await daemon.reload()).retired == ("m@v1",)
        table = daemon.state.registry.table
        assert table.state(v1) == "retired" and engine.healthy      # unrouted, still loaded
        status, headers, _ = await complete(http, url, "m")
        assert status == 200 and headers["X-Inferd-Model-Version"] == "v2+simulated"
        config(path, "v1", 60)                          # roll back
        result = await daemon.reload()
        assert "m@v1" in result.loaded
        assert daemon.state.registry.table.engine(v1) is engine and daemon.state.registry.table.is_ready(v1)
        status, headers, _ = await complete(http, url, "m")
        assert status == 200 and headers["X-Inferd-Model-Version"] == "v1+simulated"


async def test_a_warm_version_unloads_when_its_time_is_up_and_its_engine_is_freed(tmp_path):
    path = config(tmp_path / "c.toml", "v1", 0.2)
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        engine = daemon.state.registry.table.engine(ModelVersion("m", "v1"))
        assert (await complete(http, url, "m"))[0] == 200     # its metric series exist, and outlive it
        config(path, "v2", 0.2)
        await daemon.reload()
        await daemon.reloader.wait_retired()
        assert ModelVersion("m", "v1") not in daemon.state.registry.table.versions
        assert not engine.healthy
        unloaded = weakref.ref(engine)
        del engine
        gc.collect()
        assert unloaded() is None       # nothing holds it: a real engine's weights and KV cache are freed


async def test_a_model_a_reload_dropped_is_404_model_not_found_and_unlisted_while_it_stays_warm(tmp_path):
    path = tmp_path / "c.toml"
    gone_body = sim_model(version="v1").replace("[MODEL.sim]", "keep_warm_s = 60\n[MODEL.sim]")
    write_config(path, {"m": sim_model(version="v1"), "gone": gone_body})
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        write_config(path, {"m": sim_model(version="v1")})
        assert (await daemon.reload()).retired == ("gone@v1",)
        assert daemon.state.registry.table.state(ModelVersion("gone", "v1")) == "retired"   # still loaded
        for name in ("gone", "gone@v1"):
            status, _, body = await complete(http, url, name)
            assert status == 404 and body["error"]["code"] == "model_not_found", body
        async with http.get(f"{url}/v1/models") as resp:
            listed = await resp.json()
        assert [row["id"] for row in listed["data"]] == ["m"]
        async with http.get(f"{url}/v1/models/gone") as resp:
            assert resp.status == 404 and (await resp.json())["error"]["code"] == "model_not_found"
        status, _, _ = await complete(http, url, "m")
        assert status == 200
