"""`build_engines.py --target trtllm`: build a TensorRT engine from a Hugging Face checkpoint.

Runs on a GPU node with TensorRT-LLM installed (docs/gpu.md). The build goes through the LLM API:
`tensorrt_llm._tensorrt_engine.LLM(model=hf_dir, build_config=BuildConfig(...))` compiles the engine,
`llm.save(dir)` writes it (config.json + rank<r>.engine). We add the tokenizer files and publish the
directory as a content-addressed artifact with the same manifest as reference artifacts, so
`inferd engines verify` and `resolve_artifact` treat both targets alike.

The LLM API starts an MPI worker process: the program calling `build()` must be guarded by
`if __name__ == "__main__":` (build_engines.py is).
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from inferd.artifacts.build.reference import (INT8_QUANT_METHOD, architecture_from_config, read_json_object,
                                              sampling_from_generation_config)
from inferd.artifacts.manifest import ArtifactError, publish_artifact, staging_dir

INSTALL_HINT = ("TensorRT-LLM is not installed. Engines for --target trtllm are built on a GPU node: "
                "pip install 'inferd[trtllm]' --extra-index-url https://pypi.nvidia.com (see docs/gpu.md)")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "chat_template.jinja")
DTYPES = ("auto", "float16", "bfloat16", "float32")


class TrtllmBuildError(Exception):
    """Bad build arguments; the message says which."""


class TrtllmNotInstalled(TrtllmBuildError):
    """`tensorrt_llm` cannot be imported on this machine."""


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Options of --target trtllm (--hf-dir, --name and --engines-root come from build_engines.py)."""
    parser.add_argument("--max-batch-size", type=int, default=64, help="engine build limit (default 64)")
    parser.add_argument("--max-seq-len", type=int, default=None,
                        help="prompt + output tokens (default: the model's max_position_embeddings)")
    parser.add_argument("--max-num-tokens", type=int, default=8192, help="tokens per iteration (default 8192)")
    parser.add_argument("--max-input-len", type=int, default=None, help="longest prompt (default: max-seq-len)")
    parser.add_argument("--dtype", choices=DTYPES, default="auto", help="weights/activations (default: auto)")
    parser.add_argument("--tp-size", type=int, default=1, help="tensor-parallel GPUs (default 1)")
    parser.add_argument("--calib-dataset", default=None,
                        help="with --quantize fp8/int8_sq/int4_awq: TensorRT-LLM's calibration dataset (an HF "
                             "dataset name or a local path; default: its own, cnn_dailymail)")
    parser.add_argument("--eagle-dir", type=Path, default=None,
                        help="build with EAGLE speculative decoding: the EAGLE draft head's checkpoint directory")
    parser.add_argument("--max-draft-len", type=int, default=4, help="with --eagle-dir: drafts per step (default 4)")


def _import_trtllm():
    try:
        from tensorrt_llm._tensorrt_engine import LLM
        from tensorrt_llm.llmapi import BuildConfig
    except ImportError as exc:
        raise TrtllmNotInstalled(f"{INSTALL_HINT} [import failed: {exc}]") from exc
    return LLM, BuildConfig


def build_options(args: argparse.Namespace) -> tuple[dict, dict]:
    """The LLM API's quantization and speculation arguments for this build (inferd.artifacts.build.trtllm_options),
    and what the manifest's [build] table records of them."""
    from inferd.artifacts.build.trtllm_options import TrtllmOptionError, quantization_kwargs, speculation_kwargs

    try:
        kwargs, recorded = quantization_kwargs(getattr(args, "quantize", None), getattr(args, "calib_dataset", None))
        spec_kwargs, spec_recorded = speculation_kwargs(getattr(args, "eagle_dir", None),
                                                        getattr(args, "max_draft_len", 4))
    except TrtllmOptionError as exc:
        raise TrtllmBuildError(str(exc)) from None
    return {**kwargs, **spec_kwargs}, {**recorded, **spec_recorded}


def build(args: argparse.Namespace) -> Path:
    """Build and publish engines/<name>/<version>; returns the artifact path."""
    LLM, BuildConfig = _import_trtllm()       # fail before reading anything
    if args.hf_dir is None or not args.name:
        raise TrtllmBuildError("--target trtllm needs --hf-dir DIR and --name NAME")
    options, recorded = build_options(args)
    for flag in ("max_batch_size", "max_num_tokens", "tp_size"):
        if getattr(args, flag) < 1:
            raise TrtllmBuildError(f"--{flag.replace('_', '-')} must be >= 1")
    hf_dir = Path(args.hf_dir)
    config = read_json_object(hf_dir / "config.json")
    _refuse_inferd_int8(hf_dir, config)
    if not (hf_dir / "tokenizer.json").is_file():
        raise ArtifactError(f"{hf_dir}: no tokenizer.json (the daemon needs a fast tokenizer)", "tokenizer.json")
    architecture = architecture_from_config(config)
    max_seq_len = args.max_seq_len or architecture.max_position_embeddings
    max_input_len = min(args.max_input_len or max_seq_len, max_seq_len)
    build_config = BuildConfig(max_batch_size=args.max_batch_size, max_seq_len=max_seq_len,
                               max_num_tokens=args.max_num_tokens, max_input_len=max_input_len)
    generation_file = hf_dir / "generation_config.json"
    generation = read_json_object(generation_file) if generation_file.is_file() else {}
    engines_root = Path(getattr(args, "engines_root", None) or "engines")
    with staging_dir(engines_root, args.name) as staging:
        print(f"{args.name}: building a TensorRT engine from {hf_dir} (this takes minutes)", file=sys.stderr)
        llm = LLM(model=str(hf_dir), tokenizer=str(hf_dir), dtype=args.dtype, tensor_parallel_size=args.tp_size,
                  build_config=build_config, **options)
        try:
            llm.save(str(staging))
        finally:
            llm.shutdown()
        for name in TOKENIZER_FILES:          # the engine dir must be self-contained for the daemon
            if (hf_dir / name).is_file():
                shutil.copy2(hf_dir / name, staging / name)
        return publish_artifact(
            staging, engines_root, name=args.name, target="trtllm", source=f"hf:{hf_dir.name}",
            architecture=architecture, sampling=sampling_from_generation_config(generation),
            build={"max_batch_size": args.max_batch_size, "max_seq_len": max_seq_len,
                   "max_input_len": max_input_len, "max_num_tokens": args.max_num_tokens, "dtype": args.dtype,
                   "tp_size": args.tp_size, "tensorrt_llm": _trtllm_version(),
                   "precision": recorded.pop("precision", args.dtype), **recorded},
            progress=lambda message: print(message, file=sys.stderr))


def _refuse_inferd_int8(hf_dir: Path, config: dict) -> None:
    """An int8 version made for the reference and torch engines is no TensorRT-LLM input: its config.json's
    quantization_config would be read as a pre-quantized checkpoint of a kind TensorRT-LLM does not know
    (docs/trtllm-api.md §7a), and only after minutes of starting up. Say so before anything starts."""
    quantization = config.get("quantization_config")
    if isinstance(quantization, dict) and quantization.get("quant_method") == INT8_QUANT_METHOD:
        raise TrtllmBuildError(f"--hf-dir {hf_dir}: an inferd int8 version (for the reference and torch engines); "
                               f"build from the float version it was made from, with --quantize int8 for "
                               f"TensorRT-LLM's own int8 weight-only")


def _trtllm_version() -> str:
    import tensorrt_llm
    return str(getattr(tensorrt_llm, "__version__", "unknown"))


def main(args: argparse.Namespace) -> int:
    """build_engines.py entry: artifact path on stdout; 1 on a build error, 2 on bad arguments."""
    try:
        path = build(args)
    except TrtllmNotInstalled as exc:
        print(f"build_engines.py: {exc}", file=sys.stderr)
        return 1
    except TrtllmBuildError as exc:
        print(f"build_engines.py: {exc}", file=sys.stderr)
        return 2
    except (ArtifactError, OSError, ValueError, RuntimeError) as exc:
        print(f"build_engines.py: trtllm build failed: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0
