from __future__ import annotations

import asyncio

from inferd.config.root import parse_config
from inferd.daemon.serve import run_daemon


def sim_config():
    raw_model = {"backend": "sim", "max_batch_size": 4, "max_num_tokens": 64, "num_kv_blocks": 64,
                 "sim": {"profile": "tiny", "time_scale": 0.01, "max_model_len": 1024}}
    return parse_config({"server": {"port": 0}, "models": {"sim": raw_model}})


async def test_run_daemon_relays_ready_and_stop_events():
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.ensure_future(run_daemon(sim_config(), ready_event=ready, stop_event=stop))
    await ready.wait()
    stop.set()
    assert await task == 0

