#!/usr/bin/env bash
# One call on a lent GPU machine: environment, kernel tests, attention table, training throughput.
#
#   bash benchmarks/gpu_session.sh [--plan] [STAGE ...]      (default: kernel = tests-quick bench-quick)
#
# Every stage name is checked, and the stages' time limits are added up, before anything runs: an unknown
# stage, or stages whose limits add up to more than GPU_SESSION_BUDGET seconds (default 560: one 600-s
# command less ~40 s for the environment lines, Python's start and the stage summaries), stop the script with
# exit status 2 and nothing run. GPU_SESSION_BUDGET=0 turns the check off (a machine without a 10-minute
# limit). --plan prints the stages, their limits and the total, and runs nothing.
#
# Each stage runs under its own limit (SIGINT first, so that pytest and benchmarks/attention.py still print
# what they have; SIGKILL GRACE seconds later), so that one slow stage cannot eat the rest. After each stage
# one line "== stage NAME: ok | FAILED (exit N) | TIMED OUT ..., S s (limit L s)" goes to stdout and
# $OUT/env.txt; the script exits 1 if any stage failed or timed out, 0 if all passed.
#
# Logs go to $OUT (or ./out); when they are more than 8 files (what a lent machine brings back), all but
# env.txt end up in $OUT/session.tar.gz. On a copy of the checkout without .git, set KINTERVAL_COMMIT=<sha> in the
# command so that the tables name the commit they measured.
set -uo pipefail
cd "$(dirname "$0")/.."

GRACE=15  # seconds between SIGINT and SIGKILL; counted in every stage's limit below

# Limits in seconds, each a stage's worst case (SIGINT at LIMIT - GRACE, SIGKILL at LIMIT).
declare -A LIMIT=(
  # test_triton.py on the GPU, 16 xdist workers. Sized on the 2026-11-23 run (216 tests in 233 s); the file
  # now collects 666 tests: ASSUMED ~600 s at the same rate per test (not measured), so this stage takes one
  # call alone and will likely reach its limit; SIGINT there still prints one line per failure.
  [tests]=555
  # the same file in two shares (every second test from the first, from the second; KINTERVAL_TEST_SHARD in
  # tests/conftest.py): ~300 s each assumed, one call each, together the whole file
  [tests-1]=420
  [tests-2]=420
  # the same file cut at 225 s (about a third of it at the assumed rate, in file order): the kernel plan's tests.
  # Reaching the cap with no failure counts as passed; its summary line says the run was partial.
  [tests-quick]=240
  # the whole suite with a GPU present; never timed on a GPU: expect it to reach its limit
  [tests-all]=555
  # 3 operators x {bf16, TF32} x T {1024, 4096} x D {64, 128}: ~45 s precompile, 24 rows, 12 eager references
  # of 10+ calls each (70-170 ms a call at T = 1024); ran well inside 300 s on 2026-11-23 with one call each
  [bench-quick]=300
  # ieee rows at T = 1024 (f+b 53-65 ms: 10+ calls each) and their FlexAttention rows
  [bench-ieee]=240
  # 4 operators x {ieee, tf32x3, bf16x6} x T {1024, 4096} x D {64, 128}; ieee at T = 4096 ~0.25 s a call
  [bench-eval]=495
  # the part of it that decides the evaluation default: 2 operators x {ieee, bf16x6} x T 1024 x D {64, 128},
  # 8 rows (estimated from bench-eval's size; not measured): fits what a sitting call leaves of a session
  [bench-eval-quick]=240
  # 6 short runs of 90 s each (3 split settings, twice)
  [bench-split]=540
  [bench-baselines]=495
  # split and fused backward, never timed on a GPU: the limit of a call alone
  [bench-bwd]=555
  # grouped-query attention (4 q heads per k/v head): 2 operators x bf16 x T {1024, 4096} x D {64, 128},
  # 8 rows beside SDPA flash with enable_gqa (estimated from bench-quick's size; not measured)
  [bench-gqa]=240
  # softcap and attention sinks: 2 operators x bf16 x T {1024, 4096} x D {64, 128}, once with --softcap 30 and
  # once with --sinks (two calls of half the limit each: 8 rows and a precompile apiece, each sized like
  # bench-gqa's 8 rows; estimated, not measured)
  [bench-mods]=300
  # one dtype mode: 40 autotuned kernel rows and 8 compiled FlexAttention shapes, estimated 5-8 min
  [bench-bf16]=555 [bench-tf32]=555 [bench-tf32x3]=555 [bench-bf16x6]=555
  [bench]=1665  # the three modes in a row: only with GPU_SESSION_BUDGET=0
  # 4 operators x 3 interleaved repeats x 105 steps of GPT-2 124M at micro-batch 8 (~50-60 ms a step)
  [train]=300
  # 8 rows x 105 steps at up to micro-batch 64 after probing the largest; the table is rewritten after
  # every row, so a run cut at its limit keeps the rows it finished
  [throughput]=555
  [train-ref]=200
  # sdpa and fwm-prob-k4, eager then with compiled blocks: 2 x 2 rows x 55 steps at micro-batch 8, plus
  # inductor's compile of 12 blocks in the compiled rows' warm-up (estimated, not measured)
  [train-compile]=300
)
declare -A PLAN=([kernel]="tests-quick bench-quick")  # named stage lists, each one command
BUDGET=${GPU_SESSION_BUDGET:-560}

plan_only=0
[ "${1:-}" = "--plan" ] && { plan_only=1; shift; }
requested=("$@")
[ ${#requested[@]} -eq 0 ] && requested=(kernel)
stages=()
for s in "${requested[@]}"; do
  if [ -n "${PLAN[$s]:-}" ]; then
    read -ra more <<<"${PLAN[$s]}"
    stages+=("${more[@]}")
  elif [ -n "${LIMIT[$s]:-}" ]; then
    stages+=("$s")
  else
    echo "unknown stage '$s'; stages: $(printf '%s\n' "${!LIMIT[@]}" | sort | tr '\n' ' ')plans: ${!PLAN[*]}" >&2
    exit 2
  fi
done
total=0
for s in "${stages[@]}"; do total=$((total + LIMIT[$s])); done
if [ "$plan_only" = 1 ]; then
  for s in "${stages[@]}"; do echo "$s ${LIMIT[$s]} s"; done
  echo "total $total s (budget ${BUDGET} s; 0: none)"
fi
if [ "$BUDGET" -gt 0 ] && [ "$total" -gt "$BUDGET" ]; then
  echo "stages ${stages[*]} may run $total s, over the budget of $BUDGET s for one 600-s command: give" \
    "them to several calls (bash benchmarks/gpu_session.sh --plan STAGES adds up the limits), or set" \
    "GPU_SESSION_BUDGET=0 on a machine without a 10-minute limit" >&2
  exit 2
fi
[ "$plan_only" = 1 ] && exit 0

OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
PY=${PY:-python3}
XDIST=""  # 16 test workers where pytest-xdist is installed (the GPU machine has no package registry)
$PY -c "import xdist" 2>/dev/null && XDIST="-n 16"

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/env.txt"
else
  echo "no nvidia-smi on this machine" | tee "$OUT/env.txt"
fi
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/env.txt"
echo "commit $(git rev-parse HEAD 2>/dev/null || echo "${KINTERVAL_COMMIT:-unknown}")" | tee -a "$OUT/env.txt"
echo "stages ${stages[*]}: limits add up to $total s" | tee -a "$OUT/env.txt"

limited() {  # limited STAGE CMD...: CMD under STAGE's limit (SIGINT, then SIGKILL GRACE s later)
  local stage=$1
  shift
  timeout -s INT -k "$GRACE" $((LIMIT[$stage] - GRACE)) "$@"
}

note=""  # a remark for the stage's summary line
run_stage() {  # run_stage STAGE: the exit status of the stage's command (the first of its pipeline)
  local stage=$1 rc=0 st s mode modes
  case "$stage" in
    tests|tests-quick|tests-1|tests-2)  # kernel tests on the GPU; SIGINT at the limit prints each failure
      local log="$OUT/${stage//-/_}.log" shard=""
      case "$stage" in tests-1) shard=1/2 ;; tests-2) shard=2/2 ;; esac
      KINTERVAL_TEST_SHARD=$shard OMP_NUM_THREADS=1 limited "$stage" $PY -m pytest -q -p no:cacheprovider $XDIST --tb=line -rf \
        --durations=15 -p no:benchmark -W ignore::DeprecationWarning tests/ops/test_triton.py 2>&1 \
        | tee "$log" | grep -E "FAILED|passed|failed|rror|s call" | cut -c1-260 | tail -80
      rc=${PIPESTATUS[0]}
      if [ "$stage" = tests-quick ] && [ "$rc" = 124 ] && ! grep -qE "^(FAILED|ERROR) |[0-9]+ (failed|errors?)\b" "$log"; then
        note="reached its cap: a partial run, no failure before it"
        rc=0
      fi
      return "$rc" ;;
    tests-all)  # the whole suite with a GPU present (model/train tests pick the triton backend)
      OMP_NUM_THREADS=1 limited "$stage" $PY -m pytest -q -p no:cacheprovider $XDIST --tb=line -rf \
        -p no:benchmark tests 2>&1 | tee "$OUT/tests_all.log" | grep -E "FAILED|passed|failed|rror" | tail -60
      return "${PIPESTATUS[0]}" ;;
    bench-quick)
      limited "$stage" $PY benchmarks/attention.py --ops softmax,minmax-weight-k4,fwm-prob-k4 --dtypes bf16,tf32 \
        --T 1024,4096 --D 64,128 --compile-t '' --ref-max-t 1024 --no-flex --csv "$OUT/bench_quick.csv" \
        2>"$OUT/bench_quick.err" | tee "$OUT/bench_quick.md"
      return "${PIPESTATUS[0]}" ;;
    bench-ieee)  # fp32 with full-precision dots (the evaluation numerics): Triton's FMA dot, its own tiles
      limited "$stage" $PY benchmarks/attention.py --ops softmax,minmax-weight-k4,fwm-prob-k4 --dtypes ieee \
        --T 1024 --D 64,128 --compile-t '' --ref-max-t 1024 --csv "$OUT/bench_ieee.csv" 2>"$OUT/bench_ieee.err" \
        | tee "$OUT/bench_ieee.md"
      return "${PIPESTATUS[0]}" ;;
    bench-eval)  # the evaluation numerics: fp32 FMA dots ("ieee") against the split dots, forward errors vs fp64
      limited "$stage" $PY benchmarks/attention.py --ops softmax,fwm-prob-k4,minmax-weight-k4,lerp-k4 \
        --dtypes ieee,tf32x3,bf16x6 --T 1024,4096 --D 64,128 --compile-t '' --ref-max-t 0 --no-flex \
        --csv "$OUT/bench_eval.csv" 2>"$OUT/bench_eval.err" | tee "$OUT/bench_eval.md"
      return "${PIPESTATUS[0]}" ;;
    bench-eval-quick)  # bf16x6 against ieee at T = 1024: speed half of the evaluation-default decision
      limited "$stage" $PY benchmarks/attention.py --ops softmax,fwm-prob-k4 --dtypes ieee,bf16x6 --T 1024 \
        --D 64,128 --compile-t '' --ref-max-t 0 --no-flex --csv "$OUT/bench_eval_quick.csv" \
        2>"$OUT/bench_eval_quick.err" | tee "$OUT/bench_eval_quick.md"
      return "${PIPESTATUS[0]}" ;;
    bench-split)  # interior tiles: forward/backward split limits 64/64 (default), 64/0, 0/0; bf16, D = 64, twice
      for s in 64/64 64/0 0/0 64/64 64/0 0/0; do
        KINTERVAL_TRITON_SPLIT_MAX_D=${s%/*} KINTERVAL_TRITON_SPLIT_BWD_MAX_D=${s#*/} timeout -s INT -k 5 85 \
          $PY benchmarks/attention.py --ops softmax,minmax-weight-k4,fwm-prob-k4 --dtypes bf16 --T 1024,4096 \
          --D 64 --compile-t '' --ref-max-t 0 --no-sdpa --no-flex --err-t 0 2>>"$OUT/bench_split.err" \
          | grep -E "^\| +[a-z]" | sed "s|^|split=$s |" | tee -a "$OUT/bench_split.md"
        st=${PIPESTATUS[0]}
        [ "$st" != 0 ] && rc=$st
      done
      return "$rc" ;;
    bench-baselines)  # the reduced-precision exp baselines (App. D.5) beside softmax, bf16 and TF32, with errors
      limited "$stage" $PY benchmarks/attention.py --ops softmax,bf16-exp,fp8-exp --dtypes bf16,tf32 \
        --T 1024,4096 --D 64,128 --compile-t '' --ref-max-t 1024 --no-flex \
        --csv "$OUT/bench_baselines.csv" 2>"$OUT/bench_baselines.err" | tee "$OUT/bench_baselines.md"
      return "${PIPESTATUS[0]}" ;;
    bench-bwd)  # the one-kernel backward (atomic dQ, opt-in) against the split dQ + dK/dV kernels, one run
      limited "$stage" $PY benchmarks/attention.py --ops softmax,fwm-prob-k4,minmax-weight-k4,lerp-k4 \
        --dtypes bf16,tf32 --T 1024,4096 --D 64,128 --bwd split,fused --compile-t '' --ref-max-t 0 --no-flex \
        --csv "$OUT/bench_bwd.csv" 2>"$OUT/bench_bwd.err" | tee "$OUT/bench_bwd.md"
      return "${PIPESTATUS[0]}" ;;
    bench-gqa)  # grouped-query attention: the kernels read each k/v head in place; SDPA flash with enable_gqa
      limited "$stage" $PY benchmarks/attention.py --ops softmax,fwm-prob-k4 --dtypes bf16 --gqa 4 --T 1024,4096 \
        --D 64,128 --compile-t '' --ref-max-t 0 --no-flex --csv "$OUT/bench_gqa.csv" 2>"$OUT/bench_gqa.err" \
        | tee "$OUT/bench_gqa.md"
      return "${PIPESTATUS[0]}" ;;
    bench-mods)  # the kernels with a softcap (Gemma 2) and with attention sinks (gpt-oss); SDPA flash plain softmax
      for mode in softcap sinks; do  # half the stage's limit each
        local flag=(--sinks)
        [ "$mode" = softcap ] && flag=(--softcap 30)
        timeout -s INT -k "$GRACE" $((LIMIT[$stage] / 2 - GRACE)) $PY benchmarks/attention.py \
          --ops softmax,fwm-prob-k4 --dtypes bf16 "${flag[@]}" --T 1024,4096 --D 64,128 --compile-t '' \
          --ref-max-t 0 --no-flex --csv "$OUT/bench_mods_$mode.csv" 2>"$OUT/bench_mods_$mode.err" \
          | tee "$OUT/bench_mods_$mode.md"
        st=${PIPESTATUS[0]}
        [ "$st" != 0 ] && rc=$st
      done
      return "$rc" ;;
    bench|bench-bf16|bench-tf32|bench-tf32x3|bench-bf16x6)
      # The issue-15 table: 5 operators + FlexAttention, T 1024..8192, D 64/128, causal, with errors vs fp64.
      # One dtype mode per stage (one call each); `bench` runs the three in a row.
      modes=${stage#bench-}; [ "$stage" = bench ] && modes="bf16 tf32 tf32x3"
      for mode in $modes; do
        local compiled=(--compile-t '')  # torch.compile(reference) for the issue's target: fwm-prob-k4, TF32
        [ "$mode" = tf32 ] && compiled=(--compile-t 1024,4096 --compile-ops fwm-prob-k4 --compile-dtypes tf32)
        limited "bench-$mode" $PY benchmarks/attention.py --dtypes "$mode" --T 1024,2048,4096,8192 --D 64,128 \
          --ops softmax,fwm-prob-k4,minmax-weight-k4,minmax-prob-k4,lerp-k4 --ref-max-t 1024 "${compiled[@]}" \
          --csv "$OUT/bench_$mode.csv" 2>"$OUT/bench_$mode.err" | tee "$OUT/bench_$mode.md"
        st=${PIPESTATUS[0]}
        [ "$st" != 0 ] && rc=$st
      done
      return "$rc" ;;
    train)
      limited "$stage" $PY benchmarks/train_throughput.py --operators sdpa,softmax,minmax-weight-k4,fwm-prob-k4 \
        --repeats 3 2>&1 | tee "$OUT/train.md"
      return "${PIPESTATUS[0]}" ;;
    throughput)  # GPT-2 124M training, float32 (vs SDPA fp32) and bfloat16 attention inputs (vs SDPA flash bf16):
      # the largest power-of-two micro-batch that fits (capped at 64), 100 timed steps per row
      limited "$stage" $PY benchmarks/train_throughput.py --operators sdpa,minmax-weight-k4,fwm-prob-k4,lerp-k4 \
        --attention-dtype float32,bfloat16 --micro-batch max --micro-batch-cap 64 --steps 100 --warmup 5 \
        --markdown "$OUT/throughput.md" 2>"$OUT/throughput.err" | tee "$OUT/throughput.txt"
      return "${PIPESTATUS[0]}" ;;
    train-compile)  # what `kinterval train --compile` buys: the same rows eager, then with compiled blocks
      for mode in eager compile; do  # half the stage's limit each
        timeout -s INT -k "$GRACE" $((LIMIT[$stage] / 2 - GRACE)) $PY benchmarks/train_throughput.py \
          --operators sdpa,fwm-prob-k4 --steps 50 --warmup 5 $([ "$mode" = compile ] && echo --compile) 2>&1 \
          | tee "$OUT/train_$mode.md"
        st=${PIPESTATUS[0]}
        [ "$st" != 0 ] && rc=$st
      done
      return "$rc" ;;
    train-ref)  # the materialized operator (closed_form backend), for the issue's comparison
      limited "$stage" $PY benchmarks/train_throughput.py --backend closed_form --micro-batch 4 \
        --operators minmax-weight-k4 2>&1 | tee "$OUT/train_ref.md"
      return "${PIPESTATUS[0]}" ;;
  esac
}

summary=()
failed=0
for stage in "${stages[@]}"; do
  t0=$(date +%s)
  note=""
  run_stage "$stage"
  rc=$?
  secs=$(($(date +%s) - t0))
  case "$rc" in
    0) status="ok${note:+ ($note)}" ;;
    124|137) status="TIMED OUT (exit $rc: reached its limit; what it printed so far is in \$OUT)" ;;
    *) status="FAILED (exit $rc)" ;;
  esac
  [ "$rc" != 0 ] && failed=$((failed + 1))
  summary+=("== stage $stage: $status, $secs s (limit ${LIMIT[$stage]} s)")
  echo "${summary[-1]}" | tee -a "$OUT/env.txt"
done
printf '%s\n' "${summary[@]}"  # again together, at the end of the output
echo "== summary: $failed of ${#stages[@]} stages failed or timed out" | tee -a "$OUT/env.txt"
# A lent machine brings back at most 8 files from $OUT (one stage writes up to 10): more than that go into
# one archive beside env.txt, so that none is left behind.
n_files=$(find "$OUT" -type f | wc -l)
if [ "$n_files" -gt 8 ]; then
  (cd "$OUT" && find . -type f ! -name env.txt ! -name session.tar.gz -print0 \
    | tar --null -czf session.tar.gz -T - --remove-files) \
    && echo "$n_files files in \$OUT: all but env.txt packed into \$OUT/session.tar.gz (at most 8 come back)"
fi
[ "$failed" = 0 ]
