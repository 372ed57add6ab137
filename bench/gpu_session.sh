#!/usr/bin/env bash
# One GPU machine's session in one command (docs/gpu.md, "Run bench/gpu_check.py on a GPU machine"): the wheels
# of bench/gpu_wheels.sh (carried in .gpu-wheels/), the card, bench/node.py's sim node on the machine's many
# cores with and without SSE writer processes (docs/performance.md), then bench/gpu_check.py. Everything it
# prints and every log go into $OUT (or ./gpu-session-out) as one tarball; the summaries come last.
#
#   bash bench/gpu_session.sh [--deadline-s 430] [gpu_check options...]
#
# NODE_RUNS="0 4" sets the front_processes values of the sim node runs (empty: none); NODE_CLIENTS (4) the
# load generators, each on its own CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-session-out}
LOGS=/tmp/gpu-session-logs
mkdir -p "$OUT" "$LOGS"
if [ -d .gpu-wheels ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .gpu-wheels/*.whl || exit 1
    export PYTHONPATH=$PWD:/tmp/site
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv; nproc; uname -r;
  python3 -c 'import torch, triton, aiohttp; print(torch.__version__, torch.version.cuda, triton.__version__,
  aiohttp.__version__)'; } 2>&1 | tee "$LOGS/machine.txt"

for writers in ${NODE_RUNS-0 4}; do
    echo "== bench/node.py sim 8 x 256, front_processes $writers, ${NODE_CLIENTS:-4} load generators"
    timeout 90 python3 bench/node.py --front-processes "$writers" --clients "${NODE_CLIENTS:-4}" --seconds 8 \
        --warmup 6 2>"$LOGS/node-sim-$writers.err" | tee "$LOGS/node-sim-$writers.txt"
    pkill -9 -f 'bench/node.py' 2>/dev/null    # a run cut off by its timeout leaves its daemon and clients
done

python3 bench/gpu_check.py --logs "$LOGS" "$@" 2>&1 | tee "$LOGS/gpu_check.txt"
code=${PIPESTATUS[0]}
tar czf "$OUT/gpu-session-logs.tgz" -C /tmp gpu-session-logs
cat "$LOGS"/node-sim-*.txt 2>/dev/null
exit "$code"
