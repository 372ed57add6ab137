#!/usr/bin/env python3
"""Build engine artifacts into engines/<name>/<version>/ (see inferd.artifacts.manifest).

  python build_engines.py --target reference --synthetic tiny|small
  python build_engines.py --target reference --synthetic tiny-embed|embed     (embedding models)
  python build_engines.py --target reference --hf-dir /path/to/hf-llama --name llama3-8b
  python build_engines.py --target reference --synthetic small --quantize int8   (also an int8 weight-only version)
  python build_engines.py --target reference --hf-model HuggingFaceTB/SmolLM2-135M-Instruct [--revision main]
                                                   (downloaded with huggingface_hub: HF_TOKEN, HF_ENDPOINT)
  python build_engines.py --target trtllm ...      (options come from inferd.artifacts.build.trtllm)
  python build_engines.py --target trtllm --hf-dir D --name N --quantize fp8|int8_sq|int4_awq|int8 [--eagle-dir E]
  ... --sign inferd-signing.key                    also sign the artifact's manifest (docs/artifacts.md)

Prints progress on stderr and the artifact path on stdout; exit 0 on success, 1 on a build
error, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from inferd.artifacts import (
    ArtifactError,
    HubError,
    SigningKeyError,
    load_private_key,
    pull,
    resolve_artifact,
    sign_artifact,
)
from inferd.engine import TokenizerLoadError
from inferd.artifacts.build import SYNTHETIC_SPECS, build_synthetic, pack_hf
from inferd.engine.reference import quantize_artifact
from inferd.engine.reference.weights import WeightsError


def _trtllm_builder() -> ModuleType | None:
    try:
        return importlib.import_module("inferd.artifacts.build.trtllm")
    except ModuleNotFoundError as exc:
        if exc.name in ("inferd.artifacts.build.trtllm",):
            return None
        raise


def build_parser(trtllm: ModuleType | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="build_engines.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=["reference", "trtllm"], default="reference")
    parser.add_argument("--engines-root", type=Path, default=Path("engines"),
                        help="where artifacts go (default: ./engines)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--synthetic", choices=sorted(SYNTHETIC_SPECS),
                        help="deterministic random-weight Llama with a trained byte-level BPE tokenizer "
                             "(tiny-embed, embed: embedding models, with an [embedding] table in the manifest)")
    source.add_argument("--hf-dir", type=Path, help="an existing Hugging Face Llama checkpoint directory")
    source.add_argument("--hf-model", metavar="ORG/NAME", help="a Hugging Face hub model id, downloaded into the hub "
                                                             "cache first (resumable; the commit goes in the manifest)")
    parser.add_argument("--revision", help="with --hf-model: branch, tag or commit (default: main)")
    parser.add_argument("--name", help="artifact name (required with --hf-dir; default: the synthetic kind, or the "
                                       "repo's name with --hf-model)")
    parser.add_argument("--quantize", choices=["int8", "fp8", "int8_sq", "int4_awq"],
                        help="reference: int8 only: also publish an int8 weight-only version of the artifact (per-"
                             "channel scales; its manifest says precision = \"int8\"; LATEST stays on the float "
                             "one). trtllm: build the engine quantized through TensorRT-LLM's quantization API "
                             "(fp8 weights and KV, int8_sq SmoothQuant, int4_awq, int8 weight-only)")
    parser.add_argument("--sign", type=Path, metavar="PRIVATE_KEY_FILE",
                        help="sign the built artifact's manifest (ed25519; key from `inferd engines keygen`)")
    if trtllm is not None and hasattr(trtllm, "add_arguments"):
        trtllm.add_arguments(parser.add_argument_group("trtllm"))
    return parser


def main(argv: list[str] | None = None) -> int:
    trtllm = _trtllm_builder()
    parser = build_parser(trtllm)
    args = parser.parse_args(argv)
    key = None
    if args.sign is not None:               # before a build that may take minutes
        try:
            key = load_private_key(args.sign)
        except SigningKeyError as exc:
            print(f"build_engines.py: --sign {exc}", file=sys.stderr)
            return 2
    if args.target == "trtllm":
        if trtllm is None:
            print("build_engines.py: --target trtllm is not available in this checkout "
                  "(inferd/artifacts/build/trtllm.py is missing); build with --target reference", file=sys.stderr)
            return 2
        entry = getattr(trtllm, "main", None) or getattr(trtllm, "build", None)
        if entry is None:
            print("build_engines.py: inferd.artifacts.build.trtllm has neither main(args) nor build(args)",
                  file=sys.stderr)
            return 2
        result = entry(args)
        result = result if isinstance(result, int) else 0
        if result == 0 and key is not None:     # the builder points LATEST at what it published
            return _sign(lambda: resolve_artifact(args.engines_root, args.name), key)
        return result
    if args.synthetic is None and args.hf_dir is None and args.hf_model is None:
        parser.error("one of --synthetic, --hf-dir or --hf-model is required for --target reference")
    if args.quantize not in (None, "int8"):
        parser.error(f"--quantize {args.quantize} builds TensorRT engines (--target trtllm); the reference "
                     f"target quantizes to int8")
    if args.revision is not None and args.hf_model is None:
        parser.error("--revision goes with --hf-model")
    if args.hf_dir is not None and not args.name:
        parser.error("--name is required with --hf-dir")
    try:
        if args.synthetic is not None:
            if args.name and args.name != args.synthetic:
                parser.error("--name cannot rename a synthetic artifact (its name is its kind)")
            path = build_synthetic(args.synthetic, args.engines_root)
        elif args.hf_model is not None:
            path = pull(args.hf_model, args.engines_root, name=args.name, revision=args.revision)
        else:
            path = pack_hf(args.hf_dir, args.name, args.engines_root)
        if args.quantize is not None:
            path = quantize_artifact(path, args.engines_root, args.quantize, _stderr)
    except (ArtifactError, HubError, TokenizerLoadError, WeightsError, OSError) as exc:
        print(f"build_engines.py: {exc}", file=sys.stderr)
        return 1
    if key is not None:
        return _sign(lambda: path, key, print_path=True)
    print(path)
    return 0


def _stderr(message: str) -> None:
    print(f"[build] {message}", file=sys.stderr, flush=True)


def _sign(artifact: Callable[[], Path], key, *, print_path: bool = False) -> int:
    """Sign the artifact just built (its files were hashed a moment ago: not again)."""
    try:
        path = artifact()
        signer = sign_artifact(path, key, check_files=False)
    except (ArtifactError, OSError) as exc:
        print(f"build_engines.py: signing failed: {exc}", file=sys.stderr)
        return 1
    print(f"signed {path} by {signer}", file=sys.stderr)
    if print_path:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
