"""inferd.store.owner: the owner string names node, pid and start (boot, PID namespace, start tick); a
process is dead only on proof from its own namespace: its pid is absent, or now belongs to a process that
started at another tick. Another namespace, a /proc entry we may not read, an older form: alive."""
from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator

import pytest

from inferd.store import owner as owners
from inferd.store.owner import ProcessId, alive, dead_here, owner, parse, this_process

needs_proc = pytest.mark.skipif(owners._NAMESPACE is None, reason="namespaces and start ticks are read from /proc")


def test_an_owner_string_names_this_process_and_parses_back():
    text = owner("node-a", "req/with/slashes")
    me = this_process("node-a")
    assert text == f"node-a/{os.getpid()}/{me.start}/req/with/slashes" and text.startswith(me.prefix)
    assert parse(text) == me and alive(me)


@needs_proc
def test_the_start_names_the_boot_and_the_pid_namespace():
    boot, namespace, tick = this_process("n").start.split(".")
    assert int(namespace) == os.stat("/proc/self/ns/pid").st_ino and tick.isdigit() and len(boot) == 12


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


def other_namespace(start: str) -> str:
    """`start` as another PID namespace of this boot writes it."""
    boot, namespace, tick = start.split(".") if start.count(".") == 2 else ("b0a1", "0", start)
    return f"{boot}.{int(namespace) + 1}.{tick}"


@pytest.fixture
async def sleeper() -> AsyncIterator[int]:
    """The pid of another process that runs for the test."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")
    try:
        yield proc.pid
    finally:
        proc.kill()
        await proc.wait()


def started(pid: int) -> str:
    """The start an owner string of process `pid` (of this namespace) carries."""
    return f"{owners._NAMESPACE}.{owners._read_tick(pid)}"


async def test_a_process_whose_pid_is_absent_is_dead():
    assert not alive(await dead_process("n"))


@needs_proc
def test_a_reused_pid_is_not_the_process_that_had_it():
    assert not alive(ProcessId("n", os.getpid(), f"{owners._NAMESPACE}.1"))


@needs_proc
async def test_another_running_process_is_alive_with_its_own_start_only(sleeper):
    assert started(sleeper) != this_process("n").start
    assert alive(ProcessId("n", sleeper, started(sleeper)))
    assert not alive(ProcessId("n", sleeper, this_process("n").start))


@needs_proc
async def test_a_process_of_another_pid_namespace_or_boot_is_alive_whatever_its_pid_is_here():
    boot, namespace, tick = this_process("n").start.split(".")
    gone = await exited_pid()
    for start in (f"{boot}.{int(namespace) + 1}.{tick}", f"{'0' * 12}.{namespace}.{tick}"):
        assert alive(ProcessId("n", gone, start))                        # absent here
        assert alive(ProcessId("n", 1, start)) and alive(ProcessId("n", os.getpid(), start))   # another here


@needs_proc
async def test_a_process_whose_proc_entry_may_not_be_read_is_alive(sleeper, monkeypatch):
    def denied(pid: int) -> str:
        raise PermissionError(13, "Permission denied")                 # hidepid=noaccess, another user
    monkeypatch.setattr(owners, "_read_tick", denied)
    assert alive(ProcessId("n", sleeper, f"{owners._NAMESPACE}.1"))
    assert alive(ProcessId("n", await exited_pid(), f"{owners._NAMESPACE}.1"))


@needs_proc
async def test_a_hidden_proc_entry_is_absent_only_when_the_pid_is(sleeper, monkeypatch):
    def hidden(pid: int) -> str:
        raise FileNotFoundError(2, "No such file or directory")        # hidepid=invisible, ProtectProc=invisible
    monkeypatch.setattr(owners, "_read_tick", hidden)
    assert alive(ProcessId("n", sleeper, f"{owners._NAMESPACE}.1"))
    assert not alive(ProcessId("n", await exited_pid(), f"{owners._NAMESPACE}.1"))


@needs_proc
@pytest.mark.parametrize("form", ["boot-and-tick", "import-time", "junk"])
async def test_an_owner_in_an_older_form_is_alive_and_left_to_lapse(form):
    boot, _, tick = this_process("n").start.split(".")
    start = {"boot-and-tick": f"{boot}.{tick}", "import-time": "t1764300000000", "junk": "x"}[form]
    assert alive(ProcessId("n", await exited_pid(), start))
    assert parse(f"n/{os.getpid()}/{start}/req-1") == ProcessId("n", os.getpid(), start)


async def test_dead_here_keeps_only_this_nodes_processes_that_no_longer_run():
    me = this_process("n")
    gone = await dead_process("n")
    elsewhere = ProcessId("m", gone.pid, me.start)
    owners_ = [me.prefix + "r1", gone.prefix + "r2", gone.prefix + "r3", elsewhere.prefix + "r4", "old-req", None]
    assert dead_here("n", owners_) == [gone]
