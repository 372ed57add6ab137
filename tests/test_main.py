"""inferd.__main__: the CLI's own flags (each subcommand is tested with the module that owns it)."""
from __future__ import annotations

import subprocess
import sys

from inferd import __version__


def test_version_flag_prints_the_version_and_exits_0():
    done = subprocess.run([sys.executable, "-m", "inferd", "--version"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"inferd {__version__}"
