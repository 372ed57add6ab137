"""inferd.store.owner: the owner string names node, pid and start; a process is dead when its pid is gone
or now belongs to a process that started at another time."""
from __future__ import annotations

import asyncio
import os
import sys

import pytest

from inferd.store.owner import ProcessId, _proc_start, alive, dead_here, owner, parse, this_process


def test_an_owner_string_names_this_process_and_parses_back():
    text = owner("node-a", "req/with/slashes")
    me = this_process("node-a")
    assert text == f"node-a/{os.getpid()}/{me.start}/req/with/slashes" and text.startswith(me.prefix)
    assert parse(text) == me and alive(me)


@pytest.mark.parametrize("text", [None, "", "req-123", "host:12:abc", "node/notapid/start/x", "node/12/start",
                                  "/12/start/x", "node/12//x"])
def test_strings_in_another_form_name_no_process(text):
    assert parse(text) is None


def test_a_node_name_with_a_slash_is_refused():
    with pytest.raises(ValueError):
        owner("a/b", "x")


async def exited_pid() -> int:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await proc.wait()
    return proc.pid


async def dead_process(node: str) -> ProcessId:
    """A process of this host that has exited, as an owner string names it (the store tests use it)."""
    return ProcessId(node, await exited_pid(), this_process(node).start)


async def test_a_process_that_exited_is_dead_and_one_running_with_another_start_is_not_it():
    assert not alive(ProcessId("n", await exited_pid(), this_process("n").start))
    assert not alive(ProcessId("n", os.getpid(), "another-start"))       # a reused pid: not the dead one


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="starts are read from /proc")
async def test_another_running_process_is_alive_with_its_own_start_only():
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(30)")
    try:
        start = _proc_start(proc.pid)
        assert start is not None and start != this_process("n").start
        assert alive(ProcessId("n", proc.pid, start))
        assert not alive(ProcessId("n", proc.pid, this_process("n").start))
    finally:
        proc.kill()
        await proc.wait()


async def test_dead_here_keeps_only_this_nodes_processes_that_no_longer_run():
    me = this_process("n")
    gone = await dead_process("n")
    elsewhere = ProcessId("m", gone.pid, me.start)
    owners = [me.prefix + "r1", gone.prefix + "r2", gone.prefix + "r3", elsewhere.prefix + "r4", "old-req", None]
    assert dead_here("n", owners) == [gone]
