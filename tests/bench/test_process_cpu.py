"""bench/process_cpu.py: a server's process tree is found and each process named by the role it gives itself,
CPU is split per role over a window, and the projection is the arithmetic docs/performance.md describes."""
from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.scripts import load_script

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux /proc")


def load_bench():
    return load_script("process_cpu")


# Each child says it is ready once it has named itself, then waits for its stdin to close.
CHILD_WAITS = "import sys; print('ready', flush=True); sys.stdin.read()"
CHILD_NAMES_ITSELF = ("import ctypes, sys; ctypes.CDLL(None).prctl(15, b'inferd-api', 0, 0, 0); "  # PR_SET_NAME
                      "print('ready', flush=True); sys.stdin.read()")
# The root (started with --role daemon, as the benches start the daemon) starts four children: one with
# `--role <its first argument>` in its argv, one titled as setproctitle would (argv[0] alone: python reads the program
# from stdin), one named with prctl, one that names nothing; then says ready and waits for its stdin to close.
ROOT = f"""
import os, subprocess, sys
py = sys.executable
held, hold = os.pipe()      # its program comes on stdin, so it waits for this pipe's end instead
kids = [subprocess.Popen([py, "-c", {CHILD_WAITS!r}, "--role", sys.argv[1]], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE),
        subprocess.Popen(["inferd: writer 1"], executable=py, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         pass_fds=[held]),
        subprocess.Popen([py, "-c", {CHILD_NAMES_ITSELF!r}], stdin=subprocess.PIPE, stdout=subprocess.PIPE),
        subprocess.Popen([py, "-c", {CHILD_WAITS!r}], stdin=subprocess.PIPE, stdout=subprocess.PIPE)]
kids[1].stdin.write(f"import os; print('ready', flush=True); os.read({{held}}, 1)".encode())
kids[1].stdin.close()
for kid in kids:
    assert kid.stdout.readline() == b"ready\\n"
print("ready", flush=True)
sys.stdin.read()
os.close(hold)
for kid in kids:
    if not kid.stdin.closed:
        kid.stdin.close()
    kid.wait()
"""


def sample_tree_of(bench, first_child_role: str) -> tuple[int, list]:
    root = subprocess.Popen([sys.executable, "-c", ROOT, first_child_role, "--role", "daemon"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        ready, _, _ = select.select([root.stdout], [], [], 60)
        assert ready and root.stdout.readline() == b"ready\n"
        return root.pid, bench.sample_tree(root.pid)
    finally:
        root.stdin.close()
        root.wait(timeout=60)
        root.stdout.close()


def test_every_process_under_the_root_is_found_and_named_by_the_role_it_gives_itself():
    bench = load_bench()
    root, samples = sample_tree_of(bench, "writer")
    roles = sorted(s.role for s in samples)
    assert roles == ["api", "child", "engine", "writer", "writer"], roles
    assert [s.pid for s in samples if s.role == "engine"] == [root]
    assert all(s.cpu_s >= 0 for s in samples)
    assert bench.role_of(os.getpid(), is_root=True) is None                  # pytest names no role


def test_the_root_is_main_when_a_process_under_it_owns_the_engines():
    bench = load_bench()
    root, samples = sample_tree_of(bench, "engine")
    assert sorted(s.role for s in samples) == ["api", "child", "engine", "main", "writer"]
    assert [s.pid for s in samples if s.role == "main"] == [root]


def test_window_cpu_counts_a_process_born_in_the_window_from_zero_and_a_reused_pid_as_new():
    bench = load_bench()
    before = [bench.Sample(10, 100, "engine", 5.0), bench.Sample(11, 100, "writer", 2.0)]
    after = [bench.Sample(10, 100, "engine", 6.5), bench.Sample(11, 900, "writer", 0.25),
             bench.Sample(12, 950, "writer", 0.75)]
    assert bench.window_cpu(before, after) == {"engine": [1.5], "writer": [0.25, 0.75]}


def test_per_role_figures_and_the_node_projection():
    bench = load_bench()
    roles = bench.per_1k_tokens({"engine": [1.78], "writer": [0.5, 0.3]}, tokens=100_000)
    assert roles["engine"] == {"processes": 1, "ms_per_1k_tokens": pytest.approx(17.8),
                               "mean_ms_per_1k_tokens": pytest.approx(17.8)}
    assert roles["writer"]["mean_ms_per_1k_tokens"] == pytest.approx(4.0)
    projected = bench.projection(roles)
    assert projected["cores"]["engine"] == pytest.approx(17.8 * 0.225)      # 225 x 1k tokens a second
    assert projected["total_cores"] == pytest.approx((17.8 + 8.0) * 0.225)
    assert projected["engine_core_tokens_per_s"] == pytest.approx(1e6 / 17.8)
    lines = bench.role_lines(roles, projected)
    assert lines[0] == "engine process CPU per 1k tokens: 17.80 ms"
    assert lines[1] == "writer process CPU per 1k tokens: 4.00 ms (mean of 2 processes, 8.00 ms together)"
    assert lines[2].startswith("projected node throughput: 225,000 tokens/s needs 5.80 cores (engine 4.00, "
                               "writer 1.80); one engine process core carries 56,180 tokens/s")
