"""``benchmarks/gpu_mini.sh``, the one device call of a suite sitting, run here on the CPU with a tiny suite:
a script error found on a lent GPU costs that session's only call. ``check`` says what is left to run,
``sitting`` brings back the runs that finished (and only those) as a tarball that ``suite merge`` takes,
stops the suite at its deadline, marks what it brings back after a failed kernel preflight, and has nothing to
do once the results folder signs off every run."""

from __future__ import annotations

import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

from kinterval.cli import main
from kinterval.data.prepare import prepare
from kinterval.suite.gate import gate
from kinterval.suite.merge import merge
from kinterval.suite.runner import run_suite
from kinterval.train.checkpoint import ops_sha256

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("bash", "git", "pgrep", "tar")),
    reason="needs bash, git, pgrep and tar",
)

SUITE = """
name = "{name}"
protocol = "tiny-cpu"
corpus = "random GPT-2 ids"
seeds = [5]
checkpoints = 1
[overrides]
"model.n_layer" = 1
"model.n_head" = 1
"model.n_embd" = 16
"model.block_size" = 32
"schedule.tokens" = 1_024
"schedule.warmup_tokens" = 256
"schedule.micro_batch" = 8
[eval]
split = "val"
geometry = true
geometry_blocks = 1
"""
QUICK = """
[[group]]
name = "quick"
operators = ["softmax"]
"""
PAIR = """
[[group]]
name = "pair"
operators = ["softmax", "lerp-k4"]
overrides = {"schedule.tokens" = 4_096}  # training long enough for the wave guard to look
"""
SEEDS = """
[[group]]
name = "seeds"
operators = ["softmax"]
seeds = [5, 6]
"""
LONG = """
[[group]]
name = "long"
operators = ["lerp-k4"]
overrides = {"schedule.tokens" = 100_000_000}
"""


@pytest.fixture
def checkout(tmp_path):
    """A checkout as the device machine gets it: the script, the code, a git-ignored corpus."""
    root = tmp_path / "repo"
    (root / "benchmarks").mkdir(parents=True)
    shutil.copy2(REPO / "benchmarks" / "gpu_mini.sh", root / "benchmarks")
    (root / "src").symlink_to(REPO / "src")
    (root / ".gitignore").write_text("/.corpus/\n/.mini/\n/out/\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    rng = np.random.default_rng(0)
    (root / ".corpus" / "docs").mkdir(parents=True)
    (root / "raw").mkdir()  # the plain token files, to compare with
    for split, n in (("train", 20_000), ("val", 2_000), ("test", 2_000)):
        rng.integers(0, 50256, n, dtype=np.uint16).tofile(root / "raw" / f"docs.{split}.bin")
        shutil.copy2(root / "raw" / f"docs.{split}.bin", root / ".corpus" / "docs")
    # the train split travels xz-compressed, as the script's header tells (val and test stay plain)
    _xz(root / ".corpus" / "docs" / "docs.train.bin")
    (root / "pre").mkdir()
    (root / "pre" / "test_ok.py").write_text("def test_ok():\n    pass\n")
    (root / "pre" / "test_bad.py").write_text("def test_bad():\n    assert False\n")
    suites = {"quick": QUICK, "cut": QUICK + LONG, "long": LONG, "pair": PAIR, "seeds": SEEDS}
    for name, groups in suites.items():
        (root / f"{name}.toml").write_text(SUITE.format(name=name) + groups)
    return root


def _xz(path: Path) -> Path:
    """``xz FILE``: FILE.xz in its place."""
    packed = path.with_name(path.name + ".xz")
    packed.write_bytes(lzma.compress(path.read_bytes()))
    path.unlink()
    return packed


def _env(root, suite, *, out="out", deadline=300, preflight="test_ok.py", per_gpu=2, extra=None):
    env = dict(
        os.environ,
        PY=sys.executable,
        OUT=str(root / out),
        SUITE_NAME=str(root / f"{suite}.toml"),
        RESULTS=str(root / "results" / suite),
        DEADLINE_S=str(deadline),
        PREFLIGHT_S="60",
        PREFLIGHT_TESTS=str(root / "pre" / preflight),
        PREFLIGHT_K="test_",
        PREFLIGHT_WORKERS="0",  # one process: xdist's default 8 workers would crowd this machine's cores
        OMP_NUM_THREADS="1",
        PER_GPU=str(per_gpu),
        SMOKE="0",  # check's CPU run of the sitting's commands: its own tests below turn it on
    )
    return {**env, **(extra or {})}


def _script(root, stage, suite, **kw):
    t0 = time.monotonic()
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_mini.sh", stage],
        cwd=root,
        env=_env(root, suite, **kw),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0


def _unpack_and_merge(root, suite, out="out"):
    tarball = root / out / f"{suite}_results.tar.gz"
    with tarfile.open(tarball) as tar:
        tar.extractall(root / "unpacked" / out, filter="data")
    assert main(["suite", "merge", str(root / "unpacked" / out / suite), str(root / "results" / suite)]) == 0


def _cwd(pid: str) -> Path:
    """The working directory of a process (the root for one gone or not ours to read)."""
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return Path("/")


def _runs_of(checkout: Path, out: str) -> list[str]:
    """The pids of the suite's training runs writing to ``out`` from this checkout, not another clone's (two
    test suites on one machine run the same suite names)."""
    found = subprocess.run(["pgrep", "-f", "--", f"--out {out}"], capture_output=True, text=True).stdout
    return [pid for pid in found.split() if _cwd(pid).is_relative_to(checkout.resolve())]


def test_the_deadline_stops_the_suite_and_a_failed_preflight_is_marked(checkout):
    # the deadline leaves the run time to start (the corpus is prepared first: a few seconds here)
    rc, log, seconds = _script(checkout, "sitting", "long", deadline=30, preflight="test_bad.py")
    # nothing finished before the deadline: nothing comes back, and the call says so (exit code 1)
    assert rc == 1 and "deadline: stopping the suite" in log and "nothing to bring back" in log, log
    assert seconds < 30 + 120, log  # the 100M-token run would take hours
    left = _runs_of(checkout, ".mini/long")
    assert left == [], f"a run of the suite outlived the deadline: {left}"
    # a failed preflight does not stop the suite; it is marked at once, beside the results
    assert "kernel preflight FAILED (the suite goes on)" in log, log
    assert (
        "KERNEL PREFLIGHT FAILED (preflight.txt)" in (checkout / "out" / "PREFLIGHT_FAILED.txt").read_text()
    )
    assert "1 failed" in (checkout / "out" / "preflight.txt").read_text()
    assert not (checkout / "out" / "long_results.tar.gz").exists()
    # the cut run comes back as evidence only: its log (and status and metrics, once written)
    if "lerp-k4-s5: started" in log:  # else the deadline came first on a slow machine: nothing to show
        with tarfile.open(checkout / "out" / "unfinished.tar.gz") as tar:
            names = tar.getnames()
        assert "logs/lerp-k4-s5.log" in names and set(names) <= {
            "logs/lerp-k4-s5.log",
            "runs/lerp-k4-s5/status.json",
            "runs/lerp-k4-s5/metrics.jsonl",
        }, names
    else:
        assert not (checkout / "out" / "unfinished.tar.gz").exists()


def test_a_call_cut_short_by_the_machine_still_brings_back_every_finished_run(checkout):
    """The device tool kills a command at its limit (less than 600 s when the machine's start took long):
    each run was signed off and packed as it finished. One run at a time: the quick run (first in the suite)
    finishes, the long one is cut."""
    tarball = checkout / "out" / "cut_results.tar.gz"
    # both start; the quick run packs in about 30 s alone, but several minutes beside a full test suite on 2
    # cores: the deadline and the wait leave it that much room (the long run never ends by itself)
    env = _env(checkout, "cut", deadline=600, per_gpu=1, extra={"MAX_RUNS": "2"})
    proc = subprocess.Popen(["bash", "benchmarks/gpu_mini.sh", "sitting"], cwd=checkout, env=env)
    t0 = time.monotonic()
    while not tarball.exists() and proc.poll() is None and time.monotonic() - t0 < 540:
        time.sleep(0.5)
    assert tarball.exists(), f"no run packed in {time.monotonic() - t0:.0f} s (script rc {proc.poll()})"
    proc.kill()  # the machine's limit, right after the first run was packed
    proc.wait()
    for pid in _runs_of(checkout, ".mini/cut"):  # what the machine's end does (this clone's runs only)
        subprocess.run(["kill", pid], check=False)
    back = sorted(p.name for p in (checkout / "out").iterdir())
    # what a device call brings back: at most 8 plain files, names of letters, digits, '.', '_' and '-'
    assert back == ["cut_results.tar.gz", "env.txt", "gate.txt", "preflight.txt", "sitting.log"], back
    with tarfile.open(checkout / "out" / "cut_results.tar.gz") as tar:
        names = tar.getnames()
    assert {Path(n).parts[2] for n in names if "/runs/" in n} == {"softmax-s5"}
    assert not [n for n in names if "checkpoints" in n or "/data/" in n]
    assert (
        "1 runs, 1 jobs, 0 errors; partial: 1 of 2 runs not run"
        in (checkout / "out" / "gate.txt").read_text()
    )
    _unpack_and_merge(checkout, "cut")
    assert gate(checkout / "results" / "cut", results_only=True).not_run == ["lerp-k4-s5"]
    rc, log, _ = _script(checkout, "check", "cut")
    assert rc == 0 and "1 runs signed off; to run (1): lerp-k4-s5" in log, log


def test_a_sitting_starts_one_wave_of_runs(checkout):
    """A run started after the first wave would be cut at the deadline and lost, holding the machine for
    nothing: a sitting starts the first MAX_RUNS (default PER_GPU) of the runs still to run, and ends when
    they do; the next sitting takes the rest. ``sitting kernels`` with a failing preflight: the results come
    back marked, the kernel tests after the sitting still run (they test other code than the pinned
    preflight did), and the call exits with 3."""
    rc, log, _ = _script(checkout, "check", "pair", per_gpu=1)
    assert rc == 0 and "the next sitting runs (MAX_RUNS=1): softmax-s5" in log, log
    guard = {"GUARD_FROM": "0", "GUARD_EVERY": "1", "GUARD_SPAN": "1"}  # the wave guard looks every second
    env = _env(
        checkout,
        "pair",
        per_gpu=1,
        preflight="test_bad.py",
        extra={**guard, "KERNELS_TESTS": str(checkout / "pre" / "test_ok.py")},
    )
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_mini.sh", "sitting", "kernels"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 3 and "kernel preflight FAILED" in log, log
    assert "1 passed" in (checkout / "out" / "kernels.txt").read_text(), log
    assert "--only softmax-s5" in log and "deadline: stopping" not in log, log
    sitting = (checkout / "out" / "sitting.log").read_text()
    assert "suite pair: 1 of 2 runs" in sitting and "lerp-k4-s5" not in sitting, sitting
    # it looked (its state holds the run's steps) and stopped nothing: one run is never stopped
    assert "softmax-s5" in json.loads((checkout / ".mini" / "guard.json").read_text())["samples"], log
    assert "Traceback" not in sitting and "wave guard: stopped" not in sitting, sitting
    assert not (checkout / "out" / "unfinished.tar.gz").exists()
    # the sitting decompressed the train split beside itself (and removed it after `data prepare`): the data
    # it prepared are the plain files' data, under the same source label and file names
    assert sorted(p.name for p in (checkout / ".corpus" / "docs").iterdir()) == [
        "docs.test.bin",
        "docs.train.bin.xz",
        "docs.val.bin",
    ]
    prepare(f"bin:{checkout / 'raw'}", checkout / "plain", progress=False)
    ours, plain = (
        json.loads((d / "meta.json").read_text()) for d in (checkout / ".mini/pair/data", checkout / "plain")
    )
    assert ours["source"] == "bin:.corpus/docs" and ours["splits"] == plain["splits"], (ours, plain)
    assert ours["params"]["files"]["train"] == [".corpus/docs/docs.train.bin"], ours["params"]
    _unpack_and_merge(checkout, "pair")
    rc, log, _ = _script(checkout, "check", "pair", per_gpu=1)
    assert rc == 0 and "1 runs signed off; to run (1): lerp-k4-s5" in log, log
    assert "the next sitting runs (MAX_RUNS=1): lerp-k4-s5" in log, log


def _wave_guard(root, deadline, t_start, after=100):
    """One look of the sitting's wave guard (its function, sourced from the script) at the suite .mini/g."""
    env = dict(
        os.environ, PY=sys.executable, LOG=".mini/g.log", SUITE=".mini/g", T_START=str(t_start),
        AFTER_S=str(after), GUARD_SPAN="30",
    )  # fmt: skip
    source = "source <(sed -n '/^wave_guard() {/,/^}/p' benchmarks/gpu_mini.sh) && wave_guard \"$1\""
    proc = subprocess.run(
        ["bash", "-c", source, "guard", str(deadline)], cwd=root, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_the_wave_guard_reads_a_short_log_from_its_first_row(checkout):
    """The guard reads the last 8 KiB of a run's metrics log and drops the first line there, which the seek
    may have cut; a shorter log is read from its start, and its first row counts."""
    run = checkout / ".mini" / "g" / "runs" / "a-s1"
    run.mkdir(parents=True)
    (run / "run_config.json").write_text(json.dumps({"plan": {"steps": 10}}))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "tokens": 256}) + "\n")
    (checkout / ".mini" / "g.log").write_text("a-s1: started on GPU 0 (log x)\n")
    _wave_guard(checkout, time.time() + 1000, time.time())
    samples = json.loads((checkout / ".mini" / "guard.json").read_text())["samples"]
    assert [step for _, step in samples["a-s1"]] == [1], samples


def test_the_wave_guard_stops_the_run_with_the_most_training_left(checkout):
    """A slower GPU than the one that sized the wave: the runs would all be cut at the deadline. The guard
    times each run still training over the last 30 s (or more) of its logged steps; when even the best case
    (the GPU shared, each run that ends speeding up the others) ends after the deadline, with AFTER_S for
    the evaluations, it stops the run with the most training left; never a run that is evaluating, never
    the last one training."""
    suite = checkout / ".mini" / "g"
    now = time.time()
    t_start = now - 100
    # run: (its step now, its step 40 s ago), of 1000 steps: 2 steps a second
    runs = {"a-s1": (100, 20), "b-s1": (500, 420), "c-s1": (1000, 990)}  # c: training done, evaluating
    procs = {}
    for rid, (step, _) in runs.items():
        (suite / "runs" / rid).mkdir(parents=True)
        (suite / "runs" / rid / "run_config.json").write_text(json.dumps({"plan": {"steps": 1000}}))
        rows = [{"step": i, "tokens": 256 * i} for i in range(max(1, step - 300), step + 1)]
        rows.append({"event": "validation", "step": step, "val_loss": 5.0})
        (suite / "runs" / rid / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        # a stand-in for the run's `suite run-one` process: its command line ends as the runner's does
        code = "import time; time.sleep(120)"
        cmd = [sys.executable, "-c", code, "-m", "kinterval", "suite", "run-one", "--out", ".mini/g", rid]
        procs[rid] = subprocess.Popen(cmd, cwd=checkout)
    try:
        log = "".join(f"{rid}: started on GPU 0 (log x)\n" for rid in runs)
        (checkout / ".mini" / "g.log").write_text(log)
        samples = {rid: [[now - 40, before]] for rid, (_, before) in runs.items()}
        state = {"samples": samples, "since": 0, "said": 0}
        (checkout / ".mini" / "guard.json").write_text(json.dumps(state))
        # a has 450 s of training left at its pace, b 250, with three runs on the GPU: at best the wave ends
        # 700 / 3 + 100 s from now, 433 s after the start. Before a deadline at 500 s nothing is stopped
        # (though a would end at 650 s at this pace: once b and c end, it speeds up)
        out = _wave_guard(checkout, now + 400, t_start)
        assert "the wave ends at ~4" in out and "(deadline 500 s)" in out and "stopped" not in out, out
        (checkout / ".mini" / "guard.json").write_text(json.dumps(state))
        # past a deadline at 400 s: the first look says so, the second one stops a
        out = _wave_guard(checkout, now + 300, t_start)
        said = r"pace: b-s1 2[56]\d s, a-s1 4[56]\d s; 3 runs on the GPU: the wave ends at ~4[34]\d s at best"
        assert re.search(said + r" \(deadline 400 s\); past it: the next look decides", out), out
        assert "stopped" not in out and procs["a-s1"].poll() is None, out
        out = _wave_guard(checkout, now + 300, t_start)
        assert re.search(said + r" \(deadline 400 s\)\n", out) and "wave guard: stopped a-s1" in out, out
        assert procs["a-s1"].wait(timeout=10) == -15, out
        assert procs["b-s1"].poll() is None and procs["c-s1"].poll() is None, out
        # the pace changes once a run is stopped: the next look times the others afresh and stops nothing
        (checkout / ".mini" / "g.log").write_text(log + "a-s1: failed (exit -15)\n")
        out = _wave_guard(checkout, now + 10, t_start)
        assert out == "" and procs["b-s1"].poll() is None, out
        # the samples from before the stop are gone: the stop's and this look's are left
        kept = json.loads((checkout / ".mini" / "guard.json").read_text())["samples"]["b-s1"]
        assert len(kept) == 2, kept
        # one run left training (and one evaluating): never stopped, however late
        (checkout / ".mini" / "guard.json").write_text(json.dumps(state))
        out = _wave_guard(checkout, now + 10, t_start)
        assert re.search(r"pace: b-s1 2[56]\d s; 2 runs on the GPU", out) and "stopped" not in out, out
        # with two still training, the late one goes, whatever the order they started in
        (checkout / ".mini" / "g.log").write_text("b-s1: started on GPU 0\nc-s1: started on GPU 0\n")
        (suite / "runs" / "c-s1" / "run_config.json").write_text(json.dumps({"plan": {"steps": 5000}}))
        # (two late looks in a row: a look in time in between starts the count again)
        for deadline, stops in ((2000, False), (1e6, False), (2000, False), (2000, True)):
            out = _wave_guard(checkout, now + deadline, t_start)
            assert ("wave guard: stopped c-s1" in out) == stops, (deadline, out)
        assert procs["c-s1"].wait(timeout=10) == -15, out
        assert procs["b-s1"].poll() is None
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_kernel_tests_take_their_own_selection_and_what_is_left_of_the_call(checkout):
    """``sitting kernels`` in one call: the kernel tests after the sitting select with KERNELS_K (the
    sitting's preflight keeps PREFLIGHT_K) and run for what is left of CALL_S, or not at all when too little
    is."""
    extra = {"KERNELS_K": "test_ok", "PREFLIGHT_K": "test_bad"}
    rc, log, _ = _script(checkout, "kernels", "quick", preflight="", extra=extra)  # both test files
    assert rc == 0 and 'at most 360 s: -k "test_ok"' in log and "1 passed" in log, log
    rc, log, _ = _script(checkout, "kernels", "quick", preflight="", extra={**extra, "CALL_S": "80"})
    left = re.search(r"kernels: (\d+) s left in this call, too few; not run", log)  # 80 - 25 - elapsed
    assert rc == 0 and left and 0 <= 80 - 25 - int(left[1]) < 30, log
    # they test this checkout's code, not the pinned code the sitting before them ran
    (checkout / "pinned" / "src" / "kinterval").mkdir(parents=True)
    (checkout / "pinned" / "src" / "kinterval" / "__init__.py").write_text("raise ImportError('pinned')\n")
    (checkout / "pre" / "test_code.py").write_text("def test_code():\n    import kinterval.ops  # noqa\n")
    pinned = {**extra, "PIN": "pinned", "KERNELS_K": "test_code", "KERNELS_TESTS": str(checkout / "pre")}
    rc, log, _ = _script(checkout, "kernels", "quick", preflight="", extra=pinned)
    assert rc == 0 and "1 passed" in log, log


def test_check_prints_the_pinned_command_with_the_kernel_tests_after_the_sitting(checkout):
    """With PIN the sitting's preflight tests the pinned code its runs use; the time the sitting leaves tests
    this checkout's kernels, so the printed command is ``sitting kernels``."""
    (checkout / "pin").mkdir()
    (checkout / "pin" / "src").symlink_to(REPO / "src")
    # the smoke (check's CPU run of the sitting's commands) runs one operator at two seeds
    rc, log, _ = _script(checkout, "check", "seeds", extra={"PIN": "pin", "SMOKE": "1"})
    assert rc == 0 and "bash benchmarks/gpu_mini.sh sitting kernels' with carry [.corpus, pin]" in log, log
    assert "the next sitting runs (MAX_RUNS=2): softmax-s5 softmax-s6" in log, log
    assert "the sitting's commands ran those runs on this CPU, at a tiny size" in log, log
    rc, log, _ = _script(checkout, "check", "quick")
    assert rc == 0 and "bash benchmarks/gpu_mini.sh sitting' with carry [.corpus]" in log, log


def test_check_refuses_a_pin_whose_code_breaks_the_sitting_s_commands(checkout):
    """A pin mixes an older commit's operator code with this checkout's other code: when that code imports
    something the pinned ops lack, the command line does not even start. check runs the sitting's commands
    on the CPU with the code the sitting runs, so that this shows here, not in the device call."""
    shutil.copytree(REPO / "src", checkout / "pin" / "src", ignore=shutil.ignore_patterns("__pycache__"))
    broken = checkout / "pin" / "src" / "kinterval" / "arglists.py"  # what the CLI's modules import
    broken.write_text("raise ImportError('not in the pin')\n")
    rc, log, _ = _script(checkout, "check", "quick", extra={"PIN": "pin", "SMOKE": "1"})
    assert rc == 2 and "ImportError: not in the pin" in log and "not ready" in log, log
    assert "the sitting's commands failed on this CPU" in log, log
    assert "ImportError: not in the pin" in (checkout / ".mini" / "smoke.log").read_text()


def test_check_refuses_preflight_tests_that_do_not_import_the_pinned_code(checkout):
    """A pin's operator code can predate what this checkout's kernel tests import: then the preflight would
    only report a collection error and test nothing on the GPU. check collects the preflight's tests against
    the code the sitting runs, and is not ready until they import it."""
    (checkout / "pin").mkdir()
    (checkout / "pin" / "src").symlink_to(REPO / "src")
    (checkout / "pre" / "test_newer.py").write_text("from kinterval.ops import not_in_the_pin  # noqa\n")
    rc, log, _ = _script(checkout, "check", "quick", preflight="test_newer.py", extra={"PIN": "pin"})
    assert rc == 2 and "do not collect against the code the sitting runs" in log and "not ready" in log, log
    assert "git -C pin sparse-checkout add tests/ops" in log, log
    assert "not_in_the_pin" in (checkout / ".mini" / "collect.log").read_text()
    rc, log, _ = _script(checkout, "check", "quick", preflight="test_ok.py", extra={"PIN": "pin"})
    assert rc == 0 and "ready: run 'PIN=pin PREFLIGHT_TESTS=" in log, log


def test_check_smoke_runs_the_merge_too(checkout):
    """The smoke runs every command of the sitting through to the merge: a pin whose merge alone fails (data
    prepare, the suite and the gate all pass) is not ready."""
    shutil.copytree(REPO / "src", checkout / "pin" / "src", ignore=shutil.ignore_patterns("__pycache__"))
    broken = checkout / "pin" / "src" / "kinterval" / "suite" / "merge.py"
    broken.write_text(
        broken.read_text() + "\n\ndef merge(src, dst):\n    raise ValueError('merge broken in the pin')\n"
    )
    rc, log, _ = _script(checkout, "check", "quick", extra={"PIN": "pin", "SMOKE": "1"})
    assert rc == 2 and "not ready" in log and "the sitting's commands failed on this CPU" in log, log
    assert "merge broken in the pin" in (checkout / ".mini" / "smoke.log").read_text()


def test_nothing_to_do_once_the_results_folder_signs_off_every_run(checkout):
    suite, res = checkout / "quick.toml", checkout / "results" / "quick"
    rc, log, _ = _script(checkout, "check", "quick")
    assert rc == 0 and "no results yet" in log and "ready" in log, log
    prepare(f"bin:{checkout / 'raw'}", checkout / "here" / "data", progress=False)
    run_suite(suite, checkout / "here", data=checkout / "here" / "data", threads=1, log=lambda *_: None)
    assert gate(checkout / "here", partial=True).ok
    merge(checkout / "here", res)
    rc, log, _ = _script(checkout, "sitting", "quick")
    assert rc == 0 and "nothing to run" in log and "kernel preflight passed" in log, log
    assert not (checkout / "out" / "quick_results.tar.gz").exists()
    assert not (checkout / "out" / "unfinished.tar.gz").exists()


def test_check_refuses_a_results_folder_that_fails_its_gate(checkout, tmp_path):
    results = checkout / "results" / "quick"
    shutil.copytree(REPO / "docs" / "results" / "ci", results)
    manifest = results / "manifest.json"  # the ci suite's results, renamed: its bytes differ from gate.json's
    manifest.write_text(manifest.read_text().replace('"suite": "ci"', '"suite": "quick"', 1))
    rc, log, _ = _script(checkout, "check", "quick")
    assert rc == 2 and "fails the results-only gate" in log and "not ready" in log, log


def test_check_refuses_other_operator_code_than_the_folder_it_pools_with(checkout, tmp_path):
    """mini-seeds' seed intervals pool with mini's runs: its first sitting has no results folder of its own to
    hold it to one code, so SAME_CODE_AS names the folder whose code it must run (mini-seeds: mini)."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "manifest.json").write_text(
        json.dumps({"code": {"ops_sha256": ops_sha256(), "git_commit": "c0"}})
    )
    env = {"SAME_CODE_AS": str(other)}
    rc, log, _ = _script(checkout, "check", "quick", extra=env)
    assert rc == 0 and f"same operator code as {other}" in log, log
    assert f"SUITE_NAME={checkout / 'quick.toml'} bash benchmarks/gpu_mini.sh sitting" in log, log
    (other / "manifest.json").write_text(json.dumps({"code": {"ops_sha256": "f" * 64, "git_commit": "c0"}}))
    rc, log, _ = _script(checkout, "check", "quick", extra=env)
    assert rc == 2 and "other operator code (ops_sha256 ffffffffffff)" in log and "(c0)" in log, log
    assert "not ready" in log
    rc, log, _ = _script(checkout, "check", "quick", extra={"SAME_CODE_AS": str(tmp_path / "none")})
    assert rc == 2 and "no manifest code to compare with" in log, log


def test_check_refuses_a_corpus_the_sitting_could_not_read(checkout):
    """The token files travel xz-compressed and the sitting decompresses them: check decompresses each one
    here first, so that a truncated .xz, one that is not whole uint16 tokens, or a plain file beside its .xz
    (which one would the sitting read?) shows before the call, naming the file."""
    rc, log, _ = _script(checkout, "check", "quick")
    said = "corpus: 2 plain files (0.0 MiB), 1 .xz (0.0 MiB, 0.0 MiB decompressed, intact)"  # train: 40 kB
    assert rc == 0 and said in log and "ready: run" in log, log
    packed = checkout / ".corpus" / "docs" / "docs.train.bin.xz"
    whole = packed.read_bytes()
    packed.write_bytes(whole[: len(whole) // 2])
    rc, log, _ = _script(checkout, "check", "quick")
    assert rc == 2 and "docs.train.bin.xz: EOFError" in log and "not ready" in log, log
    # the other refusals of the same function, sourced from the script (check's refusal path is shown above)
    source = "source <(sed -n '/^corpus() {/,/^}/p' benchmarks/gpu_mini.sh) && corpus check"
    env = dict(os.environ, PY=sys.executable, CORPUS=".corpus/docs")
    for bad, said in (
        (lzma.compress(b"\x01\x02\x03"), "docs.train.bin.xz: 3 bytes decompressed, not whole uint16 tokens"),
        (whole, "docs.train.bin.xz and .corpus/docs/docs.train.bin both: keep one"),
    ):
        packed.write_bytes(bad)
        if bad is whole:
            shutil.copy2(checkout / "raw" / "docs.train.bin", packed.parent)
        proc = subprocess.run(["bash", "-c", source], cwd=checkout, env=env, capture_output=True, text=True)
        assert proc.returncode == 1 and said in proc.stderr, proc.stdout + proc.stderr


def test_check_without_the_corpus_says_so_and_nothing_about_ignoring(checkout):
    """A missing corpus is one line, "copy the token files there"; `.corpus` stays git-ignored (the pattern
    ``/.corpus/`` names a folder, which git tells only for a path written as one when it is absent)."""
    shutil.rmtree(checkout / ".corpus")
    rc, log, _ = _script(checkout, "check", "quick")
    assert rc == 2 and "no .corpus/docs/*.bin or *.bin.xz: copy the token files there" in log, log
    assert "not ready" in log, log
    assert "must be git-ignored" not in log, log
    (checkout / ".gitignore").write_text("/.mini/\n/out/\n")  # teeth: a checkout that does not ignore it
    rc, log, _ = _script(checkout, "check", "quick")
    assert ".corpus must be git-ignored" in log, log


def test_the_owed_pin_still_imports_with_this_checkouts_other_code(tmp_path):
    """The mini-seeds sitting runs the operator code of the committed mini folder's commit beside this
    checkout's other code (docs/results/README.md). A newer module that imports something those ops lack
    stops every command of the sitting (eval/graddiag.py once imported `median` from the ops); check would
    say so only on the day of a lent GPU. Every module the sitting can reach must import with the pin."""
    commit = json.loads((REPO / "docs/results/mini/manifest.json").read_text())["code"]["git_commit"]
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("no git checkout to take the pinned operator code from")
    got = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, "src/kinterval/ops"], capture_output=True, check=False
    )
    if got.returncode != 0:
        pytest.skip(f"commit {commit[:7]} is not in this clone's history: {got.stderr.decode()[:200]}")
    shutil.copytree(REPO / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__", "ops"))
    with tarfile.open(fileobj=__import__("io").BytesIO(got.stdout)) as tar:
        tar.extractall(tmp_path, filter="data")
    walk = (
        "import importlib, pkgutil, kinterval\n"
        "skip = ('.triton', '__main__', 'integrations.hf', 'integrations.minilm_report')  # no sitting's\n"
        "bad = []\n"
        "for m in pkgutil.walk_packages(kinterval.__path__, 'kinterval.'):\n"
        "    if not any(s in m.name for s in skip):\n"
        "        try:\n"
        "            importlib.import_module(m.name)\n"
        "        except Exception as e:\n"
        "            bad.append(f'{m.name}: {e!r}')\n"
        "print('\\n'.join(bad))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src")}
    out = subprocess.run([sys.executable, "-c", walk], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", out.stdout
