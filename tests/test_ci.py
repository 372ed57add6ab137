"""The CI entry point runs exactly the test command the README gives a new developer."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command_verbatim():
    readme = [line.strip() for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()]
    documented = [line for line in readme if ".venv/bin/pip install -e '.[test]'" in line]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    commands = [line for line in ci if line and not line.startswith("#")]

    assert len(documented) == 1, f"README should give one '.[test]' command, found {documented}"
    assert documented[0] in commands
    # ... and only then the benchmark guards the default run leaves out
    after = commands[commands.index(documented[0]) + 1:]
    assert any("pytest -q -m bench" in line for line in after), after
