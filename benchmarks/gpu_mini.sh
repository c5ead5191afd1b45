#!/usr/bin/env bash
# The mini suite in sittings on a lent GPU machine: each sitting is one device call that trains the runs the
# results folder still lacks until a deadline, signs off those that finished, and brings their results back.
#
#   bash benchmarks/gpu_mini.sh check      # here, on the CPU, before the call (costs no device time)
#   bash benchmarks/gpu_mini.sh sitting    # the device call: `run` with carry [".corpus"] (and the PIN
#                                          # below), timeout_s 600; `check` prints the exact command
#
# then, here, with the tarball the call brought back (files_at; S is the suite: `mini`, `mini-seeds`,
# `mini-modern`):
#   mkdir -p out/sitting && tar -xzf FILES_AT/S_results.tar.gz -C out/sitting
#   kinterval suite merge out/sitting/S docs/results/S       # the first merge makes docs/results/S
#   kinterval suite gate docs/results/S --results-only && kinterval report docs/results/S
#   (and commit docs/results/S, the call's env.txt, preflight.txt, sitting.log and gate.txt beside it in
#   docs/results/S/sittings/N/, and an entry in docs/results/README.md)
#
# A lent machine lives for one session's device time (15 minutes here, its start included), and nothing on it
# outlives it: checkpoints are far too large to come back, so a run that the deadline cuts is lost and trains
# again, from the start, in the next sitting. Runs that finished come back as results (evaluations, geometry,
# metrics, status, logs) with the partial gate's `gate.json`, and `kinterval suite merge` adds them to the
# results folder; the next sitting runs only what that folder lacks (`suite run --skip-gated`).
#
# Every sitting must run the operator code of the results folder's first sitting (the gate's "same code"):
# `check` says whether this checkout's is. If it is not, put this checkout beside the repository with that
# commit's operator code (src/kinterval/ops, what ops_sha256 hashes; the runner, gate and trainer stay this
# checkout's) and kernel tests that import it (this checkout's may use what the pinned code lacks: `check`
# collects them against it), and run from it:
#   git worktree add --no-checkout --detach .pinned HEAD
#   git -C .pinned sparse-checkout set src tests/ops && git -C .pinned checkout   # only these run there: the
#                                                           # rest of a full checkout would not fit in 64 MiB
#   git -C .pinned rm -r -q -f src/kinterval/ops          # then exactly COMMIT's files (a file it lacks would
#   git -C .pinned checkout COMMIT -- src/kinterval/ops   # change the hash); COMMIT: git_commit in the manifest
#   git -C .pinned checkout TESTS -- tests/ops tests/conftest.py   # TESTS: a commit whose kernel tests ran
#                                                           # against COMMIT's code (docs/results/README.md)
#   PIN=.pinned bash benchmarks/gpu_mini.sh check
#   in the call: PIN=.pinned bash ... sitting kernels  (carry .corpus, .pinned; `kernels`: this checkout's
#   kernel tests of this checkout's code, in the time the sitting leaves)
# A suite whose results are reported with another folder's (mini-seeds with mini: the seed intervals pool
# both) must run that folder's code from its first sitting on: SAME_CODE_AS=DIR makes `check` refuse other
# operator code than DIR's manifest records (default for mini-seeds: docs/results/mini).
#
# The corpus travels from a git-ignored folder inside the repository, xz-compressed (GPT-2 token files
# shrink to about 40%: 40 MiB of them to 15, room for the results folders under the 64 MiB that travel).
# Once, in the repository root:
#   mkdir -p .corpus/docs && cp PATH_TO_YOUR_TOKEN_FILES/*.bin .corpus/docs/   # flat uint16 GPT-2 tokens
#   xz -T0 .corpus/docs/*.bin                          # each X.bin becomes X.bin.xz
# The sitting decompresses each X.bin.xz beside itself before `data prepare`, so that the prepared data, its
# hashes and its source label (bin:.corpus/docs) are those of the plain files. Plain X.bin files travel too,
# as they are.
#
# Stages (several in one call run in order):
#   check    corpus present, every .xz of it intact, and small enough to travel; the results folder passes
#            the results-only gate and was run by this code; which runs are still to run; then the sitting's
#            own commands run those runs on this CPU at a tiny size, with the code the sitting runs (about
#            40 s; SMOKE=0 skips it)
#   sitting  env, then at once: the kernel preflight (the core fused-kernel tests on this GPU, at most
#            PREFLIGHT_S s, default 150, in the background) and the suite's pending runs (--per-gpu PER_GPU,
#            default 3; each kernel's default tile, KINTERVAL_TRITON_AUTOTUNE=0, unless set): the first MAX_RUNS
#            of them (default PER_GPU: one wave, which fills a sitting; a second wave would be cut at the
#            deadline and lost, and would hold the machine for nothing). At DEADLINE_S s after the start
#            (default 545) the suite is stopped. Each run that finishes is signed off at
#            once (`suite gate --partial`) and packed (`suite merge` into ${SUITE_NAME}_results.tar.gz in
#            $OUT, replacing the last), so that a call cut short still brings back what finished. A failed
#            preflight does not stop the suite: the results come back all the same with
#            PREFLIGHT_FAILED.txt, the stages after it run, and the call exits with 3 (read preflight.txt
#            before merging them).
#            The runs that did not finish come back as evidence only: unfinished.tar.gz holds their
#            status.json, metrics.jsonl and log (a failed run's traceback).
#            The wave guard (GUARD=0 turns it off): from GUARD_FROM s (default 60), every GUARD_EVERY s
#            (default 15), each run still training is timed over the last GUARD_SPAN s or more (default 30;
#            steps from its metrics.jsonl against the wall clock, so logged validations and checkpoints
#            count). The wave ends at best (the GPU full, so that each run that ends speeds up the others)
#            after the sum of the runs' training time left over the number of runs, plus AFTER_S (default
#            120: the five evaluations and the sign-off after training, about 110 s on the H200). When even
#            that is after the deadline at two looks in a row (a slower GPU than the H200 that sized the
#            wave), the run with the most training left is stopped, so that the others finish instead of all
#            being cut; a run that is evaluating, or the last one training, is never stopped. Projections and
#            stops go to stdout and to the end of sitting.log
#   env      GPU, driver, torch and triton versions, the commit (into $OUT/env.txt)
#   kernels  kernel tests in the foreground, of this checkout's code even with a PIN (the code the next kernel
#            change builds on): KERNELS_TESTS (default: this checkout's tests/ops/test_triton.py with a PIN,
#            else PREFLIGHT_TESTS) selected by KERNELS_K (default PREFLIGHT_K), at most
#            KERNELS_LIMIT s (default: 360, or what is left of CALL_S = 575 s after the stages before it in
#            this call, e.g. `sitting kernels`; skipped with under 60 s left)
#   measure  training throughput of the mini model with 1, 2, 3 and 4 processes on the GPU (best PER_GPU)
#   auto     minmax-weight-k4 in historical arithmetic, suite D's protocol, a few steps under backend="auto"
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT" .mini
ROOT=${PIN:-.}  # the checkout whose code runs: this one, or the pinned commit of the results folder
export PYTHONPATH=$PWD/$ROOT/src PYTHONUNBUFFERED=1
ROOT_TESTS=$ROOT/tests; [ -d "$ROOT_TESTS" ] || ROOT_TESTS=tests  # a pin of src/ only: this checkout's tests
# the `kernels` stage tests this checkout's code with this checkout's tests (KERNELS_TESTS), even with a pin
KERNELS_TESTS=${KERNELS_TESTS:-${PIN:+tests/ops/test_triton.py}}
KERNELS_TESTS=${KERNELS_TESTS:-${PREFLIGHT_TESTS:-tests/ops/test_triton.py}}
PY=${PY:-python3}
CORPUS=${CORPUS:-.corpus/docs}
# mini on an H200: three runs at once finished in 450-464 s (330-350 s of training each, five per-block
# evaluations, the preflight beside them); the deadline leaves a slower GPU some room, and the ~30 s after
# it (stopping the suite, the last pack) keep the call within 600 s
PER_GPU=${PER_GPU:-3}
MAX_RUNS=${MAX_RUNS:-$PER_GPU}  # runs a sitting starts: one wave (three at once end at 450-465 s, a deadline of 545)
SUITE_NAME=${SUITE_NAME:-mini}  # a shipped suite, or a suite file
SUITE_ID=$(basename "$SUITE_NAME" .toml)
RESULTS=${RESULTS:-docs/results/$SUITE_ID}
[ "$SUITE_ID" = mini-seeds ] && SAME_CODE_AS=${SAME_CODE_AS-docs/results/mini}  # its seeds pool with mini's
SAME_CODE_AS=${SAME_CODE_AS:-}
SUITE=.mini/$SUITE_ID
LOG=.mini/$SUITE_ID.log
T_START=$(date +%s)
# the mini suites' operators: not the two rounding baselines (their bf16 bounds are the tightest; suite
# "supplementary" trains them: PREFLIGHT_K="(operator_causal or ...) and not gpu_large" takes them in), and
# not the opt-in one-kernel backward, which training does not run unless KINTERVAL_TRITON_BWD=fused
PREFLIGHT_K=${PREFLIGHT_K:-(operator_causal or historical or wide_rows or precision_modes or low_precision or inference) and not gpu_large and not bf16-exp and not fp8-exp and not fused}

kinterval() { $PY -m kinterval "$@"; }
elapsed() { echo $(( $(date +%s) - T_START )); }

# The core fused-kernel tests of the ops tests of $ROOT: every operator, historical arithmetic, wide rows,
# the precision modes and the inference forward of evaluation, against the float64 reference; PREFLIGHT_WORKERS
# (16; 8 beside a sitting's runs, which need a core each; 0: one process) workers where pytest-xdist is installed
# (PREFLIGHT_TESTS and PREFLIGHT_K choose other tests). Exit code 0 (all passed, or cut at the limit with no
# failure) or 1.
preflight() {  # preflight LIMIT_S LOGFILE [K [TESTS]]
  local xdist="" rc
  $PY -c "import xdist" 2>/dev/null && xdist="-n ${PREFLIGHT_WORKERS:-16}"
  OMP_NUM_THREADS=1 timeout --preserve-status -s INT -k 20 "$1" $PY -m pytest -q -p no:cacheprovider $xdist \
    --tb=line -rf "${4:-${PREFLIGHT_TESTS:-$ROOT_TESTS/ops/test_triton.py}}" -k "${3:-$PREFLIGHT_K}" \
    > ".mini/$(basename "$2").full" 2>&1
  rc=$?
  grep -vE "^ |Warning|warnings summary|^tests/.*::|^$|^-- Docs" ".mini/$(basename "$2").full" | tail -n 25 > "$2"
  # SIGINT at the limit: pytest reports what ran (exit code 2); no failure among them counts as a pass
  if [ "$rc" -eq 2 ] && grep -q " passed" "$2" && ! grep -qE "[0-9]+ (failed|error)" "$2"; then
    echo "kernel preflight cut at $1 s with no failure" >> "$2"; rc=0
  fi
  [ "$rc" -eq 0 ]
}

# Two lines: the runs the results folder does not sign off yet, in the suite's order (all of them without a
# results folder), space-separated; then a line that counts them. An error line and exit 1 when the folder
# fails the results-only gate, holds another suite or was run by other operator code.
pending_runs() {
  $PY - "$RESULTS" "$SUITE_NAME" <<'EOF'
import sys
from pathlib import Path

from kinterval.suite.definition import load_suite
from kinterval.suite.runner import signed_off

results, name = sys.argv[1:]
suite = load_suite(name)
done = []
if (Path(results) / "gate.json").is_file():
    try:
        _, done = signed_off(results, suite.name)  # results-only gate, same suite and operator code
    except ValueError as err:
        sys.exit(f"not ready: {err}")
pending = [r.run_id for r in suite.runs if r.run_id not in done]  # in the order they run
print(" ".join(pending))
print(f"{len(done)} runs signed off; to run ({len(pending)}): {' '.join(pending) or 'none'}")
EOF
}

# The token files of $CORPUS, X.bin or X.bin.xz (Python's lzma: no xz program needed where it runs):
#   corpus check      every X.bin.xz decompresses whole to an even number of bytes (uint16 tokens), and no
#                     X.bin lies beside it (which of the two would the sitting read?); one line of sizes
#   corpus head DIR   the first 20,000 bytes of each token file, as DIR/X.bin (the smoke's corpus)
#   corpus unpack     each X.bin.xz to X.bin beside it (through X.bin.part, renamed when whole)
#   corpus clean      the X.bin of each X.bin.xz removed again (`data prepare` copies the tokens)
corpus() {
  $PY - "$CORPUS" "$@" <<'EOF'
import lzma
import os
import sys
from pathlib import Path

folder, mode, *args = sys.argv[1:]
files = sorted(Path(folder).glob("*.bin")) + sorted(Path(folder).glob("*.bin.xz"))
f = Path(folder)  # the file at hand, for the error message


def chunks(path):
    """The decompressed bytes of an .xz file, 16 MiB at a time."""
    with lzma.open(path) as src:
        while chunk := src.read(1 << 24):
            yield chunk


try:
    if mode == "check":
        plain, packed, unpacked = [], 0, 0
        for f in files:
            if f.suffix == ".bin":
                plain.append(f.stat().st_size)
                continue
            if f.with_suffix("").exists():
                sys.exit(f"{f} and {f.with_suffix('')} both: keep one (the .xz travels in about 40% of the size)")
            n = sum(map(len, chunks(f)))
            if n % 2:
                sys.exit(f"{f}: {n} bytes decompressed, not whole uint16 tokens")
            packed, unpacked = packed + f.stat().st_size, unpacked + n
        mib = 1 << 20
        print(f"corpus: {len(plain)} plain files ({sum(plain) / mib:.1f} MiB), {len(files) - len(plain)} .xz"
              f" ({packed / mib:.1f} MiB, {unpacked / mib:.1f} MiB decompressed, intact)")
    elif mode == "head":
        for f in files:
            with lzma.open(f) if f.suffix == ".xz" else open(f, "rb") as src:
                Path(args[0], f.name.removesuffix(".xz")).write_bytes(src.read(20_000))
    elif mode == "unpack":
        for f in files:
            if f.suffix == ".xz" and not f.with_suffix("").exists():
                part = f.with_suffix(".part")
                with open(part, "wb") as dst:
                    dst.writelines(chunks(f))
                os.replace(part, f.with_suffix(""))
                print(f"{f} -> {f.with_suffix('')}")
    elif mode == "clean":
        for f in files:
            if f.suffix == ".xz":
                f.with_suffix("").unlink(missing_ok=True)
except (OSError, lzma.LZMAError, EOFError) as err:
    sys.exit(f"{f}: {err!r}")
EOF
}

# wave_guard DEADLINE: one look at the runs of this sitting ($LOG: started, not yet ended) in $SUITE. State
# (each run's (time, step) samples, the last stop) in .mini/guard.json; lines for the log on stdout. A run is
# stopped with SIGTERM to its `suite run-one` process (found in /proc: its command line and working
# directory), which the runner then logs as failed.
wave_guard() {
  $PY - "$LOG" "$SUITE" .mini/guard.json "$1" "${AFTER_S:-120}" "${GUARD_SPAN:-30}" "$T_START" <<'EOF'
import json
import os
import signal
import sys
import time
from pathlib import Path

log, suite, state_file, deadline, after, span, t_start = sys.argv[1:]
deadline, after, span, t_start = float(deadline), float(after), float(span), float(t_start)
now = time.time()
state_path = Path(state_file)
fresh = {"samples": {}, "since": 0, "said": 0, "late": False}  # samples: rid -> [[time, step], ...]
state = json.loads(state_path.read_text()) if state_path.is_file() else fresh
started, ended = [], set()
text = Path(log).read_text() if Path(log).is_file() else ""  # the runner's log (none before it starts)
for line in text.splitlines():
    rid, _, what = line.partition(": ")
    if what.startswith("started on GPU"):
        started.append(rid)
    elif rid in started and what:
        ended.add(rid)
running = [r for r in started if r not in ended]


def last_step(rid):
    """The run's last logged step (None before its first row) and its planned steps."""
    run = Path(suite, "runs", rid)
    try:
        steps = json.loads((run / "run_config.json").read_text())["plan"]["steps"]
        with open(run / "metrics.jsonl", "rb") as fh:
            start = fh.seek(max(0, fh.seek(0, os.SEEK_END) - 8192))
            rows = fh.read().decode(errors="replace").splitlines()[1 if start else 0 :]  # a row the seek cut
    except (OSError, ValueError, KeyError):
        return None, None
    for row in reversed(rows):
        try:
            return int(json.loads(row)["step"]), int(steps)
        except (ValueError, KeyError, TypeError):
            continue
    return None, None


left = {}  # seconds of training each run still training has left at its pace over the last `span` s or more
for rid in running:
    step, steps = last_step(rid)
    if step is None:
        continue
    samples = [s for s in state["samples"].get(rid, []) if s[0] >= state["since"]] + [[now, step]]
    state["samples"][rid] = samples[-64:]
    if step >= steps:
        continue  # training done: evaluating, never stopped
    old = [s for s in samples if now - s[0] >= span]
    if old and step > old[-1][1]:
        t0, s0 = old[-1]
        left[rid] = (steps - step) * (now - t0) / (step - s0)
# The wave's end at best: the runs share the GPU, so each one that ends speeds up the others; if the GPU is
# full, all of them are done after the sum of what they have left over the runs sharing it (if it is not,
# later, and then stopping one would not speed up the rest).
end = now + sum(left.values()) / len(running) + after if left else None
late = bool(left) and end > deadline and len(left) > 1  # a run to stop, if the next look agrees
stop = max(left, key=left.get) if late and state.get("late") else None  # two looks in a row: not a blip
if left and (late or now - state["said"] >= 60):
    state["said"] = now
    each = ", ".join(f"{r} {left[r]:.0f} s" for r in sorted(left, key=left.get))
    runs = f"{len(running)} run{'s' if len(running) > 1 else ''}"
    print(
        f"[{now - t_start:.0f} s] wave guard: training left at the current pace: {each}; {runs} on the GPU:"
        f" the wave ends at ~{end - t_start:.0f} s at best (deadline {deadline - t_start:.0f} s)"
        + ("" if stop or not late else "; past it: the next look decides")
    )
state["late"] = late and not stop
if stop:
    here = os.getcwd()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if "run-one" in args and args[-1] == stop and cwd == here and suite in args:
            os.kill(int(pid), signal.SIGTERM)
            print(f"[{now - t_start:.0f} s] wave guard: stopped {stop} (pid {pid}) so that the others finish")
            break
    else:
        print(f"[{now - t_start:.0f} s] wave guard: {stop} would end late, but its process was not found")
    state["since"] = now  # the pace changes: time the others afresh
state_path.write_text(json.dumps(state))
EOF
}

# The sitting's own commands (data prepare --source bin:, suite run, suite gate --partial, suite merge) with
# the code that runs there ($ROOT: this checkout, or the pin), on this CPU: the runs the next sitting starts,
# at 1 layer, 2 heads, d = 16, T = 32 and 1,024 tokens, on the first 10,000 tokens of each token file. A pin
# whose operator code lacks something the rest of this checkout imports fails here, not in the device call.
smoke() {  # smoke RUN_ID...
  local dir rc=0
  dir=$(mktemp -d)
  mkdir "$dir/corpus"
  corpus head "$dir/corpus" || { rm -rf "$dir"; return 1; }
  $PY - "$SUITE_NAME" "$dir/smoke.toml" "$@" <<'EOF' > "$dir/log" 2>&1 || rc=1
import json
import sys

from kinterval.suite.definition import load_suite

name, out, *ids = sys.argv[1:]
runs = [r for r in load_suite(name).runs if r.run_id in ids]
tiny = {"model.n_layer": 1, "model.n_head": 2, "model.n_embd": 16, "model.block_size": 32,
        "schedule.tokens": 1_024, "schedule.warmup_tokens": 256, "schedule.micro_batch": 8, "schedule.accum": 1}
if "model.n_kv_head" in runs[0].overrides:  # grouped-query heads (mini-modern): 1 for the 2 query heads
    tiny["model.n_kv_head"] = 1
lines = ['name = "smoke"', f'protocol = "{runs[0].protocol}"', 'corpus = "the sitting\'s, sliced"',
         f"seeds = [{runs[0].seed}]", "checkpoints = 1", "[overrides]"]
lines += [f"{json.dumps(k)} = {json.dumps(v)}" for k, v in {**runs[0].overrides, **tiny}.items()]
lines += ["[eval]", 'split = "val"', "geometry = true", "geometry_blocks = 1"]
for i, run in enumerate(runs):  # a group a run: each keeps its own protocol and seed
    lines += ["[[group]]", f'name = "g{i}"', f'protocol = "{run.protocol}"', f"seeds = [{run.seed}]",
              f"operators = [{json.dumps(run.operator)}]"]
open(out, "w").write("\n".join(lines) + "\n")
EOF
  [ "$rc" -eq 0 ] && { (
    export CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1
    kinterval data prepare --source "bin:$dir/corpus" --out "$dir/data" --quiet \
      && kinterval suite run "$dir/smoke.toml" --out "$dir/s" --data "$dir/data" --device cpu --threads 1 \
      && kinterval suite gate "$dir/s" --partial && kinterval suite merge "$dir/s" "$dir/merged"
  ) >> "$dir/log" 2>&1 || rc=1; }
  [ "$rc" -eq 0 ] || { cp "$dir/log" .mini/smoke.log; tail -n 5 "$dir/log"; }
  rm -rf "$dir"
  return "$rc"
}

if [ "$#" = 0 ]; then  # no stage: say how to call it, not nothing
  sed -n '4,7p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
for stage in "$@"; do
  t0=$(date +%s)
  case "$stage" in
    check)  # here, before the call
      ok=1
      if compgen -G "$CORPUS/*.bin" > /dev/null || compgen -G "$CORPUS/*.bin.xz" > /dev/null; then
        corpus check || ok=0
      else
        echo "no $CORPUS/*.bin or *.bin.xz: copy the token files there"; ok=0
      fi
      size=$(du -sm --exclude=.git --exclude=.mini . 2>/dev/null | cut -f1)
      echo "working tree with the corpus: ${size} MiB (at most 64 travel)"
      if [ "${size:-999}" -ge 64 ]; then
        ok=0
        compgen -G "$CORPUS/*.bin" > /dev/null \
          && echo "  compress the token files: xz -T0 $CORPUS/*.bin (the sitting decompresses them)"
      fi
      for d in .corpus .mini; do git check-ignore -q "$d/" || { echo "$d must be git-ignored"; ok=0; }; done  # "/": a folder, there or not
      pending=$(pending_runs) || ok=0
      if [ -f "$RESULTS/gate.json" ]; then
        [ "$ok" -eq 1 ] && echo "$RESULTS: $(tail -n 1 <<< "$pending")"
      else
        echo "$RESULTS: no results yet; the first sitting runs the suite from its first run"
      fi
      read -ra todo <<< "$(head -n 1 <<< "$pending")"
      [ "$ok" -eq 1 ] && [ ${#todo[@]} -gt 0 ] && echo "the next sitting runs (MAX_RUNS=$MAX_RUNS): ${todo[*]:0:$MAX_RUNS}"
      if [ "$ok" -eq 1 ] && [ ${#todo[@]} -gt 0 ] && [ "${SMOKE:-1}" != 0 ]; then
        t_smoke=$(date +%s)
        if smoke "${todo[@]:0:$MAX_RUNS}"; then
          echo "the sitting's commands ran those runs on this CPU, at a tiny size ($(( $(date +%s) - t_smoke )) s)"
        else
          echo "the sitting's commands failed on this CPU with the code that runs there (.mini/smoke.log)"; ok=0
        fi
      fi
      if [ -n "$SAME_CODE_AS" ]; then  # this code must be the one the other folder was run with
        $PY - "$SAME_CODE_AS" <<'EOF' || ok=0
import json
import sys
from pathlib import Path

from kinterval.suite.runner import check_code
from kinterval.train.checkpoint import ops_sha256

folder = Path(sys.argv[1])
try:
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["code"]["ops_sha256"]
except (OSError, ValueError, KeyError, TypeError) as err:
    sys.exit(f"not ready: SAME_CODE_AS={folder}: no manifest code to compare with ({err!r})")
try:
    check_code(folder, manifest)  # the runner's own check: the code a folder was run with, or a ValueError
except ValueError as err:
    sys.exit(f"not ready: SAME_CODE_AS={folder}: {err}")
ours = ops_sha256()
print(f"same operator code as {folder} (ops_sha256 {ours[:12]})")
EOF
      fi
      # the preflight's tests must import the code the sitting runs: a pin's operator code can predate what
      # this checkout's tests import, and then the preflight tests nothing (collected here on the CPU)
      tests=${PREFLIGHT_TESTS:-$ROOT_TESTS/ops/test_triton.py}
      if ! $PY -m pytest --collect-only -q -p no:cacheprovider -p no:xdist "$tests" -k "$PREFLIGHT_K" \
        > .mini/collect.log 2>&1; then
        grep -E "Error|error" .mini/collect.log | tail -n 3
        echo "the preflight's tests ($tests) do not collect against the code the sitting runs (.mini/collect.log)"
        [ -n "${PIN:-}" ] && echo "  give the pin the kernel tests of a commit that ran against its operator code:" \
          "git -C $PIN sparse-checkout add tests/ops && git -C $PIN checkout COMMIT -- tests/ops tests/conftest.py"
        ok=0
      fi
      env_vars="${PIN:+PIN=$PIN }${PREFLIGHT_TESTS:+PREFLIGHT_TESTS=$PREFLIGHT_TESTS }"
      [ "$SUITE_NAME" = mini ] || env_vars+="SUITE_NAME=$SUITE_NAME "
      # pinned: the time the sitting leaves tests this checkout's kernels (the `kernels` stage), which the
      # preflight beside the runs does not (it tests the pinned code the runs use)
      [ "$ok" -eq 1 ] && echo "ready: run '${env_vars}bash benchmarks/gpu_mini.sh sitting${PIN:+ kernels}' with carry [.corpus${PIN:+, $PIN}]" \
        || { echo "not ready"; exit 2; } ;;
    env)
      {
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        $PY -c "import torch, triton; from kinterval.train.checkpoint import code_identity as c
print('torch', torch.__version__, 'triton', triton.__version__); print('code', c())"
        echo "SUITE_NAME=$SUITE_NAME PER_GPU=$PER_GPU MAX_RUNS=$MAX_RUNS DEADLINE_S=${DEADLINE_S:-545} PREFLIGHT_S=${PREFLIGHT_S:-150}" \
          "PIN=${PIN:-} PREFLIGHT_TESTS=${PREFLIGHT_TESTS:-}" \
          "KINTERVAL_TRITON_AUTOTUNE=${KINTERVAL_TRITON_AUTOTUNE:-} KINTERVAL_DETERMINISTIC=${KINTERVAL_DETERMINISTIC:-}"
      } 2>&1 | tee "$OUT/env.txt" ;;
    kernels)
      left=$(( ${CALL_S:-575} - $(elapsed) - 25 ))  # 25 s: pytest's SIGINT grace and the call's own end
      limit=${KERNELS_LIMIT:-$(( left < 360 ? left : 360 ))}
      if [ "$limit" -lt 60 ]; then echo "kernels: ${limit} s left in this call, too few; not run"; continue; fi
      echo "[$(elapsed) s] kernel tests, at most $limit s: -k \"${KERNELS_K:-$PREFLIGHT_K}\""
      PYTHONPATH=$PWD/src preflight "$limit" "$OUT/kernels.txt" "${KERNELS_K:-$PREFLIGHT_K}" "$KERNELS_TESTS"; rc=$?
      cat "$OUT/kernels.txt"
      [ "$rc" -eq 0 ] || { echo "kernel preflight failed"; exit 1; } ;;
    sitting)
      deadline=$(( T_START + ${DEADLINE_S:-545} ))
      # each kernel's default tile: autotuning compiles and times every candidate in every run's process,
      # minutes of a sitting (set KINTERVAL_TRITON_AUTOTUNE=1 to autotune all the same)
      export KINTERVAL_TRITON_AUTOTUNE=${KINTERVAL_TRITON_AUTOTUNE:-0}
      bash "$0" env > /dev/null &  # beside the rest
      PREFLIGHT_WORKERS=${PREFLIGHT_WORKERS:-8} preflight "${PREFLIGHT_S:-150}" "$OUT/preflight.txt" &
      pre=$!
      if [ ! -f "$SUITE/data/meta.json" ]; then  # inside the suite folder: the manifest records it as "data"
        { corpus unpack && kinterval data prepare --source "bin:$CORPUS" --out "$SUITE/data"; } > .mini/prepare.log 2>&1
        st=$?
        corpus clean
        [ "$st" -eq 0 ] || { tail -n 5 .mini/prepare.log; kill "$pre"; exit 2; }
      fi
      skip=()
      [ -f "$RESULTS/gate.json" ] && skip=(--skip-gated "$RESULTS")
      # one wave: the first MAX_RUNS runs still to run (none left: the runner says "nothing to run")
      only=()
      pending=$(pending_runs) || { kill "$pre"; exit 2; }
      read -ra todo <<< "$(head -n 1 <<< "$pending")"
      [ ${#todo[@]} -gt 0 ] && only=(--only "${todo[@]:0:$MAX_RUNS}")
      # its own session and process group (Python's setsid: no util-linux needed), so that the deadline stops
      # the runner and every run it started with one signal to the group
      $PY -c 'import os, sys; os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])' \
        $PY -m kinterval suite run "$SUITE_NAME" --out "$SUITE" --data "$SUITE/data" --gpus 1 \
        --per-gpu "$PER_GPU" "${skip[@]}" "${only[@]}" > "$LOG" 2>&1 < /dev/null &
      suite=$!
      # until its setsid, the runner has no process group of its own: the group kill below would miss it
      for _ in $(seq 100); do kill -0 -- -"$suite" 2>/dev/null || ! kill -0 "$suite" 2>/dev/null && break; sleep 0.1; done
      echo "[$(elapsed) s] suite started (--per-gpu $PER_GPU${skip[*]:+, ${skip[*]}}${only[*]:+, ${only[*]}}), deadline at ${DEADLINE_S:-545} s"
      # A failed preflight does not stop the suite: which test failed (a tolerance on an operator the suite
      # does not train, or a kernel the suite uses) is for the one who merges to judge; the sitting's results
      # come back marked (PREFLIGHT_FAILED.txt) and the call exits with 3.
      preflight_ok=""
      preflight_done() {  # the preflight's exit status, once, into preflight_ok
        if wait "$pre"; then preflight_ok=1; echo "[$(elapsed) s] kernel preflight passed"
        else
          preflight_ok=0; echo "[$(elapsed) s] kernel preflight FAILED (the suite goes on)"
          echo "KERNEL PREFLIGHT FAILED (preflight.txt): merge these results only if no failing test touches" \
            "an operator or numerics mode the suite uses" > "$OUT/PREFLIGHT_FAILED.txt"
        fi
        pre=""
      }
      # Each run that finishes is signed off and packed at once, replacing the last tarball (a rename in
      # $OUT), so that a call cut short by the machine's own limit still brings back every finished run.
      packed=0 tried=0
      pack() {  # FORCE=1: try again even if no run finished since the last try (the last call)
        local n
        n=$(grep -c ": completed$" "$LOG")
        { cat "$LOG"; [ -s .mini/guard.log ] && cat .mini/guard.log; } > "$OUT/sitting.log"
        [ "$n" -gt "$packed" ] || return 0
        # a failed gate or merge is tried again when another run finishes, not every 2 s beside the training
        [ "$n" -gt "$tried" ] || [ -n "${FORCE:-}" ] || return 0
        tried=$n
        timeout 120 $PY -m kinterval suite gate "$SUITE" --partial > .mini/gate.txt 2>&1
        rm -rf .mini/results && mkdir -p .mini/results
        merged=0
        kinterval suite merge "$SUITE" ".mini/results/$SUITE_ID" >> .mini/gate.txt 2>&1 || merged=$?
        tail -n 25 .mini/gate.txt > "$OUT/gate.txt"  # before the tarball: a call cut after it brings both
        if [ "$merged" -eq 0 ]; then
          tar -czf "$OUT/${SUITE_ID}_results.tar.gz.tmp" -C .mini/results "$SUITE_ID" \
            && mv "$OUT/${SUITE_ID}_results.tar.gz.tmp" "$OUT/${SUITE_ID}_results.tar.gz" && packed=$n
          echo "[$(elapsed) s] packed: $(grep -m1 "^merged" .mini/gate.txt)"
        fi
      }
      rm -f .mini/guard.json .mini/guard.log
      guard_at=$(( T_START + ${GUARD_FROM:-60} ))
      while kill -0 "$suite" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do  # the runner waits for its runs
        if [ -n "$pre" ] && ! kill -0 "$pre" 2>/dev/null; then preflight_done; fi
        pack
        if [ "${GUARD:-1}" != 0 ] && [ "$(date +%s)" -ge "$guard_at" ]; then
          wave_guard "$deadline" 2>&1 | tee -a .mini/guard.log
          guard_at=$(( $(date +%s) + ${GUARD_EVERY:-15} ))
        fi
        sleep 2
      done
      if kill -0 -- -"$suite" 2>/dev/null; then  # bash's own kill: no procps needed either
        echo "[$(elapsed) s] deadline: stopping the suite"
        kill -TERM -- -"$suite"
        for _ in $(seq 20); do kill -0 -- -"$suite" 2>/dev/null || break; sleep 0.5; done
        kill -KILL -- -"$suite" 2>/dev/null
      fi
      if [ -n "$pre" ]; then preflight_done; fi
      FORCE=1 pack
      # the runs that did not come back (cut at the deadline, failed; a run stopped by a non-finite loss is
      # signed off and merged): their status, metrics and log (a failed run's traceback), small, as
      # evidence; never merged
      unfinished=()
      declare -A seen=()
      for d in "$SUITE"/runs/*/ "$SUITE"/logs/*.log; do  # a run started has a log, maybe no folder yet
        [ -e "$d" ] || continue
        r=$(basename "$d" .log)
        [ -z "${seen[$r]:-}" ] && [ ! -d ".mini/results/$SUITE_ID/runs/$r" ] || continue
        seen[$r]=1
        for f in "runs/$r/status.json" "runs/$r/metrics.jsonl" "logs/$r.log"; do
          [ -f "$SUITE/$f" ] && unfinished+=("$f")
        done
      done
      if [ ${#unfinished[@]} -gt 0 ]; then
        tar -czf "$OUT/unfinished.tar.gz" -C "$SUITE" "${unfinished[@]}"
        echo "unfinished.tar.gz: status, metrics and logs of the runs that did not finish"
      fi
      cat "$OUT/preflight.txt"
      tail -n 15 "$LOG" | cut -c1-240
      if grep -q "^nothing to run" "$LOG"; then
        echo "nothing to run: $RESULTS signs off every run of the suite"; continue
      fi
      [ -f "$OUT/gate.txt" ] && cat "$OUT/gate.txt"  # none when no run finished
      if [ "$packed" -eq 0 ]; then
        echo "no run finished and passed the gate before the deadline: nothing to bring back"; exit 1
      fi
      echo "${SUITE_ID}_results.tar.gz: $packed runs, $(stat -c %s "$OUT/${SUITE_ID}_results.tar.gz") bytes"
      # the stages after it still run (`kernels` tests this checkout's code, not the pinned one); exit 3 at the end
      if [ "$preflight_ok" = 0 ]; then cat "$OUT/PREFLIGHT_FAILED.txt"; final_rc=3; fi ;;
    measure)  # tokens/s of N concurrent training processes of the mini model (bf16 autocast, auto backend);
      # four rounds of at most 130 s each: within one 600 s call
      for n in 1 2 3 4; do
        for i in $(seq "$n"); do
          timeout 130 $PY benchmarks/train_throughput.py --model small --block-size 256 --micro-batch 64 \
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
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
  echo "[$stage] $(( $(date +%s) - t0 )) s"
done
exit "${final_rc:-0}"
