"""Which process holds an Idempotency-Key claim or a batch lease: "node/pid/start[/detail]".

A claim or lease names its holder's process so that, when a daemon starts, the rows its crashed
predecessor on the same node left behind can be released at once instead of waiting out their hold
or lease. `node` is the node's name in the ledger (the cluster node id, else the host name; neither
holds a "/"); `detail` (the request id, the runner) keeps each holder's own rows apart.

`start` says where and when the process started: on Linux "<boot>.<pidns>.<tick>", the boot's id, the
inode of its PID namespace and its start tick (/proc), all fixed for the process's life; elsewhere
"t<ms>", the time this module was first imported. A pid means something only in its PID namespace:
two containers on one host (host networking, so one host name) may both run a daemon as pid 1. So a
process is judged dead only from its own namespace, and only on proof: its pid is absent, or belongs
to a process that started at another tick (a reused pid). A process of another namespace or boot, one
whose /proc entry we may not read (hidepid, ProtectProc=invisible, another user), an owner in an
older form (no namespace in it), or any process when ours has no /proc of its own namespace, counts
as alive: its rows lapse at their hold or lease.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

from inferd.store.db import Database

SEP = "/"


class ProcessId(NamedTuple):
    node: str
    pid: int
    start: str

    @property
    def prefix(self) -> str:
        """What every owner string of this process begins with."""
        return f"{self.node}{SEP}{self.pid}{SEP}{self.start}{SEP}"


def _read_tick(pid: int) -> str | None:
    """The start tick of process `pid` of /proc's namespace; None if its stat has an unexpected form.
    Raises OSError as the read does (FileNotFoundError: absent or hidden; PermissionError: denied)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may hold spaces and parentheses: count fields after its last ")".
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None      # field 22: starttime


def _namespace() -> str | None:
    """"<boot>.<pidns>" of this process; None without a /proc of its own PID namespace (not Linux, or a
    /proc mounted from another namespace, whose pids are not ours)."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return None
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:12]
        return f"{boot}.{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return None


def _start() -> str:
    if _NAMESPACE is not None:
        try:
            tick = _read_tick(os.getpid())
        except OSError:
            tick = None
        if tick is not None:
            return f"{_NAMESPACE}.{tick}"
    return f"t{int(time.time() * 1000)}"


_NAMESPACE = _namespace()
_START = _start()
_PID = os.getpid()
_NO_NAMESPACES = not sys.platform.startswith("linux")      # one pid space per host


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


def _no_such_pid(pid: int) -> bool:
    """Whether no process of our namespace has `pid` (a signal 0 finds one we may not read or signal)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _gone(pid: int, tick: str) -> bool:
    """Whether process `pid` of our namespace, started at `tick`, no longer runs: its pid is absent, or
    now belongs to a process started at another tick."""
    try:
        now = _read_tick(pid)
    except (FileNotFoundError, ProcessLookupError):
        return _no_such_pid(pid)        # hidepid=invisible reports another user's process as absent
    except OSError:
        return False                    # EACCES, EPERM: it is there, we may not look
    return now is not None and now != tick


def alive(process: ProcessId) -> bool:
    """Whether `process` may still run: False only when it is provably gone (see the module's doc)."""
    if (process.pid, process.start) == (_PID, _START):
        return True
    namespace, _, tick = process.start.rpartition(".")
    if _NAMESPACE is not None:
        return namespace != _NAMESPACE or not _gone(process.pid, tick)
    if _NO_NAMESPACES and process.start.startswith("t"):   # not Linux, here nor there: only the pid can be checked
        return not _no_such_pid(process.pid)
    return True                         # Linux without a /proc of our namespace: nothing can be proved


def dead_here(node: str, owners: list[str | None]) -> list[ProcessId]:
    """Of the processes `owners` name, those on `node` (this one) that no longer run: their claims and
    leases can go. Another node's are left alone (that process may be alive; its rows expire)."""
    found = {p for p in map(parse, owners) if p is not None and p.node == node}
    return sorted(p for p in found if not alive(p))


async def release_dead(db: Database, node: str, *, table: str, column: str, condition: str,
                       clear: str | None = None) -> int:
    """Release the rows of `table` matching `condition` whose `column` names a process on `node` (this
    one) that no longer runs: set `clear` (a SET list), or delete them when `clear` is None. How many."""
    # `length(?)`, not a length parameter: PostgreSQL's substr wants an integer, which a bound int may not be.
    mine = f"{condition} AND substr({column}, 1, length(?)) = ?"
    prefix = node + SEP
    held = [o for (o,) in await db.query(f"SELECT DISTINCT {column} FROM {table} WHERE {mine}", (prefix, prefix))]
    change = f"UPDATE {table} SET {clear}" if clear is not None else f"DELETE FROM {table}"
    released = 0
    for process in dead_here(node, held):
        released += await db.execute(f"{change} WHERE {mine}", (process.prefix, process.prefix))
    return released
