"""`inferd pull <hub id or local dir>`: download (or take) a Hugging Face checkpoint and pack it as an artifact.

Prints the artifact's directory on stdout; on stderr huggingface_hub's bars (a terminal) or `pull_progress`
log lines, then the packing steps. Exit 0, or 1 with one line naming what failed (no traceback).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_pull_parser(sub: argparse._SubParsersAction) -> None:
    pull = sub.add_parser("pull", help="download a Hugging Face model (or pack a local checkout) as an artifact")
    pull.add_argument("source", help="a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct, or a local HF "
                                     "checkpoint directory")
    pull.add_argument("--revision", default=None, help="branch, tag or commit (default: main); the manifest "
                                                       "records the commit it resolved to")
    pull.add_argument("--name", default=None, help="artifact name (default: the repo's or directory's name)")
    pull.add_argument("--engines-root", type=Path, default=None,
                      help="where artifacts go (default: <state dir>/engines, where `serve --model` looks)")
    pull.add_argument("--log-format", choices=["auto", "text", "json"], default="auto",
                      help="its log lines: text for a terminal, json lines, or auto (text on a terminal)")


def pull_main(args: argparse.Namespace, default_engines_root: Path) -> int:
    """The caller has configured logging (the pull logs `pulled`, and `pull_progress` off a terminal)."""
    from inferd.artifacts.hub import HubError, pull
    from inferd.artifacts.manifest import ArtifactError
    engines_root = args.engines_root or default_engines_root
    try:
        engines_root.mkdir(parents=True, exist_ok=True)
        path = pull(args.source, engines_root, name=args.name, revision=args.revision)
    except (HubError, ArtifactError, OSError) as exc:
        print(f"inferd pull: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0
