"""Run one bench script against an earlier revision and this working tree, alternated, in one sitting.

    .venv/bin/python bench/ab.py --base 10ef856 [--rounds 2] -- frontend.py --seconds 8
    .venv/bin/python bench/ab.py --base 10ef856 --rounds 1 -- fairness.py

This machine's speed varies 2-3x from day to day, so only figures measured in one sitting compare:
the base revision is checked out into a temporary git worktree and each round runs the script there,
then here (same venv; PYTHONPATH picks which tree's `inferd` is imported, by the script and the daemon
processes it starts). Every line the script prints comes back prefixed with `base r<N>:` / `head r<N>:`;
`--grep` keeps only the lines matching a regular expression (e.g. the summary lines).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(tree: Path, script: list[str], label: str, keep: re.Pattern | None) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, str(tree / "bench" / script[0]), *script[1:]], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=900)
    for line in (proc.stdout + proc.stderr).splitlines():
        if keep is None or keep.search(line):
            print(f"{label}: {line}", flush=True)
    if proc.returncode:
        print(f"{label}: exited with {proc.returncode}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the revision to compare against (a commit, tag or branch)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--grep", default=r"^(daemon|bare  |ratio|TTFT|\s+(ours|fcfs)|\[)",
                   help="keep only matching lines ('' keeps all)")
    p.add_argument("script", nargs=argparse.REMAINDER, help="-- <script in bench/> [its arguments]")
    args = p.parse_args()
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not script:
        p.error("name the bench script after --")
    keep = re.compile(args.grep) if args.grep else None
    with tempfile.TemporaryDirectory(prefix="inferd-ab-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), args.base], cwd=ROOT, check=True)
        try:
            for n in range(1, args.rounds + 1):
                run(base, script, f"base r{n}", keep)
                run(ROOT, script, f"head r{n}", keep)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
