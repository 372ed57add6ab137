"""CPU time per process of a server and every process under it, by role, over a measuring window (Linux /proc).

A server that spreads its front over several processes (writers, API processes) still has one process that
owns the engines. Its CPU per token, not the machine's core count, says how far one node goes: a process
is one event loop, so its CPU per token bounds the tokens/s one core of it carries on any machine.

Each process's role is read from what it says about itself, first match wins:
- a process title set with setproctitle (`/proc/<pid>/cmdline` without NULs): `inferd: <role> ...` or
  `inferd-<role> ...`;
- a thread name set with prctl(PR_SET_NAME) (`/proc/<pid>/comm`): `inferd-<role>`;
- for a process below the root, `--role <role>` in its argv (the root's own `--role` is the bench's name for
  how it started it, not a role in the server);
- otherwise the root is `engine` (the daemon that owns the engines) and any other process `child`. Should a
  descendant call itself `engine`, the root that does not name itself is `main`.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

NODE_TOKENS_PER_S = 225_000          # 8 GPUs x ~28,000 tokens/s (an 8B model on an H100 at batch 256)
ENGINE = "engine"
_TITLE = re.compile(r"^inferd[:\- ]\s*([A-Za-z][\w-]*)")


@dataclass(frozen=True)
class Sample:
    """One process at one end of a window: its role and the user + system CPU seconds it had used."""
    pid: int
    start_ticks: int                 # its start time: a pid reused in the window is another process
    role: str
    cpu_s: float


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command name (which may hold spaces): state is [0]."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def children(pid: int) -> list[int]:
    """The direct children of `pid`: from every thread's /proc children list, else a scan of /proc."""
    tasks = Path(f"/proc/{pid}/task")
    try:
        found: set[int] = set()
        for task in tasks.iterdir():
            found.update(int(c) for c in (task / "children").read_text().split())
        return sorted(found)
    except FileNotFoundError:        # a kernel without CONFIG_PROC_CHILDREN, or the process is gone
        pass
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(_stat_fields(int(entry.name))[1]) == pid:
                    found.add(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return sorted(found)


def descendants(root: int) -> list[int]:
    """`root` and every process under it, parents before children."""
    order, queue = [], [root]
    while queue:
        pid = queue.pop(0)
        order.append(pid)
        try:
            queue.extend(children(pid))
        except OSError:              # it exited while being walked
            continue
    return order


def role_of(pid: int, is_root: bool) -> str | None:
    """The role `pid` names for itself, or None when it names none (see the module's note)."""
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    argv = [a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")]
    if len(argv) == 1:               # setproctitle joins the title into one string
        found = _TITLE.match(argv[0])
        if found:
            return found.group(1)
    comm = Path(f"/proc/{pid}/comm").read_text().strip()
    if comm.startswith("inferd-") and len(comm) > len("inferd-"):
        return comm[len("inferd-"):]
    if not is_root and "--role" in argv[:-1]:
        return argv[argv.index("--role") + 1]
    return None


def sample_tree(root: int) -> list[Sample]:
    """Every process of the tree under `root` (itself included), each with its role and CPU seconds so far."""
    tick = os.sysconf("SC_CLK_TCK")
    named: list[tuple[int, int, str | None, float]] = []
    for pid in descendants(root):
        try:
            fields = _stat_fields(pid)
            named.append((pid, int(fields[19]), role_of(pid, pid == root),
                          (int(fields[11]) + int(fields[12])) / tick))
        except (OSError, IndexError, ValueError):
            continue                 # exited between the walk and the read
    engine_below = any(role == ENGINE for pid, _, role, _ in named if pid != root)
    default_root = "main" if engine_below else ENGINE
    return [Sample(pid, start, role or (default_root if pid == root else "child"), cpu)
            for pid, start, role, cpu in named]


def window_cpu(before: list[Sample], after: list[Sample]) -> dict[str, list[float]]:
    """Per role, each process's CPU seconds in the window. A process born in it counts from zero; one that
    exited in it is not seen (its CPU lands in its parent's reaped-children time, which this leaves out)."""
    start = {(s.pid, s.start_ticks): s.cpu_s for s in before}
    per_role: dict[str, list[float]] = {}
    for s in after:
        per_role.setdefault(s.role, []).append(s.cpu_s - start.get((s.pid, s.start_ticks), 0.0))
    return per_role


def per_1k_tokens(per_role: dict[str, list[float]], tokens: float) -> dict[str, dict]:
    """Per role: process count, CPU ms per 1k tokens summed over its processes and the mean per process."""
    out = {}
    for role, seconds in per_role.items():
        total_ms = sum(seconds) * 1000 / max(1.0, tokens) * 1000
        out[role] = {"processes": len(seconds), "ms_per_1k_tokens": total_ms, "mean_ms_per_1k_tokens":
                     total_ms / len(seconds)}
    return out


def projection(roles: dict[str, dict]) -> dict:
    """Cores each role needs for a node's NODE_TOKENS_PER_S, their total, and what one engine core carries."""
    cores = {role: r["ms_per_1k_tokens"] * NODE_TOKENS_PER_S / 1000 / 1000 for role, r in roles.items()}
    engine_ms = roles.get(ENGINE, {}).get("ms_per_1k_tokens", 0.0)
    return {"node_tokens_per_s": NODE_TOKENS_PER_S, "cores": cores, "total_cores": sum(cores.values()),
            "engine_core_tokens_per_s": 1e6 / engine_ms if engine_ms > 0 else float("inf")}


def role_lines(roles: dict[str, dict], projected: dict) -> list[str]:
    """The summary lines: one per role (the engine's first), then the projected node throughput."""
    lines = []
    for role in sorted(roles, key=lambda r: (r != ENGINE, r)):
        r = roles[role]
        if r["processes"] == 1:
            lines.append(f"{role} process CPU per 1k tokens: {r['ms_per_1k_tokens']:.2f} ms")
        else:
            lines.append(f"{role} process CPU per 1k tokens: {r['mean_ms_per_1k_tokens']:.2f} ms (mean of "
                         f"{r['processes']} processes, {r['ms_per_1k_tokens']:.2f} ms together)")
    by_role = ", ".join(f"{role} {cores:.2f}" for role, cores in sorted(projected["cores"].items(),
                                                                       key=lambda rc: (rc[0] != ENGINE, rc[0])))
    lines.append(f"projected node throughput: {projected['node_tokens_per_s']:,} tokens/s needs "
                 f"{projected['total_cores']:.2f} cores ({by_role}); one engine process core carries "
                 f"{projected['engine_core_tokens_per_s']:,.0f} tokens/s")
    return lines


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds used so far by `root` and every live process under it."""
    return sum(s.cpu_s for s in sample_tree(root))
