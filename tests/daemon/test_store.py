"""The daemon and its store: created in the state directory, refused when corrupt or held by another daemon."""
from __future__ import annotations

import asyncio
import logging

from inferd.config.root import load_config
from inferd.daemon.lifecycle import Daemon
from tests.daemon.harness import running_daemon, sim_model, write_config


def config(tmp_path):
    return load_config(write_config(tmp_path / "inferd.toml", {"sim": sim_model(time_scale=0.0)}))


async def test_the_database_is_created_in_the_state_directory(tmp_path):
    cfg = config(tmp_path)
    async with running_daemon(cfg) as (daemon, _, _):
        assert daemon.state.store.where == str(tmp_path / "state" / "inferd.db")
    assert (tmp_path / "state" / "inferd.db").is_file()


async def test_a_corrupt_database_fails_the_start_naming_the_file_and_is_left_as_it_was(tmp_path, caplog):
    cfg = config(tmp_path)
    db = tmp_path / "state" / "inferd.db"
    db.parent.mkdir()
    garbage = b"this is not a database" * 100
    db.write_bytes(garbage)
    with caplog.at_level(logging.ERROR):
        assert await asyncio.wait_for(Daemon(cfg).run(), 60) == 1
    [failed] = startup_errors(caplog)
    assert failed["error_type"] == "StoreCorrupt" and str(db) in failed["error"]
    assert db.read_bytes() == garbage


async def test_a_second_daemon_on_the_same_state_directory_is_refused(tmp_path, caplog):
    cfg = config(tmp_path)
    async with running_daemon(cfg):
        with caplog.at_level(logging.ERROR):
            assert await asyncio.wait_for(Daemon(cfg).run(), 60) == 1
    [failed] = startup_errors(caplog)
    assert failed["error_type"] == "StoreLocked" and "inferd.db" in failed["error"]


def startup_errors(caplog) -> list[dict]:
    return [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == "startup_failed"]


async def test_the_daemon_runs_a_batch_on_its_own_and_the_sdk_reads_its_output(tmp_path):
    import json

    from openai import AsyncOpenAI

    lines = "".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                                "body": {"model": "sim", "prompt": "hi", "max_tokens": 2}}) + "\n" for i in range(5))
    async with running_daemon(config(tmp_path)) as (_, _, url):
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            made = await sdk.files.create(file=("in.jsonl", lines.encode()), purpose="batch")
            batch = await sdk.batches.create(input_file_id=made.id, endpoint="/v1/completions",
                                             completion_window="24h")
            for _ in range(500):                 # the daemon's runner picks it up at once
                batch = await sdk.batches.retrieve(batch.id)
                if batch.status == "completed":
                    break
                await asyncio.sleep(0.02)
            assert batch.status == "completed" and batch.request_counts.completed == 5
            out = (await sdk.files.content(batch.output_file_id)).text
        import aiohttp
        async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
            metrics = await resp.text()
        assert 'inferd_batch_lines_total{result="ok"} 5.0' in metrics
        assert 'inferd_batches_ended_total{status="completed"} 1.0' in metrics
    assert sorted(json.loads(line)["custom_id"] for line in out.splitlines()) == [f"c{i}" for i in range(5)]
