"""inferd.store.batches_cli: `inferd batches list|show|cancel` beside a running daemon and without one."""
from __future__ import annotations

import asyncio
import json
import sys

from inferd.config.root import load_config
from tests.api.batch_harness import chat_line, jsonl
from tests.daemon.harness import running_daemon, sim_model, write_config

# The subcommand as `inferd` runs it (inferd/__main__.py wires the same two functions).
CLI = ("import argparse, sys\n"
       "from inferd.store import add_batches_parser, batches_main\n"
       "p = argparse.ArgumentParser(prog='inferd'); add_batches_parser(p.add_subparsers(dest='command'))\n"
       "sys.exit(batches_main(p.parse_args(sys.argv[1:])))\n")


async def cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", CLI, "batches", *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


async def test_list_show_and_cancel_beside_a_running_daemon_then_without_one(tmp_path):
    path = write_config(tmp_path / "inferd.toml", {"sim": sim_model(time_scale=0.0)})
    config = str(path)
    async with running_daemon(load_config(path), run_batches=False) as (_, _, url):    # they stay as created
        from openai import AsyncOpenAI
        async with AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as client:
            made = await client.files.create(file=("in.jsonl", jsonl(chat_line("a"))), purpose="batch")
            first, second = [await client.batches.create(input_file_id=made.id, endpoint="/v1/chat/completions",
                                                         completion_window="24h") for _ in range(2)]
        code, out, err = await cli("list", "--config", config)
        assert code == 0, err
        header, *rows = out.splitlines()
        assert header.split("\t")[:3] == ["id", "tenant", "status"]
        assert [r.split("\t")[:3] for r in rows] == [[second.id, "local", "validating"],
                                                     [first.id, "local", "validating"]]
        code, out, err = await cli("show", first.id, "--config", config)
        assert code == 0, err
        shown = json.loads(out)
        assert shown["id"] == first.id and shown["tenant"] == "local" and shown["request_counts"]["total"] == 1
        code, out, err = await cli("cancel", first.id, "--config", config, "--url", url)   # daemon holds it: its API
        assert code == 0, err
        assert json.loads(out)["status"] == "cancelling"
    code, out, err = await cli("cancel", second.id, "--config", config)          # no daemon: written directly
    assert code == 0, err
    assert json.loads(out)["status"] == "cancelling"
    code, out, err = await cli("list", "--config", config, "--format", "json")
    assert [json.loads(line)["status"] for line in out.splitlines()] == ["cancelling", "cancelling"]
    code, _, err = await cli("show", "batch_nope", "--config", config)
    assert code == 1 and "no batch 'batch_nope'" in err
    code, _, err = await cli("list", "--config", str(tmp_path / "missing.toml"))
    assert code == 1
