"""lm-evaluation-harness against an inferd daemon, offline: one multiple-choice (loglikelihood) task and
one generate-until task, `--model local-completions` with no tokenizer argument.

    .venv/bin/python bench/lm_eval_check.py [--lm-eval-python /tmp/lmeval-venv/bin/python]
        [--model small] [--limit 4] [--timeout 300] [--workdir DIR] [--keep]

lm-eval lives in its own venv, so the project's stays untouched:
    python3 -m venv /tmp/lmeval-venv && /tmp/lmeval-venv/bin/pip install 'lm-eval[api]'
(`[api]` brings aiohttp, tenacity and requests, which `local-completions` needs.)

Steps:
  1. A copy of ./config.toml with `port = 0` (the daemon logs the port it got) and an absolute
     `engines_root` (this checkout's engines/, which holds the synthetic `small` reference model);
     `inferd serve --config` on it, waiting for the "listening" log line and GET /readyz == 200.
  2. A task directory in a temporary folder: `inferd_mc` (output_type multiple_choice, metric acc,
     4 rows) and `inferd_gen` (output_type generate_until, metric exact_match, 2 rows), each read
     from a local JSONL file through `dataset_path: json` + `dataset_kwargs.data_files`.
  3. `<lm-eval python> -m lm_eval --model local-completions --model_args
     model=small,base_url=http://127.0.0.1:PORT/v1/completions,num_concurrent=1,max_retries=1
     --tasks inferd_mc,inferd_gen --include_path DIR --limit 4 --output_path DIR/out`, with
     HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1 and TRANSFORMERS_OFFLINE=1. No `tokenizer` and no
     `tokenizer_backend`: local-completions defaults to `tokenizer_backend=auto`, which probes the
     daemon's GET /tokenizer_info (needs `eos_token`) and POST /tokenize and then uses lm-eval's
     RemoteTokenizer (POST /tokenize, /detokenize) with token-id prompts (tokenized_requests=True).
     The log line "Auto-detected remote tokenizer support" is checked, so a fall-back to a Hugging
     Face tokenizer (which would need a download) fails the check.
  4. Prints `lm-eval version: ...`, `multiple_choice acc: ...`, `generate_until exact_match: ...`,
     `tokenizer: remote (daemon)`; exits non-zero if lm-eval failed, a metric is missing, or the daemon
     answered any lm-eval request with an error status (the daemon log's failing request lines are
     printed). The scores themselves mean nothing: `small` is a random synthetic model.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from daemon_process import serve_config, stop  # noqa: E402 (bench/ is this script's own directory)

ROOT = Path(__file__).resolve().parent.parent
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

MC_ROWS = [
    {"question": "What color is the sky on a clear day?", "choices": ["blue", "green", "red"], "label": 0},
    {"question": "How many legs does a spider have?", "choices": ["six", "eight", "ten", "four"], "label": 1},
    {"question": "Which one is a fruit?", "choices": ["carrot", "potato", "apple"], "label": 2},
    {"question": "What is two plus two?", "choices": ["three", "four", "five"], "label": 1},
]
GEN_ROWS = [
    {"question": "What is the capital of France?", "answer": "Paris"},
    {"question": "What is three plus four?", "answer": "7"},
]

MC_YAML = """task: inferd_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

GEN_YAML = """task: inferd_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Q: {{{{question}}}}\\nA:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 16
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: true
metadata:
  version: 1.0
"""


def default_lm_eval_python() -> str:
    """The python behind an `lm_eval` script on PATH (its shebang), else /tmp/lmeval-venv/bin/python."""
    script = shutil.which("lm_eval")
    if script:
        try:
            first = Path(script).read_text(errors="replace").splitlines()[0]
        except (OSError, IndexError):
            first = ""
        if first.startswith("#!"):
            candidate = first[2:].strip().split()[0]
            if os.access(candidate, os.X_OK):
                return candidate
    return "/tmp/lmeval-venv/bin/python"


# -- 1. the daemon ----------------------------------------------------------------------------------
def write_config(workdir: Path) -> Path:
    text = (ROOT / "config.toml").read_text()
    text, n_port = re.subn(r"(?m)^port\s*=\s*\d+", "port = 0", text, count=1)
    engines = str(ROOT / "engines").replace("\\", "\\\\")
    text, n_root = re.subn(r'(?m)^engines_root\s*=\s*".*"', f'engines_root = "{engines}"', text, count=1)
    if n_port != 1 or n_root != 1:
        raise SystemExit("[lm_eval_check] config.toml has no `port =` or `engines_root =` line to rewrite")
    path = workdir / "inferd.toml"
    path.write_text(text)
    return path


def start_daemon(config_path: Path, workdir: Path) -> tuple[subprocess.Popen, int, Path]:
    return serve_config(config_path, workdir, 120.0, "lm_eval_check")


def daemon_errors(log_path: Path) -> list[str]:
    """Log lines of requests the daemon answered with a status >= 400, or that name an error."""
    bad = []
    for line in log_path.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        status = event.get("status")
        if (isinstance(status, int) and status >= 400) or event.get("level") in ("error", "ERROR"):
            bad.append(line)
    return bad


# -- 2. the tasks -----------------------------------------------------------------------------------
def write_tasks(task_dir: Path) -> None:
    task_dir.mkdir(parents=True, exist_ok=True)
    mc, gen = task_dir / "mc.jsonl", task_dir / "gen.jsonl"
    mc.write_text("".join(json.dumps(r) + "\n" for r in MC_ROWS))
    gen.write_text("".join(json.dumps(r) + "\n" for r in GEN_ROWS))
    (task_dir / "inferd_mc.yaml").write_text(MC_YAML.format(data=json.dumps(str(mc))))
    (task_dir / "inferd_gen.yaml").write_text(GEN_YAML.format(data=json.dumps(str(gen))))


# -- 3. lm-eval -------------------------------------------------------------------------------------
def lm_eval_version(python: str) -> str:
    out = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('lm_eval'))"],
                         check=False, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise SystemExit(f"[lm_eval_check] no lm_eval in {python}: {out.stderr.strip()[-500:]}\n"
                         "install it: python3 -m venv /tmp/lmeval-venv && "
                         "/tmp/lmeval-venv/bin/pip install 'lm-eval[api]'")
    return out.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lm-eval-python", default=default_lm_eval_python())
    parser.add_argument("--model", default="small")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole lm-eval run")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, lm-eval output)")
    args = parser.parse_args()

    version = lm_eval_version(args.lm_eval_python)
    print(f"lm-eval version: {version}", flush=True)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="inferd-lmeval-"))
    workdir.mkdir(parents=True, exist_ok=True)
    task_dir, out_dir = workdir / "tasks", workdir / "out"
    write_tasks(task_dir)
    proc, port, log_path = start_daemon(write_config(workdir), workdir)
    failed = True
    try:
        base_url = f"http://127.0.0.1:{port}/v1/completions"
        cmd = [args.lm_eval_python, "-m", "lm_eval", "--model", "local-completions",
               "--model_args", f"model={args.model},base_url={base_url},num_concurrent=1,max_retries=1",
               "--tasks", "inferd_mc,inferd_gen", "--include_path", str(task_dir),
               "--limit", str(args.limit), "--output_path", str(out_dir)]
        print("[lm_eval_check] " + " ".join(cmd), flush=True)
        env = {**os.environ, **OFFLINE_ENV}
        try:
            run = subprocess.run(cmd, env=env, check=False, capture_output=True, text=True, timeout=args.timeout, cwd=workdir)
            output, rc = run.stdout + run.stderr, run.returncode
        except subprocess.TimeoutExpired as err:
            output = (err.stdout or b"").decode(errors="replace") + (err.stderr or b"").decode(errors="replace")
            output, rc = output + f"\n[lm_eval_check] lm-eval timed out after {args.timeout} s", 124
        (workdir / "lm_eval.log").write_text(output)

        remote = "Auto-detected remote tokenizer support" in output
        results: dict = {}
        for path in sorted(glob.glob(str(out_dir / "**" / "results_*.json"), recursive=True)):
            results = json.loads(Path(path).read_text()).get("results", {})
        acc = results.get("inferd_mc", {}).get("acc,none")
        em = results.get("inferd_gen", {}).get("exact_match,none")
        print(f"multiple_choice acc: {acc}")
        print(f"generate_until exact_match: {em}")
        print(f"tokenizer: {'remote (daemon)' if remote else 'NOT remote: lm-eval did not detect the daemon tokenizer'}")
        errors = daemon_errors(log_path)
        problems = []
        if rc != 0:
            problems.append(f"lm-eval exited {rc}")
        if acc is None or em is None:
            problems.append("a metric is missing from lm-eval's results")
        if not remote:
            problems.append("remote tokenizer not used")
        if errors:
            problems.append(f"the daemon logged {len(errors)} failing request(s)")
        if problems:
            print("[lm_eval_check] FAILED: " + "; ".join(problems), flush=True)
            print("---- lm-eval output (tail) ----\n" + "\n".join(output.splitlines()[-60:]))
            if errors:
                print("---- daemon failing requests ----\n" + "\n".join(errors[:20]))
            args.keep = True
        else:
            failed = False
    finally:
        stop(proc, 40.0)
        if args.keep:
            print(f"[lm_eval_check] work folder kept: {workdir}")
        elif args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
