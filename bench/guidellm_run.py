"""guidellm against an inferd daemon serving a `sim` model on loopback, offline, in one command.

    .venv/bin/python bench/guidellm_run.py [--endpoint chat|completions] [--streams 1,8,32]
        [--prompt-tokens 256] [--output-tokens 128] [--max-seconds 30] [--max-requests 2000]
        [--sim-profile llama3-8b-h100] [--time-scale 1.0] [--tokenizer sim|small]
        [--guidellm /tmp/guidellm-venv/bin/guidellm] [--workdir /tmp/inferd-guidellm]
        [--target http://127.0.0.1:PORT] [--tokenizer-dir DIR] [--tokenizer-only]
        [-- extra guidellm run arguments]

Run it with the project's venv (it imports inferd for the sim vocabulary); guidellm itself lives in
its own venv (see bench/guidellm.md: `python3 -m venv /tmp/guidellm-venv &&
/tmp/guidellm-venv/bin/pip install guidellm`). Steps, each bounded; the script stops itself:
  1. Tokenizer directory for guidellm's synthetic prompts (built once into --workdir, offline):
     `sim` (default): a Hugging Face tokenizer.json with the sim engine's own vocabulary, so a prompt
     guidellm cuts to N tokens is N tokens in the server's usage too (exact for ASCII text, which is
     all guidellm's synthetic prompts contain); `small`: the byte-level BPE tokenizer of the synthetic
     `small` reference artifact (build_engines.py), whose N tokens the sim counts as ~1.4 N.
  2. A config (port 0, the sim profile at --time-scale, tenant `local` allowed every stream) and
     `inferd serve` in a subprocess; waits for the "listening" log line and GET /readyz == 200.
     (--target URL: use a server that is already running instead; --tokenizer-only: stop after 1.)
  3. `guidellm run` with HF_HUB_OFFLINE=1 / TRANSFORMERS_OFFLINE=1 / HF_DATASETS_OFFLINE=1, one
     concurrent benchmark per --streams value, each stopped by --max-seconds or --max-requests,
     the whole run by a timeout; its console report is printed as it runs, its JSON report saved.
  4. A summary per benchmark from the JSON report: requests, prompt/output tokens per request (from
     the server's `usage`), TTFT, ITL, TPOT, output tokens/s; then SIGTERM to the daemon.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from daemon_process import serve_config, stop  # noqa: E402 (bench/ is this script's own directory)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_GUIDELLM = os.environ.get("GUIDELLM", "/tmp/guidellm-venv/bin/guidellm")
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}

CONFIG = """
[server]
host = "127.0.0.1"
port = 0
log_level = "info"
engines_root = "{engines_root}"

[models.{model}]
backend = "sim"
max_batch_size = {max_batch_size}
max_num_tokens = 8192

[models.{model}.sim]
profile = "{profile}"
time_scale = {time_scale}
max_model_len = {max_model_len}

# auth is off on loopback: every request is tenant `local` (default limit: 64 concurrent)
[tenants.local]
max_concurrent_requests = {max_concurrent}
"""

# -- 1. tokenizer directories -----------------------------------------------------------------------
SIM_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>")
SIM_CHUNK_RE = r" ?[A-Za-z]+| ?[^A-Za-z\s]|\s"     # inferd.engine.sim.profiles._CHUNK_RE
SIM_CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' "
                     "+ message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
                     "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def build_sim_tokenizer(profile: str, max_model_len: int, out: Path) -> None:
    """A Hugging Face fast tokenizer that encodes as inferd's SimTokenizer does.

    SimTokenizer: split text into ` ?[A-Za-z]+ | ?[^A-Za-z\\s]|\\s` chunks, each chunk the whole-chunk
    piece if the vocabulary has it, else longest known piece first. That is a `Split` pre-tokenizer
    plus a `WordPiece` model with an empty continuation prefix; `<|begin_of_text|>` is prepended as
    the server does. Ids equal the sim's ids. Not modelled: the sim's UTF-8 byte fallback for
    characters outside the vocabulary (non-ASCII); WordPiece maps such a chunk to one token.
    """
    from inferd.engine.sim.profiles import get_profile, sim_tokenizer

    vocab_size = get_profile(profile).vocab_size
    st = sim_tokenizer(vocab_size)
    vocab: dict[str, int] = {}
    for special in SIM_SPECIALS:
        (token_id,) = st.encode(special, add_special_tokens=False)
        vocab[special] = token_id
    byte0 = st.encode("\x00", add_special_tokens=False)[0]   # NUL is not a piece: its byte token
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = byte0 + b
    for token_id in range(byte0 + 256, vocab_size):
        piece = st.piece(token_id)
        if not piece or piece in vocab:
            raise RuntimeError(f"unexpected sim vocabulary at id {token_id}: {piece!r}")
        vocab[piece] = token_id
    bos = SIM_SPECIALS[0]
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": vocab[s], "content": s, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True} for s in SIM_SPECIALS],
        "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": SIM_CHUNK_RE}, "behavior": "Isolated",
                          "invert": False},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 0}}],
            "special_tokens": {bos: {"id": bos, "ids": [vocab[bos]], "tokens": [bos]}},
        },
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "WordPiece", "unk_token": "<0x3F>", "continuing_subword_prefix": "",
                  "max_input_chars_per_word": 1_000_000, "vocab": vocab},
    }
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": SIM_SPECIALS[1],
              "model_max_length": max_model_len, "clean_up_tokenization_spaces": False,
              "chat_template": SIM_CHAT_TEMPLATE}
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + "."))
    (tmp / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    tmp.rename(out)


def build_small_tokenizer(workdir: Path, out: Path) -> None:
    """The byte-level BPE tokenizer of the synthetic `small` reference artifact (~2 s to build)."""
    engines = workdir / "engines"
    subprocess.run([sys.executable, str(ROOT / "build_engines.py"), "--target", "reference",
                    "--synthetic", "small", "--engines-root", str(engines)], check=True, timeout=300)
    version = (engines / "small" / "LATEST").read_text().strip()
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + "."))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(engines / "small" / version / name, tmp / name)
    tmp.rename(out)


def tokenizer_dir(args: argparse.Namespace) -> Path:
    name = f"tokenizer-sim-{args.sim_profile}" if args.tokenizer == "sim" else "tokenizer-small"
    out = args.workdir / name
    if not (out / "tokenizer.json").exists():
        print(f"[guidellm_run] building tokenizer {out}", flush=True)
        if args.tokenizer == "sim":
            build_sim_tokenizer(args.sim_profile, args.max_model_len, out)
        else:
            build_small_tokenizer(args.workdir, out)
    return out


# -- 2. the daemon ----------------------------------------------------------------------------------
def start_daemon(args: argparse.Namespace, max_concurrent: int) -> tuple[subprocess.Popen, int, Path]:
    config_path = args.workdir / "inferd.toml"
    config_path.write_text(CONFIG.format(
        engines_root=args.workdir / "engines", model=args.model, profile=args.sim_profile,
        time_scale=args.time_scale, max_model_len=args.max_model_len,
        max_batch_size=args.max_batch_size, max_concurrent=max_concurrent))
    return serve_config(config_path, args.workdir, 60.0, "guidellm_run")


# -- 3. guidellm ------------------------------------------------------------------------------------
def guidellm_command(args: argparse.Namespace, target: str, tokenizer: Path, report: Path) -> list[str]:
    request_format = "/v1/chat/completions" if args.endpoint == "chat" else "/v1/completions"
    cmd = [args.guidellm, "run",
           "--backend", f"kind=openai_http,target={target},model={args.model},"
                        f"request_format={request_format}",
           "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
           "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},"
                     f"output_tokens={args.output_tokens}",
           "--profile", "kind=concurrent",
           "--override", "profile.streams", ",".join(str(s) for s in args.streams),
           "--constraint", f"kind=max_duration,seconds={args.max_seconds}",
           "--constraint", f"kind=max_requests,count={args.max_requests}",
           "--output", f"kind=json,path={report}",
           "--disable-progress"]
    return cmd + args.extra


def pct(stat: dict, name: str) -> float:
    return stat["percentiles"][name] if name != "mean" else stat["mean"]


def summarize(report: Path) -> None:
    data = json.loads(report.read_text())
    rows = []
    for bench in data["benchmarks"]:
        strategy = bench["config"]["strategy"]
        label = strategy["type_"] + (f"@{strategy['streams']}" if "streams" in strategy else "")
        m = bench["metrics"]
        ok = {k: m[k]["successful"] for k in (
            "prompt_token_count", "output_token_count", "time_to_first_token_ms", "inter_token_latency_ms",
            "time_per_output_token_ms", "request_latency", "output_tokens_per_second", "requests_per_second")}
        totals = m["request_totals"]
        rows.append([
            label, f"{totals['successful']}/{totals['errored']}/{totals['incomplete']}",
            f"{ok['prompt_token_count']['mean']:.0f}", f"{ok['output_token_count']['mean']:.0f}",
            f"{pct(ok['time_to_first_token_ms'], 'p50'):.1f}", f"{pct(ok['time_to_first_token_ms'], 'p99'):.1f}",
            f"{pct(ok['inter_token_latency_ms'], 'p50'):.2f}", f"{pct(ok['inter_token_latency_ms'], 'p99'):.2f}",
            f"{pct(ok['time_per_output_token_ms'], 'p50'):.2f}",
            f"{pct(ok['request_latency'], 'p50'):.2f}",
            f"{ok['requests_per_second']['mean']:.2f}", f"{ok['output_tokens_per_second']['mean']:.0f}",
        ])
    head = ["benchmark", "ok/err/inc", "prompt tok", "output tok", "TTFT p50 ms", "TTFT p99 ms",
            "ITL p50 ms", "ITL p99 ms", "TPOT p50 ms", "latency p50 s", "req/s", "output tok/s"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print("\n[guidellm_run] summary (tokens per request from the server's usage; TTFT/ITL/TPOT over "
          "successful requests, ITL/TPOT token-weighted; output tok/s over the benchmark's duration)")
    for row in [head] + rows:
        print("  " + "  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
    print(f"[guidellm_run] full report: {report}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--guidellm", default=DEFAULT_GUIDELLM, help="guidellm executable (its own venv)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/inferd-guidellm"))
    ap.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    ap.add_argument("--tokenizer", choices=("sim", "small"), default="sim")
    ap.add_argument("--tokenizer-dir", type=Path,
                    help="use this Hugging Face tokenizer directory instead of building one")
    ap.add_argument("--tokenizer-only", action="store_true",
                    help="build the tokenizer directory (if missing), print its path and exit")
    ap.add_argument("--target", help="benchmark this already running server (loopback URL, e.g. "
                                     "http://127.0.0.1:8000) instead of starting a daemon")
    ap.add_argument("--sim-profile", default="llama3-8b-h100")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--max-batch-size", type=int, default=256)
    ap.add_argument("--model", default="sim")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--streams", default="1,8,32",
                    type=lambda s: [int(x) for x in s.split(",") if x.strip()],
                    help="concurrent streams, one benchmark per value")
    ap.add_argument("--max-seconds", type=float, default=30.0, help="per benchmark")
    ap.add_argument("--max-requests", type=int, default=2000, help="per benchmark")
    ap.add_argument("extra", nargs="*", help="after --: more `guidellm run` arguments")
    args = ap.parse_args()
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    if not Path(args.guidellm).exists() and not shutil.which(args.guidellm):
        raise SystemExit(f"[guidellm_run] no guidellm at {args.guidellm}; install it in its own venv "
                         "(bench/guidellm.md) or pass --guidellm")
    if not args.streams or min(args.streams) < 1:
        raise SystemExit("[guidellm_run] --streams: positive integers, e.g. 1,8,32")

    tokenizer = args.tokenizer_dir.resolve() if args.tokenizer_dir else tokenizer_dir(args)
    if args.tokenizer_only:
        print(tokenizer)
        return 0
    if args.target:
        proc, target = None, args.target.rstrip("/")
    else:
        proc, port, log_path = start_daemon(args, max_concurrent=max(max(args.streams), 64))
        target = f"http://127.0.0.1:{port}"
        print(f"[guidellm_run] inferd (pid {proc.pid}) ready on {target}; log {log_path}", flush=True)
    report = args.workdir / f"benchmarks-{time.strftime('%Y%m%d-%H%M%S')}.json"
    cmd = guidellm_command(args, target, tokenizer, report)
    timeout = len(args.streams) * (args.max_seconds + 60) + 120
    print("[guidellm_run] " + " ".join(f"{k}={v}" for k, v in OFFLINE_ENV.items()) + " "
          + shlex.join(cmd), flush=True)
    # its own process group, so a timeout or ^C ends guidellm's worker processes too
    client = subprocess.Popen(cmd, env={**os.environ, **OFFLINE_ENV}, cwd=args.workdir,
                              start_new_session=True)
    try:
        returncode = client.wait(timeout=timeout)
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
        why = f"did not finish within {timeout:.0f} s" if isinstance(exc, subprocess.TimeoutExpired) else "interrupted"
        print(f"[guidellm_run] guidellm {why}; stopping it", flush=True)
        os.killpg(client.pid, signal.SIGTERM)
        try:
            client.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(client.pid, signal.SIGKILL)
            client.wait()
        return 1
    finally:
        if proc is not None:
            stop(proc, 40.0)
            print(f"[guidellm_run] inferd stopped (exit {proc.returncode})", flush=True)
    if returncode != 0 or not report.exists():
        print(f"[guidellm_run] guidellm exited {returncode}", flush=True)
        return returncode or 1
    summarize(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
