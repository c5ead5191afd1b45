"""Mutation runner of the suite audit (NOTES.md). Run from the repository root with the worktree's ``src``
first on PYTHONPATH: ``python benchmarks/results/mutation-suite-2026-12-03f/mutants.py [ID ...]``.

Each mutant replaces one exact string (it must occur exactly once) in one product file, runs its selection
(``pytest -x -q -p no:cacheprovider``), records killed / survived and restores the file byte for byte."""

# ruff: noqa: E501

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

S = "src/kinterval/suite/"
DEF, MAN, GATE, MERGE, RUN = (
    S + f for f in ("definition.py", "manifest.py", "gate.py", "merge.py", "runner.py")
)
T = "tests/suite/"
SEL = {
    DEF: f"{T}test_suite_definition.py {T}test_suite_commands.py",
    MAN: f"{T}test_suite_definition.py {T}test_relocate.py {T}test_stopped_runs.py {T}test_gate.py {T}test_suite_io_failures.py {T}test_sittings.py",
    GATE: f"{T}test_gate.py {T}test_stopped_runs.py {T}test_relocate.py {T}test_sittings.py {T}test_committed_results.py",
    MERGE: f"{T}test_sittings.py {T}test_stopped_runs.py {T}test_suite_io_failures.py {T}test_suite_refusals.py",
    RUN: f"{T}test_suite_refusals.py {T}test_stopped_runs.py {T}test_suite_runner.py {T}test_relocate.py {T}test_sittings.py",
}

MUTANTS = [
    # definition.py
    ("D1", DEF, "if ids.count(x) > 1}", "if ids.count(x) > 2}"),
    (
        "D2",
        DEF,
        '_check_overrides(path, "[overrides]", d["protocol"], flatten(d.get("overrides", {})))',
        "pass",
    ),
    ("D3", DEF, "if fixed := sorted(set(overrides) & RUN_FIELDS):", "if fixed := []:"),
    ("D4", DEF, 'if "K" in g and "{K}" not in template:', "if False:"),
    (
        "D5",
        DEF,
        "_POS_INT = (lambda v: _is_int(v) and v >= 1,",
        "_POS_INT = (lambda v: _is_int(v) and v >= 0,",
    ),
    ("D6", DEF, '_check_fields(path, "[eval]: ", d.get("eval", {}), EVAL_FIELDS)', "pass"),
    (
        "D7",
        DEF,
        "p.fullmatch(r.run_id) or p.fullmatch(r.group) or p.fullmatch(r.operator)",
        "p.fullmatch(r.run_id) or p.fullmatch(r.group)",
    ),
    ("D8", DEF, '"." if c == "?" else', '".*" if c == "?" else'),
    ("D9", DEF, 'if "{" in name:', "if False:"),
    (
        "D10",
        DEF,
        "lambda v: isinstance(v, list) and v and all(map(is_seed, v)),",
        "lambda v: isinstance(v, list) and all(map(is_seed, v)),",
    ),
    (
        "D11",
        DEF,
        'checkpoints=int(g.get("checkpoints", d["checkpoints"])),',
        'checkpoints=int(d["checkpoints"]),',
    ),
    # manifest.py
    ("M1", MAN, "return got.is_absolute() and got.parts", "return got.parts"),
    ("M2", MAN, "got.parts[-len(want.parts) :] == want.parts", "got.parts[-1:] == want.parts[-1:]"),
    (
        "M3",
        MAN,
        '        if _sha256_text(text) != sha:\n            raise ValueError(\n                f"the shipped',
        '        if False:\n            raise ValueError(\n                f"the shipped',
    ),
    ("M4", MAN, 'and Path(name).name == name and "\\\\" not in name', 'and "\\\\" not in name'),
    ("M5", MAN, "if not isinstance(v, kind) or isinstance(v, bool):", "if not isinstance(v, kind):"),
    (
        "M6",
        MAN,
        "return step if isinstance(step, int) and not isinstance(step, bool) and step >= 1 else None",
        "return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None",
    ),
    ("M7", MAN, "[s for s in steps if s < n]", "[s for s in steps if s <= n]"),
    ("M8", MAN, 'code = (previous or {}).get("code") or code_identity()', "code = code_identity()"),
    ("M9", MAN, '"n_jobs": sum(len(r["checkpoint_steps"]) for r in runs),', '"n_jobs": len(runs),'),
    (
        "M10",
        MAN,
        'if isinstance(status, dict) and status.get("status") == "completed":',
        'if isinstance(status, dict) and status.get("status") in ("completed", "running"):',
    ),
    (
        "M11",
        MAN,
        'if not all(isinstance(s, int) and not isinstance(s, bool) for s in r["checkpoint_steps"]):',
        "if False:",
    ),
    # gate.py: the manifest
    (
        "G1",
        GATE,
        'if k != "config" and r.get(k) != v',
        'if k not in ("config", "eval_dir", "run_dir") and r.get(k) != v',
    ),
    ("G2", GATE, 'diffs += [f"config {d}" for d in config_differences(r["config"], exp["config"])]', "pass"),
    (
        "G3",
        GATE,
        'if m.get("eval") != ev or m.get("suite") != suite.name:',
        'if m.get("suite") != suite.name:',
    ),
    (
        "G4",
        GATE,
        'if m.get("n_runs") != len(m["runs"]) or m.get("n_jobs") != n_jobs:',
        'if m.get("n_jobs") != n_jobs:',
    ),
    (
        "G5",
        GATE,
        '                if rid not in listed:\n                    add(("manifest", rid), f"{MANIFEST}: run {rid} of {RECORD} is missing")',
        "                pass",
    ),
    ("G6", GATE, 'if r["checkpoint_steps"] != steps:', "if False:"),
    ("G7", GATE, "if self.expected and exp is None:", "if False:"),
    # gate.py: partial selection, status, metrics
    ("G8", GATE, "return all(p.is_file() for p in done)", "return any(p.is_file() for p in done)"),
    (
        "G9",
        GATE,
        '        if self.m["eval"].get("geometry"):\n            done +=',
        "        if False:\n            done +=",
    ),
    ("G10", GATE, 'if st is None or st.get("status") != "completed":', "if st is None:"),
    ("G11", GATE, "return want is None or (path.is_file() and sha256_file(path) == want)", "return True"),
    ("G12", GATE, "if last is None or last < n:", "if last is None:"),
    ("G13", GATE, "missing = missing_steps(rows, every, last) if every and last else []", "missing = []"),
    ("G14", GATE, "if not self.results_only and not run_dir.exists():", "if False:"),
    # gate.py: jobs
    ("G15", GATE, 'if s.get("checkpoint") != name or s.get("step") != step:', 'if s.get("step") != step:'),
    (
        "G16",
        GATE,
        'if s.get("operator_override") or s.get("operator_used") != r["operator"]:',
        'if s.get("operator_override"):',
    ),
    ("G17", GATE, '(s.get("eval_code") or {}).get("ops_sha256"),\n', ""),
    ("G18", GATE, 'if not s.get("all_blocks", False):', 'if not s.get("all_blocks", True):'),
    ("G19", GATE, "if want is not None and nll.size != want:", "if want is not None and nll.size < want:"),
    (
        "G20",
        GATE,
        'self.checkpoints[f"{rid}/{name}"] = dict(ck, n_blocks=want)',
        'self.checkpoints[f"{rid}/{name}"] = dict(ck, n_blocks=None)',
    ),
    ("G21", GATE, 'if ck is not None and s.get("checkpoint_files") != ck["files"]:', "if False:"),
    ("G22", GATE, 'if "data_dir" in s and not same_data_dir(s["data_dir"], self.data_dir):', "if False:"),
    (
        "G23",
        GATE,
        'if g.get("checkpoint") != f"step_{step:06d}" or g.get("step") != step:',
        'if g.get("step") != step:',
    ),
    (
        "G24",
        GATE,
        'if g.get("probe_operator_arg") is not None or g.get("operator_trained") != r["operator"]:',
        'if g.get("probe_operator_arg") is not None:',
    ),
    (
        "G25",
        GATE,
        'if ck is not None and g.get("checkpoint_state_sha256") != ck["state_sha256"]:',
        "if False:",
    ),
    ("G26", GATE, 'if state.get("step") != step:', "if False:"),
    (
        "G27",
        GATE,
        '            diffs = self.config_diffs(state["config"], exp["config"])\n',
        "            diffs = []\n",
    ),
    ("G28", GATE, "if ck_code != self.code:", "if False:"),
    (
        "G29",
        GATE,
        'want = sha256_file(state) if state.is_file() else "(no such checkpoint)"',
        'want = res[0].get("checkpoint_state_sha256")',
    ),
    (
        "G30",
        GATE,
        'IGNORED = EXECUTION_FIELDS - {"checkpoint.count", "data.dir"}',
        'IGNORED = EXECUTION_FIELDS - {"data.dir"}',
    ),
    (
        "G31",
        GATE,
        'and not (d.startswith("data.dir:") and same_data_dir(*data))',
        'and not d.startswith("data.dir:")',
    ),
    # gate.py: the record
    ("G32", GATE, 'if rec.get("suite") != self.m.get("suite"):', "if False:"),
    ("G33", GATE, 'if subj == ("manifest",) and self.errs.has("manifest"):', "if False:"),
    (
        "G34",
        GATE,
        '                self.errs.add(self.subject(rel), f"{rel}: not in {RECORD} (re-run the full gate)")',
        "                pass",
    ),
    ("G35", GATE, '"partial": len(rows) < len(manifest["runs"]),', '"partial": False,'),
    (
        "G36",
        GATE,
        'if rid is None or not (self.record or {}).get("partial") or rid in self.record["runs"]:',
        'if rid is None or not (self.record or {}).get("partial"):',
    ),
    (
        "G37",
        GATE,
        "others = [q for q in owner.get(sha, []) if q != rel] if recorded.get(rel) != sha else []",
        "others = []",
    ),
    ("G38", GATE, "            elif actual[rel] != sha:", "            elif False:"),
    (
        "G40",
        GATE,
        "        if not all(isinstance(rec.get(k), t) for k, t in shapes.items()):",
        "        if False:",
    ),
    (
        "G42",
        GATE,
        'if self.record is not None and not self.record.get("partial") and rid not in self.record["runs"]:',
        "if False:",
    ),
    (
        "G43",
        GATE,
        "        elif all(CHECKPOINT_MISSING in e for e in rep.errors):",
        "        elif any(CHECKPOINT_MISSING in e for e in rep.errors):",
    ),
    (
        "G44",
        GATE,
        "if (self.record is not None or not self.results_only) and res[0].get(",
        "if (not self.results_only) and res[0].get(",
    ),
    # merge.py
    (
        "R1",
        MERGE,
        'if (a.get("code") or {}).get("ops_sha256") != (b.get("code") or {}).get("ops_sha256"):',
        "if False:",
    ),
    ("R2", MERGE, "elif _run_record(rec_src, rid) == _run_record(rec_dst, rid):", "elif True:"),
    ("R3", MERGE, "if len(data) > 1:", "if len(data) > 2:"),
    ("R4", MERGE, '| data_hashes(dst, m_dst, rec_dst["runs"])', ""),
    ("R5", MERGE, "if src.resolve() == dst:", "if False:"),
    ("R6", MERGE, "elif dst.exists() and any(dst.iterdir()):", "elif False:"),
    ("R7", MERGE, "            if log.is_file():", "            if False:"),
    (
        "R8",
        MERGE,
        "rep = gate(folder, results_only=True, leave_ungated=True)",
        "rep = gate(folder, results_only=True, leave_ungated=True, write_record=False) if False else type('R', (), {'errors': []})()",
    ),
    (
        "R9",
        MERGE,
        'cks = {k: v for k, v in rec["checkpoints"].items() if k.split("/")[0] == rid}',
        "cks = {}",
    ),
    (
        "R10",
        MERGE,
        '        m_dst, rec_dst = check_results_folder(dst, "DST")',
        "        m_dst, rec_dst = read_manifest(dst), json.loads((dst / RECORD).read_text())",
    ),
    ("R11", MERGE, 'if rid not in rec_dst["runs"]:', "if True:"),
    (
        "R12",
        MERGE,
        "keys = sorted((set(a) | set(b)) - set(PER_SITTING))",
        'keys = sorted((set(a) | set(b)) - set(PER_SITTING) - {"runs"})',
    ),
    # runner.py
    (
        "U1",
        RUN,
        'if device is None and "auto" in _devices(runs, None) and not torch.cuda.is_available():',
        'if "auto" in _devices(runs, None) and not torch.cuda.is_available():',
    ),
    (
        "U2",
        RUN,
        'if device is None and "auto" in _devices(runs, None) and not torch.cuda.is_available():',
        'if device is None and "auto" in _devices(runs, device) and False:',
    ),
    (
        "U3",
        RUN,
        "return final is not None and not _missing_checkpoints(run_dir, final)",
        "return final is not None",
    ),
    ("U4", RUN, 'return [s for s in missing if f"step_{s:06d}" in evaluated]', "return missing"),
    ("U5", RUN, 'if req.get("shards_sha256") not in (None, shards):', "if False:"),
    (
        "U6",
        RUN,
        '    if code.get("ops_sha256") not in (None, ops_sha256()):\n        raise ValueError(\n            f"{out} was run',
        '    if False:\n        raise ValueError(\n            f"{out} was run',
    ),
    (
        "U7",
        RUN,
        'if (out / "gate.json").is_file() or any(runs.glob("*/eval/*/step_*.json")):',
        'if (out / "gate.json").is_file():',
    ),
    ("U8", RUN, "if (n := stopped_step(read_status(run_dir))) is not None:", "if (n := None) is not None:"),
    (
        "U9",
        RUN,
        'resume = (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").glob("step_*"))',
        "resume = False",
    ),
    ("U10", RUN, 'if manifest["suite"] != suite:', "if False:"),
    ("U11", RUN, "skipped = [i for i in ids if i in done]", "skipped = []"),
    ("U12", RUN, "left = [i for i in ids if i not in done]", "left = list(ids)"),
    ("U13", RUN, 'if previous and previous["suite"] != suite.name:', "if False:"),
    (
        "U14",
        RUN,
        "if diffs := manifest_differences(_without_data_dir(manifest), _without_data_dir(previous)):",
        "if diffs := []:",
    ),
    (
        "U15",
        RUN,
        'done[rid] = {0: "completed", EXIT_NONFINITE: STOPPED}.get(',
        'done[rid] = {0: "completed", EXIT_NONFINITE: "completed"}.get(',
    ),
    ("U16", RUN, "if not run_complete(run_dir, entry):  # e.g.", "if False:  # e.g."),
]


def main(ids: list[str]) -> None:
    todo = [m for m in MUTANTS if not ids or m[0] in ids]
    with open("mutants.tsv", "a") as log:  # in the working directory
        for mid, path, old, new, *rest in todo:
            p = Path(path)
            orig = p.read_bytes()
            text = orig.decode("utf-8")
            n = text.count(old)
            if n != 1:
                print(f"{mid}\tBADMATCH({n})", flush=True)
                log.write(f"{mid}\t{path}\tBADMATCH({n})\t\n")
                log.flush()
                continue
            sel = rest[0] if rest else SEL[path]
            try:
                p.write_bytes(text.replace(old, new, 1).encode("utf-8"))
                t0 = time.time()
                r = subprocess.run(
                    [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *sel.split()],
                    capture_output=True,
                    text=True,
                )
                dt = time.time() - t0
            finally:
                p.write_bytes(orig)
            verdict = "survived" if r.returncode == 0 else "killed"
            failed = [x for x in r.stdout.splitlines() if x.startswith(("FAILED", "ERROR"))][:1]
            print(f"{mid}\t{verdict}\t{dt:.0f}s\t{failed[0] if failed else ''}", flush=True)
            log.write(f"{mid}\t{path}\t{verdict}\t{failed[0] if failed else ''}\n")
            log.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
