"""`[server] front_processes`: how many SSE writer processes the daemon starts ("auto" or a count).

"auto" sizes the front from the CPUs this process may run on (os.sched_getaffinity, so a cgroup or taskset
limit counts): below MIN_AUTO_CPUS it is 0 (every stream written in the daemon, as before writers existed),
else min(MAX_AUTO_WRITERS, cpus // CPUS_PER_AUTO_WRITER).
Why those numbers: a full 8-GPU node decodes about 225k tokens/s and one writer costs at most about 10 ms of
CPU per 1k tokens, so 4 writers carry the node at about 56% of a core each; more writers only take cores
from the engine-owning process and the engines' own threads, which need them more. One writer per 4 CPUs
leaves at least three quarters of the machine to those.
"""
from __future__ import annotations

import os
from typing import Literal

FrontProcesses = int | Literal["auto"]

MIN_AUTO_CPUS = 4
CPUS_PER_AUTO_WRITER = 4
MAX_AUTO_WRITERS = 4


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):       # not Linux: no affinity call
        return os.cpu_count() or 1


def resolve_front_processes(setting: FrontProcesses, cpus: int | None = None) -> int:
    """The writer-process count for `setting`: an int as given, "auto" from the usable CPUs."""
    if setting != "auto":
        return int(setting)
    cpus = usable_cpus() if cpus is None else cpus
    if cpus < MIN_AUTO_CPUS:
        return 0
    return min(MAX_AUTO_WRITERS, cpus // CPUS_PER_AUTO_WRITER)


def front_processes_errors(setting: object) -> list[str]:
    """What is wrong with `setting`, as config errors naming server.front_processes."""
    if setting == "auto":
        return []
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 0:
        return [f'server.front_processes: must be "auto" or a whole number >= 0 (0: no writer processes), '
                f"got {setting!r}"]
    return []
