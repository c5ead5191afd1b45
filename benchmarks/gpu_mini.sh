#!/usr/bin/env bash
# The mini suite on a lent GPU machine, in stages that each fit one 10-minute command.
#
#   bash benchmarks/gpu_mini.sh env kernels auto start   # first call: versions, kernel preflight, auto check,
#                                                        # then the suite in the background
#   bash benchmarks/gpu_mini.sh wait                     # later calls (machine still warm): follow the suite
#   bash benchmarks/gpu_mini.sh wait pack                # last call: gate, the results tarball into $OUT
#
# Call again as soon as a call returns: a lent machine that sits idle is given back, and .mini/ with it.
# `measure` (how many runs share the GPU best, ~4 min) is worth it only with device time to spare: put it
# before `start` in the first call, and set PER_GPU from its best row.
#
# The corpus travels with the working tree from a git-ignored folder inside the repository. Once, in the
# repository root, before the first call:
#   echo /.corpus/ >> .git/info/exclude
#   mkdir -p .corpus/docs && cp PATH_TO_YOUR_TOKEN_FILES/*.bin .corpus/docs/   # flat uint16 GPT-2 tokens
# and name `.corpus` in the carry list of the call that runs `start` (later calls need not carry it: `start`
# prepares it into the suite folder). Everything the suite writes stays under .mini/ (add
# `/.mini/` to .git/info/exclude too): the machine keeps it between calls while it is warm, and `start`
# leaves the suite running in its own process session, so `wait` calls only follow it. A machine given back
# loses .mini/: `pack` before the lease ends (checkpoints are too large to come back; evaluations,
# geometry, manifest, status and logs do, in one tarball of at most 16 MiB).
#
# Stages:
#   env      GPU, driver, torch, triton versions and the commit (into $OUT/env.txt)
#   kernels  preflight: the core fused-kernel tests on this GPU (every operator, historical arithmetic, wide
#            rows, precision modes, the inference forward of evaluation) against the float64 reference; the
#            suite is not started if one fails (cut at KERNELS_LIMIT s, default 360, with no failure: it is)
#   measure  training throughput of the mini model with 1, 2, 3 and 4 processes on the GPU (best --per-gpu)
#   auto     minmax-weight-k4 in historical arithmetic, suite D's protocol, a few steps under backend="auto"
#   start    prepare .corpus/docs into $SUITE/data, start `kinterval suite run $SUITE_NAME` in the background
#            (SUITE_NAME=mini by default; SUITE_NAME=mini-seeds adds seeds 7 and 42, see its suite file)
#            (a second `start` while it runs only says so)
#   wait     follow the suite until its process exits (done, or failed: at once) or for WAIT_S seconds
#            (default 540), then print progress
#   pack     `kinterval suite gate` (full mode: writes gate.json), then manifest, gate record, evaluations,
#            diagnostics, status, metrics and logs into $OUT/${SUITE_NAME}_results.tar.gz
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT" .mini
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
PY=${PY:-python3}
CORPUS=${CORPUS:-.corpus/docs}
PER_GPU=${PER_GPU:-3}  # set from the `measure` stage's best row
SUITE_NAME=${SUITE_NAME:-mini}
SUITE=.mini/$SUITE_NAME
LOG=.mini/$SUITE_NAME.log
PID=.mini/$SUITE_NAME.pid

kinterval() { $PY -m kinterval "$@"; }

for stage in "$@"; do
  t0=$(date +%s)
  case "$stage" in
    env)
      {
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
        echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"
      } | tee "$OUT/env.txt" ;;
    kernels)  # most of the time is Triton compiling: 16 test workers where pytest-xdist is installed
      xdist=""
      $PY -c "import xdist" 2>/dev/null && xdist="-n 16"
      # SIGINT at the limit: pytest stops, reports what ran (exit code 2), and the suite still starts if no
      # test failed; any failure (exit code 1), or no test run, stops this call before the suite
      OMP_NUM_THREADS=1 timeout --preserve-status -s INT -k 20 ${KERNELS_LIMIT:-360} $PY -m pytest -q -p no:cacheprovider $xdist \
        --tb=line -rf tests/ops/test_triton.py \
        -k "(operator_causal or historical or wide_rows or precision_modes or low_precision or inference) and not gpu_large" 2>&1 \
        | tail -n 25 | tee "$OUT/kernels.txt"
      rc=${PIPESTATUS[0]}
      if [ "$rc" -eq 2 ] && grep -q " passed" "$OUT/kernels.txt" && ! grep -qE "[0-9]+ (failed|error)" "$OUT/kernels.txt"; then
        echo "kernel preflight cut at ${KERNELS_LIMIT:-360} s with no failure: going on" | tee -a "$OUT/kernels.txt"
      elif [ "$rc" -ne 0 ]; then
        echo "kernel preflight failed (pytest exit code $rc): not starting the suite"; exit 1
      fi ;;
    measure)  # tokens/s of N concurrent training processes of the mini model (bf16 autocast, auto backend)
      for n in 1 2 3 4; do
        for i in $(seq "$n"); do
          timeout 240 $PY benchmarks/train_throughput.py --model small --block-size 256 --micro-batch 64 \
            --operators lerp-k16 --steps 20 --warmup 5 --precompile 0 > ".mini/measure_${n}_${i}.txt" 2>&1 &
        done
        wait
        # the table's lerp-k16 row (markdown): column 6 is the median tokens/s of one process
        total=$(cat .mini/measure_"${n}"_*.txt | awk -F'|' '$2 ~ /^ *lerp-k16 *$/ {gsub(/[ ,]/, "", $6); s += $6} END {print s + 0}')
        echo "per-gpu $n: $total tokens/s in all" | tee -a "$OUT/measure.txt"
      done ;;
    auto)  # the formal suites' STE runs train under backend="auto" (issue: the default backend crashed)
      timeout 300 $PY - <<'EOF' 2>&1 | tee "$OUT/auto.txt"
import shutil, tempfile
from pathlib import Path

import torch

from kinterval.data.prepare import prepare
from kinterval.ops import resolve_backend
from kinterval.suite.definition import load_suite
from kinterval.suite.manifest import expected_config
from kinterval.train.loop import train

run = load_suite("D").run("minmax-weight-k4.arithmetic-historical-s7")
data = Path(tempfile.mkdtemp()) / "synthetic"  # the corpus does not matter here: the backend does
prepare("synthetic", data, tokens=2_000_000, seed=0, progress=False)
cfg = expected_config(run, data)
steps = 4
cfg = cfg.override({"schedule.tokens": steps * cfg.block_size * 128, "schedule.warmup_tokens": cfg.block_size * 128,
                    "log.progress": False, "checkpoint.count": 1})
print("operator", run.operator, "backend", cfg.operator.backend, "->",
      resolve_backend(run.spec, "cuda", torch.bfloat16, backend=cfg.operator.backend), "(bf16 autocast)")
out = Path(tempfile.mkdtemp()) / "run"
res = train(cfg, out)
print("status", res.status, "steps", res.steps, "last loss", res.last_loss)
shutil.rmtree(out.parent, ignore_errors=True)
EOF
      ;;
    start)
      # inside the suite folder, so that the manifest and evaluations record it relative to it (`pack` leaves
      # it out of the tarball)
      if [ ! -f "$SUITE/data/meta.json" ]; then
        ls "$CORPUS"/*.bin > /dev/null || { echo "no $CORPUS/*.bin: copy the token files there and carry .corpus"; exit 2; }
        kinterval data prepare --source "bin:$CORPUS" --out "$SUITE/data" || exit 2
      fi
      if [ -f "$PID" ] && kill -0 "$(cat "$PID")" 2>/dev/null; then
        echo "suite already running (pid $(cat "$PID")): follow it with wait"; continue
      fi
      setsid nohup $PY -m kinterval suite run "$SUITE_NAME" --out "$SUITE" --data "$SUITE/data" --gpus 1 \
        --per-gpu "$PER_GPU" >> "$LOG" 2>&1 < /dev/null &
      echo $! > "$PID"
      echo "suite started (pid $!), --per-gpu $PER_GPU; follow with: bash benchmarks/gpu_mini.sh wait" ;;
    wait)  # until the suite process exits (finished, or failed: then at once) or WAIT_S seconds pass
      deadline=$(( $(date +%s) + ${WAIT_S:-540} ))
      [ -f "$PID" ] || echo "no suite started here (no $PID)"
      while [ -f "$PID" ] && kill -0 "$(cat "$PID")" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do
        sleep 10
      done
      if [ -f "$PID" ] && ! kill -0 "$(cat "$PID")" 2>/dev/null; then
        grep -q "runs ok" "$LOG" && echo "suite finished" || echo "suite process exited without its summary line"
      fi
      tail -n 20 "$LOG"
      for f in "$SUITE"/runs/*/metrics.jsonl; do
        [ -f "$f" ] && echo "$(basename "$(dirname "$f")"): $(wc -l < "$f") steps logged"
      done ;;
    pack)  # the full gate first, here where the checkpoints and data are: it writes gate.json, the record
      # that `suite gate --results-only` holds the unpacked copy against (an unfinished suite fails it: the
      # finished runs come back all the same)
      timeout 240 $PY -m kinterval suite gate "$SUITE" 2>&1 | tail -n 25 | tee "$OUT/gate.txt"
      cp "$LOG" "$SUITE/suite.log" 2>/dev/null
      tar -czf "$OUT/${SUITE_NAME}_results.tar.gz" --exclude='checkpoints' --exclude="$SUITE_NAME/data" -C .mini "$SUITE_NAME"
      size=$(stat -c %s "$OUT/${SUITE_NAME}_results.tar.gz")
      echo "${SUITE_NAME}_results.tar.gz: $size bytes"
      [ "$size" -le $((16 * 1024 * 1024)) ] || echo "WARNING: over 16 MiB, it will not come back" ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
  echo "[$stage] $(( $(date +%s) - t0 )) s"
done
