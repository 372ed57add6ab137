"""bench/writer_frames.py: one writer process fed STEPs as the daemon feeds it prints its CPU per frame. A run of a
second at 32 streams: the lines are there and the figures positive, never bounded (CPU per frame is the machine's
speed as much as the code's)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# A benchmark: run by `pytest -m bench` (.ci/run does, after the default run), never the default run.
pytestmark = pytest.mark.bench

BENCH = Path(__file__).resolve().parents[2] / "bench" / "writer_frames.py"


def test_the_writers_cpu_per_frame_is_printed_for_the_frames_it_wrote():
    out = subprocess.run([sys.executable, str(BENCH), "--streams", "32", "--seconds", "1", "--usage"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = {line.split(":", 1)[0]: line.split(":", 1)[1] for line in out.stdout.splitlines()}
    assert int(lines["writer frames"].split()[0].replace(",", "")) >= 32 * 50, lines    # a STEP each 10 ms
    assert "usage in every frame: yes" in lines["writer frames"]
    per_frame = float(lines["writer CPU per frame"].split()[0])
    assert per_frame > 0 and float(lines["writer CPU per 1k tokens"].split()[0]) == per_frame
