"""The shipped unit file must verify cleanly, stay hardened (exposure <= 2.5), and let through every system call
the daemon's own code makes (its seccomp filter answers EPERM otherwise, which the code may only log)."""
import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "inferd.service"

needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")


def installed_copy(tmp_path: Path) -> Path:
    """The unit as installed: ExecStart points at an inferd that exists on this machine."""
    text = UNIT.read_text().replace("/opt/inferd/.venv/bin/inferd", str(Path(sys.executable).parent / "inferd"))
    path = tmp_path / "inferd.service"
    path.write_text(text)
    return path


def test_unit_is_type_notify_with_watchdog_and_reload():
    text = UNIT.read_text()
    assert re.search(r"^Type=notify$", text, re.M)
    assert re.search(r"^WatchdogSec=\d+", text, re.M)
    assert re.search(r"^ExecReload=/bin/kill -HUP \$MAINPID$", text, re.M)


@needs_analyze
def test_systemd_analyze_verify_is_clean(tmp_path):
    result = subprocess.run(["systemd-analyze", "verify", str(installed_copy(tmp_path))],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


@needs_analyze
def test_security_exposure_is_at_most_2_5(tmp_path):
    result = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(installed_copy(tmp_path))],
                            capture_output=True, text=True, timeout=60)
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= 2.5


# Python calls that make a system call a seccomp filter may refuse -> the system calls glibc makes for them
# (x86_64; glibc's nice() is getpriority + setpriority, its setrlimit() is prlimit64).
PY_SYSCALLS = {
    "os.setpriority": {"setpriority"}, "os.getpriority": {"getpriority"}, "os.nice": {"getpriority", "setpriority"},
    "os.sched_setaffinity": {"sched_setaffinity"}, "os.sched_getaffinity": {"sched_getaffinity"},
    "os.sched_setscheduler": {"sched_setscheduler"}, "os.sched_setparam": {"sched_setparam"},
    "resource.setrlimit": {"prlimit64"}, "resource.prlimit": {"prlimit64"}, "os.posix_fadvise": {"fadvise64"},
    "mmap.madvise": {"madvise"}, "os.mlock": {"mlock"},
}
SYSCALLS = sorted(set().union(*PY_SYSCALLS.values()))
# Each group the unit names, restricted to SYSCALLS, with its nested groups expanded: `systemd-analyze
# syscall-filter <group>` (systemd 252), checked below against this machine's systemd when it has one.
GROUPS = {
    "@system-service": set(SYSCALLS),
    "@resources": {"setpriority", "sched_setaffinity", "sched_setscheduler", "sched_setparam"},
    **{g: set() for g in ("@privileged", "@mount", "@swap", "@reboot", "@obsolete", "@debug", "@cpu-emulation",
                          "@module", "@raw-io", "@clock")},
}


def allowed_syscalls(unit_text: str) -> set[str]:
    """Of SYSCALLS, those the unit's SystemCallFilter= lines let through. systemd.exec(5): the first line's
    kind (allow list, or `~` deny list) sets the default; each later line adds its calls to the allowed set
    (an allow line) or takes them out (a deny line), in order."""
    lines = re.findall(r"^SystemCallFilter=(.*)$", unit_text, re.M)
    allowed = set(SYSCALLS)
    for i, value in enumerate(lines):
        deny = value.startswith("~")
        names = set()
        for item in value.lstrip("~").split():
            names |= GROUPS[item] if item.startswith("@") else {item} & set(SYSCALLS)
        if i == 0:
            allowed = set(SYSCALLS) - names if deny else names
        else:
            allowed = allowed - names if deny else allowed | names
    return allowed


def calls_in_daemon_code() -> dict[str, set[str]]:
    """PY_SYSCALLS keys the daemon's code calls -> the files calling them (read with ast, so comments don't count)."""
    found: dict[str, set[str]] = {}
    for path in sorted((UNIT.parents[1] / "inferd").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                name = f"{node.value.id}.{node.attr}"
                if name in PY_SYSCALLS:
                    found.setdefault(name, set()).add(path.name)
    return found


def test_every_system_call_the_daemons_code_makes_passes_the_units_filter():
    used = calls_in_daemon_code()
    assert "os.setpriority" in used               # engine/loading.py: loads at nice 19 so serving keeps the CPU
    allowed = allowed_syscalls(UNIT.read_text())
    refused = {call: sorted(PY_SYSCALLS[call] - allowed) for call in used if PY_SYSCALLS[call] - allowed}
    assert not refused, f"the unit's SystemCallFilter refuses {refused} (called in {used})"


def test_the_filter_reading_follows_systemds_order():
    assert "setpriority" not in allowed_syscalls("SystemCallFilter=@system-service\nSystemCallFilter=~@resources\n")
    assert "setpriority" in allowed_syscalls("SystemCallFilter=@system-service\nSystemCallFilter=~@resources\n"
                                             "SystemCallFilter=setpriority\n")
    assert allowed_syscalls("SystemCallFilter=~@resources\n") == set(SYSCALLS) - GROUPS["@resources"]


@needs_analyze
def test_the_group_table_matches_this_machines_systemd():
    for group, members in GROUPS.items():
        out = subprocess.run(["systemd-analyze", "syscall-filter", group], capture_output=True, text=True,
                             timeout=60).stdout
        listed = set(re.findall(r"^\s+([a-z_0-9]+)$", out, re.M))
        for nested in re.findall(r"^\s+(@[a-z-]+)$", out, re.M):
            out = subprocess.run(["systemd-analyze", "syscall-filter", nested], capture_output=True, text=True,
                                 timeout=60).stdout
            listed |= set(re.findall(r"^\s+([a-z_0-9]+)$", out, re.M))
        assert listed & set(SYSCALLS) == members, group
