"""Which process holds an Idempotency-Key claim or a batch lease: "node/pid/start[/detail]".

A claim or lease names its holder's process so that, when a daemon starts, the rows its crashed
predecessor on the same node left behind can be released at once instead of waiting out their hold
or lease. `node` is the node's name in the ledger (the cluster node id, else the host name; neither
holds a "/"); `start` is when the process started, so a pid the kernel has reused does not pass for
the dead process: on Linux the boot's id and the process's start tick (/proc), both fixed for the
process's life; elsewhere the time this module was first imported. `detail` (the request id, the
runner) keeps each holder's own rows apart.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import NamedTuple

SEP = "/"


class ProcessId(NamedTuple):
    node: str
    pid: int
    start: str

    @property
    def prefix(self) -> str:
        """What every owner string of this process begins with."""
        return f"{self.node}{SEP}{self.pid}{SEP}{self.start}{SEP}"


def _proc_start(pid: int) -> str | None:
    """The boot id and the start tick of process `pid` ("b1f0c2d4.123456"); None without /proc or that process."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:12]
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count fields after its last ")".
    fields = stat[stat.rfind(")") + 2:].split()
    return f"{boot}.{fields[19]}" if len(fields) > 19 else None   # field 22: starttime


_PROC = Path("/proc/self/stat").exists()
_START = _proc_start(os.getpid()) or f"t{int(time.time() * 1000)}"
_PID = os.getpid()


def this_process(node: str) -> ProcessId:
    """This process on `node`."""
    if not node or SEP in node:
        raise ValueError(f"a node name is not empty and holds no {SEP!r}, got {node!r}")
    return ProcessId(node, _PID, _START)


def owner(node: str, detail: str) -> str:
    """The owner string of this process's claim or lease: "node/pid/start/detail"."""
    return this_process(node).prefix + detail


def parse(text: str | None) -> ProcessId | None:
    """The process an owner string names; None for one in another form (written before owners named
    their process)."""
    parts = (text or "").split(SEP, 3)
    if len(parts) < 4 or not parts[0] or not parts[1].isdigit() or not parts[2]:
        return None
    return ProcessId(parts[0], int(parts[1]), parts[2])


def alive(process: ProcessId) -> bool:
    """Whether `process` (on this host) still runs: its pid exists and, where /proc says, started when it
    says. Without /proc a pid that exists counts as alive (its start cannot be checked)."""
    if (process.pid, process.start) == (_PID, _START):
        return True
    if _PROC:
        return _proc_start(process.pid) == process.start
    try:
        os.kill(process.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def dead_here(node: str, owners: list[str | None]) -> list[ProcessId]:
    """Of the processes `owners` name, those on `node` (this one) that no longer run: their claims and
    leases can go. Another node's are left alone (that process may be alive; its rows expire)."""
    found = {p for p in map(parse, owners) if p is not None and p.node == node}
    return sorted(p for p in found if not alive(p))
