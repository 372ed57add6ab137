"""Loading and retiring versions: a tampered artifact is refused by name while the rest serve;
a retired version closes only after its last request has let go of it."""
from __future__ import annotations

import asyncio
import shutil

import aiohttp

from inferd.config.root import parse_config
from inferd.models.factory import build_engine
from inferd.models.registry import ModelRegistry
from inferd.models.specs import version_specs
from inferd.models.versions import VersionManager
from inferd.types import ModelVersion
from tests.daemon.harness import complete, running, sim_model, write_config


async def test_tampered_artifact_is_refused_naming_the_file_while_the_others_serve(tmp_path, tiny_artifact, caplog):
    root = tmp_path / "engines"
    good = root / "tiny" / tiny_artifact.name
    bad = root / "bad" / tiny_artifact.name
    shutil.copytree(tiny_artifact, good)
    shutil.copytree(tiny_artifact, bad)
    with open(bad / "tokenizer.json", "a") as fh:
        fh.write(" ")
    ref = 'backend = "reference"\nmax_batch_size = 4\nmax_num_tokens = 64\nnum_kv_blocks = 64\n'
    path = write_config(tmp_path / "c.toml", {"tiny": ref, "bad": ref, "s": sim_model()})
    path.write_text(path.read_text().replace("[server]\n", f'[server]\nengines_root = "{root}"\n'))
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        status, headers, _ = await complete(http, url, "tiny")
        assert status == 200 and headers["X-Inferd-Model-Version"] == tiny_artifact.name
        status, _, _ = await complete(http, url, "s")
        assert status == 200
        status, _, body = await complete(http, url, "bad")
        assert status == 503 and body["error"]["param"] == "model"
        async with http.get(f"{url}/readyz") as resp:
            ready = await resp.json()
        assert resp.status == 200
        assert ready["versions"][f"tiny@{tiny_artifact.name}"] == "ready"
        assert "tokenizer.json" in ready["refused"]["bad@latest"]
    refused = [r for r in caplog.records if r.getMessage() == "version_refused"]
    assert len(refused) == 1 and "tokenizer.json" in str(refused[0].__dict__)


async def test_retired_version_closes_only_after_its_last_request_releases_it():
    cfg = parse_config({"models": {"m": {"backend": "sim", "versions": ["v1", "v2"],
                                         "sim": {"profile": "tiny", "time_scale": 0.0}}}})
    closed: list[str] = []

    def factory(name, model, server):
        engine = build_engine(name, model, server)
        close = engine.close

        async def tracked_close():
            closed.append(engine.info.version)
            await close()

        engine.close = tracked_close
        return engine

    versions = VersionManager(ModelRegistry(), cfg.server, factory)
    try:
        keys = await versions.load_all(version_specs(cfg))
        v1 = ModelVersion("m", "v1")
        assert v1 in keys and versions.registry.table.is_ready(v1)
        versions.acquire(v1)
        retiring = asyncio.ensure_future(versions.retire(v1))
        await asyncio.sleep(0)
        assert versions.registry.table.state(v1) == "retired" and closed == []
        assert not retiring.done()
        versions.release(v1)
        await retiring
        assert closed == ["v1"] and v1 not in versions.registry.table.versions
    finally:
        await versions.close_all()
    assert sorted(closed) == sorted(["v1", "v2", keys[0].version])


def test_a_version_spec_carries_its_models_trusted_keys_else_the_servers():
    cfg = parse_config({"server": {"trusted_keys": ["/k/release.pub"]},
                        "models": {"a": {"backend": "sim", "versions": ["v1"]},
                                   "b": {"backend": "sim", "trusted_keys": ["/k/team.pub"]}}})
    trust = {spec.label: spec.config.trusted_keys for spec in version_specs(cfg)}
    assert trust == {"a@latest": ("/k/release.pub",), "a@v1": ("/k/release.pub",), "b@latest": ("/k/team.pub",)}
