"""/openapi.json matches behaviour: schemathesis runs every check against the real daemon and finds nothing.

The daemon runs in this test's loop (tests/daemon/harness.py) on an ephemeral loopback port; `st run`
runs in a subprocess against it, as an operator would run it. Two things no
JSON Schema can state are configured, each with its reason, beside this file: schemathesis.toml
(413 for a body over server.max_body_bytes) and schemathesis_hooks.py (integers spelled `2.0`).
"""
from __future__ import annotations

import asyncio
import re
import os
import sys
from pathlib import Path

from tests.daemon.harness import running

HERE = Path(__file__).parent
CONFIG = """\
[server]
host = "127.0.0.1"
port = 0
log_level = "warning"

[models.sim]
backend = "sim"
max_batch_size = 64
max_num_tokens = 8192

[models.sim.sim]
profile = "tiny"
time_scale = 0.0
max_model_len = 512

# `store: true` on /v1/responses needs a tenant whose retention keeps text (docs/privacy.md)
[tenants.local]
retention = "1h"
"""
# Enough for every phase (examples, coverage, fuzzing, stateful) to reach each operation in a few
# seconds; a fixed seed keeps the suite deterministic. Without --seed, `st run` explores further.
MAX_EXAMPLES = 12
SEED = 20261124


async def test_schemathesis_with_every_check_finds_nothing_against_the_real_daemon(tmp_path: Path) -> None:
    config = tmp_path / "inferd.toml"
    config.write_text(CONFIG)
    env = {**os.environ, "SCHEMATHESIS_HOOKS": str(HERE / "schemathesis_hooks.py"),
           "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    async with running(config) as (_, url):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "schemathesis.cli", "--no-color", "--config-file", str(HERE / "schemathesis.toml"),
            "run", f"{url}/openapi.json", "--checks", "all", "--max-examples", str(MAX_EXAMPLES),
            "--seed", str(SEED), "--generation-database", "none",
            cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        try:
            output, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    report = output.decode(errors="replace")
    assert proc.returncode == 0, report[-20000:]
    # every documented operation was run (schemathesis words its summary two ways)
    assert re.search(r"Operations:\s+33 selected / 33 total|Selected: 33/33", report), report[-5000:]
