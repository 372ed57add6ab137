"""CLI: `inferd serve [--model X] | pull | check-config | engines ... | keys ... | usage | batches ... | audit verify | monitoring ... | capacity`.

Each subcommand's work lives in the module that owns that concern; this file only parses
arguments and imports lazily, so `inferd engines verify` does not pay for aiohttp or numpy.
"""
from __future__ import annotations

import argparse
import sys

from inferd import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferd", description="LLM serving daemon")
    parser.add_argument("--version", action="version", version=f"inferd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the daemon")
    serve.add_argument("--config", default=None, help="TOML config file (default: ./config.toml; not with --model)")
    serve.add_argument("--host", default=None, help="override server.host")
    serve.add_argument("--port", type=int, default=None, help="override server.port")
    serve.add_argument("--log-format", choices=["auto", "text", "json"], default=None,
                       help="override server.log_format: text for a terminal, json lines, or auto (text on a terminal)")
    # `vllm serve`'s flags, for serving one model with no config file (inferd.daemon.serve_model)
    serve.add_argument("--model", default=None, help="serve this with no config file: a hub id (pulled), a local "
                                                     "HF checkpoint directory, or an artifact name or directory")
    serve.add_argument("--served-model-name", default=None, help="with --model: the name requests use "
                                                                 "(default: the repo's or directory's name)")
    serve.add_argument("--api-key", default=None, help="with --model: requests must send `Authorization: Bearer "
                                                       "<this>` (default: $INFERD_API_KEY, else no auth)")
    serve.add_argument("--max-model-len", type=int, default=None, help="with --model: the longest prompt + "
                                                                       "output (default: the model's context)")
    _add_engine_flags(serve)

    from inferd.artifacts import add_pull_parser     # argparse only: huggingface_hub loads on a pull
    add_pull_parser(sub)

    check = sub.add_parser("check-config", help="validate a config file; exit 1 naming every bad key")
    check.add_argument("path")

    engines = sub.add_parser("engines", help="engine artifacts")
    engines_sub = engines.add_subparsers(dest="engines_command", required=True)
    verify = engines_sub.add_parser("verify", help="check every file of artifacts against their manifests, "
                                                   "and their signatures; print who signed each")
    verify.add_argument("path", nargs="?", default="engines",
                        help="an artifact directory, or a tree of them (default: ./engines)")
    verify.add_argument("--trusted-key", action="append", default=[], metavar="PUB",
                        help="repeatable: a .pub file; then an unsigned artifact or another signer fails")
    keygen = engines_sub.add_parser("keygen", help="write an ed25519 signing key pair (NAME.key, NAME.pub)")
    keygen.add_argument("--out-dir", default=None, help="where to write them (default: signing/ in the state directory "
                                                        "of --config, or of INFERD_STATE_DIR / ~/.local/state/inferd "
                                                        "when that file does not exist)")
    keygen.add_argument("--config", default="config.toml", help="whose state directory (default: ./config.toml)")
    keygen.add_argument("--name", default="inferd-signing", help="file name stem (default: inferd-signing)")
    sign = engines_sub.add_parser("sign", help="sign artifacts (after checking their files) with a private key")
    sign.add_argument("path", help="an artifact directory, or a tree of them")
    sign.add_argument("--key", required=True, help="the private key file (from inferd engines keygen)")

    keys = sub.add_parser("keys", help="API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="create a key for a tenant; prints it once")
    create.add_argument("--tenant", required=True)
    create.add_argument("--scope", action="append", choices=["inference", "admin", "metrics"],
                        help="repeatable; default: inference")
    create.add_argument("--config", default="config.toml")
    list_ = keys_sub.add_parser("list", help="list keys (ids, tenants, scopes; never the keys)")
    list_.add_argument("--config", default="config.toml")
    revoke = keys_sub.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id")
    revoke.add_argument("--config", default="config.toml")

    from inferd.store import add_batches_parser, add_usage_parser      # argparse only: no store is opened here
    add_usage_parser(sub)
    add_batches_parser(sub)

    audit = sub.add_parser("audit", help="the audit log")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True)
    audit_verify = audit_sub.add_parser("verify", help="check the audit log's hash chain; exit 1 naming the first "
                                                       "broken record")
    audit_verify.add_argument("path", nargs="?", default=None, help="the audit file (default: the config's)")
    audit_verify.add_argument("--config", default="config.toml", help="read [audit] path from this config")

    from inferd.slo import add_monitoring_parser          # argparse only
    add_monitoring_parser(sub)
    from inferd.capacity import add_capacity_parser       # argparse only
    add_capacity_parser(sub)
    return parser


def _audit_path(args) -> str:
    """The file `inferd audit verify` checks: the one given, else where the daemon writes it for `--config`."""

    from inferd.config import load_config
    from inferd.models import audit_path
    if args.path is not None:
        return args.path
    return str(audit_path(load_config(args.config)))


def _signing_dir(args) -> str:
    """Where `inferd engines keygen` writes: --out-dir, else signing/ in the state directory (never the
    checkout, where a private key would sit beside files that get committed)."""
    from pathlib import Path

    from inferd.config import default_state_dir, load_config
    if args.out_dir is not None:
        return args.out_dir
    if Path(args.config).is_file():
        return str(Path(load_config(args.config).server.state_dir) / "signing")
    return str(default_state_dir() / "signing")


def _add_engine_flags(serve: argparse.ArgumentParser) -> None:
    """`serve --model`'s engine flags: the GPU engine (backend "torch", docs/gpu.md), in vLLM's names."""
    serve.add_argument("--backend", choices=["reference", "torch"], default=None,
                       help="with --model: the engine (default: reference, NumPy on the CPU; torch: PyTorch)")
    serve.add_argument("--device", default=None, help="with --backend torch: cuda, cuda:N or cpu (default: cuda)")
    serve.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"], default=None,
                       help="with --backend torch: weights and KV pool (default/auto: bfloat16)")
    serve.add_argument("--gpu-memory-utilization", type=float, default=None,
                       help="with --backend torch: the GPU memory share it may hold, KV pool included (default 0.9)")
    serve.add_argument("--enforce-eager", action="store_true", default=None,
                       help="with --backend torch: no CUDA graphs")
    serve.add_argument("--load-format", choices=["auto", "dummy"], default=None,
                       help="with --backend torch: dummy = random weights (benchmarks)")


# `serve` flags that only `--model` takes (a config file sets these keys itself)
MODEL_FLAGS = ("served_model_name", "api_key", "max_model_len", "backend", "device", "dtype",
               "gpu_memory_utilization", "enforce_eager", "load_format")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        if args.model is None and any(getattr(args, flag) is not None for flag in MODEL_FLAGS):
            print(f"inferd serve: --{', --'.join(f.replace('_', '-') for f in MODEL_FLAGS)} go with --model "
                  "(with --config, set them in the file)", file=sys.stderr)
            return 2
        if args.model is not None and args.config is not None:
            print("inferd serve: give --model or --config, not both", file=sys.stderr)
            return 2
        from inferd.daemon import serve_main
        return serve_main(args)
    if args.command == "pull":
        from inferd.artifacts import pull_main
        from inferd.config import default_state_dir
        from inferd.observability import configure_logging
        configure_logging("info", fmt=args.log_format)
        return pull_main(args, default_state_dir() / "engines")
    if args.command == "check-config":
        from inferd.config import check_config_main
        from inferd.daemon import preflight_errors
        return check_config_main(args.path, preflight_errors)
    if args.command == "engines":
        from inferd.artifacts import keygen_main, sign_main, verify_main
        if args.engines_command == "keygen":
            from inferd.config import ConfigError
            try:
                out_dir = _signing_dir(args)
            except (ConfigError, OSError) as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            return keygen_main(out_dir, args.name)
        if args.engines_command == "sign":
            return sign_main(args.path, args.key)
        return verify_main(args.path, args.trusted_key)
    if args.command == "keys":
        from inferd.tenancy import keys_main
        return keys_main(args)
    if args.command == "batches":
        from inferd.store import batches_main
        return batches_main(args)
    if args.command == "usage":
        from inferd.store import usage_main
        return usage_main(args)
    if args.command == "audit":
        from inferd.config import ConfigError
        from inferd.observability import audit_verify_main
        try:
            path = _audit_path(args)
        except (ConfigError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return audit_verify_main(path, missing_ok=args.path is None)
    if args.command == "capacity":
        from inferd.capacity import capacity_main
        return capacity_main(args)
    if args.command == "monitoring":
        from inferd.slo import monitoring_main
        return monitoring_main(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
