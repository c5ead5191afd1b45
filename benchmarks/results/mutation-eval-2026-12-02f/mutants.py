"""Mutation runner of the eval measurement audit (NOTES.md). Run from the repository root with the worktree's
``src`` first on PYTHONPATH: ``python benchmarks/results/mutation-eval-2026-12-02f/mutants.py [ID ...]``.

Each mutant replaces one exact string (it must occur exactly once) in one product file, runs its selection
(``pytest -x -q -p no:xdist -p no:cacheprovider``), records killed / survived and restores the file with
``git checkout``. One pytest process at a time."""

# ruff: noqa: E501

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TE = "src/kinterval/train/evaluate.py"
LD = "src/kinterval/data/loader.py"
NL = "src/kinterval/eval/nll.py"
EV = "src/kinterval/eval/evaluate.py"
GE = "src/kinterval/eval/geometry.py"
GD = "src/kinterval/eval/graddiag.py"
TS = "src/kinterval/eval/tau_screen.py"

SEL = {
    TE: "tests/train/test_validation_log.py tests/eval/test_eval_run.py tests/eval/test_tau_screen.py "
    "tests/eval/test_eval_numerics.py",
    LD: "tests/train/test_validation_log.py tests/eval/test_eval_run.py",
    NL: "tests/eval/test_eval_run.py",
    EV: "tests/eval/test_eval_run.py tests/eval/test_eval_checkpoints.py tests/eval/test_eval_commands.py "
    "tests/eval/test_tau_screen.py",
    GE: "tests/eval/test_eval_geometry.py tests/train/test_validation_log.py tests/eval/test_eval_numerics.py",
    GD: "tests/eval/test_eval_graddiag.py tests/report/test_graddecomp.py tests/eval/test_eval_numerics.py",
    TS: "tests/eval/test_tau_screen.py tests/eval/test_eval_run.py",
}

MUTANTS = [
    # token_nll / the block definition
    ("E1", TE, "y.to(device), reduction", "x.to(device), reduction"),  # targets misaligned (x, not y)
    (
        "E2",
        LD,
        "buf = torch.from_numpy(np.asarray(tokens[k * T : k * T + T + 1]",
        "buf = torch.from_numpy(np.asarray(tokens[k * (T - 1) : k * (T - 1) + T + 1]",
    ),  # overlapping blocks
    (
        "E3",
        LD,
        "return buf[:-1], buf[1:]",
        "return buf[:-1], torch.roll(buf[1:], 1)",
    ),  # target shifted by one
    (
        "E4",
        LD,
        "return max(0, (n_tokens - 1) // T)",
        "return max(0, -(-(n_tokens - 1) // T))",
    ),  # partial block
    ("E5", TE, "with eval_precision(numerics):", "with torch.backends.cudnn.flags():"),  # TF32 left as it was
    ("E6", TE, "    model.eval()\n", "    pass\n"),  # train mode in evaluation
    ("E7", TE, "if len(pending) == FLUSH or k == n - 1:", "if len(pending) == FLUSH or k == n - 2:"),
    (
        "E8",
        TE,
        "return token_nll(model, tokens, T, **kw).mean(axis=1)",
        "return token_nll(model, tokens, T, **kw).mean(axis=0)",
    ),  # evaluate_nll: mean over blocks
    ("E9", TE, "model.train(was_training)", "model.train(True)"),  # mode not restored (eval caller)
    ("E10", TE, "logits[0].float()", "logits[0]"),  # bf16 logits under autocast
    ("E11", TE, "with autocast(numerics, device):", "with torch.autocast('cpu', enabled=False):"),
    # per-document NLL
    ("N1", NL, "return before[1 : n * T + 1].reshape(n, T)", "return before[0 : n * T].reshape(n, T)"),
    (
        "N2",
        NL,
        "return ids, np.bincount(inv, weights=nll.ravel())",
        "return ids, np.bincount(inv, weights=nll.T.ravel())",
    ),
    ("N3", NL, "np.bincount(inv).astype(np.float64)", "np.bincount(inv).astype(np.float64) + 1"),
    # evaluate_checkpoint's summary
    ("V1", EV, "nll = tok.mean(axis=1)", "nll = np.median(tok, axis=1)"),
    ("V2", EV, '"step": int(state["step"]),', '"step": int(state["step"]) + 1,'),
    ("V3", EV, '"tokens": int(state.get("tokens", 0)),', '"tokens": 0,'),
    ("V4", EV, '"mean_nll": float(nll.mean()),', '"mean_nll": float(np.median(nll)),'),
    ("V5", EV, '"operator_used": model.operator,', '"operator_used": trained_operator(state),'),
    ("V6", EV, '"tf32": numerics.tf32_eval,', '"tf32": numerics.tf32_train,'),
    ("V7", EV, '"autocast": autocast_applied(numerics, device),', '"autocast": numerics.autocast_dtype,'),
    (
        "V8",
        EV,
        "ci = cluster_bootstrap_ci(doc_sum / doc_n, ids, weights=doc_n)",
        "ci = cluster_bootstrap_ci(doc_sum / doc_n, ids)",
    ),
    ("V9", EV, "ci = block_bootstrap_ci(nll, block=block)", "ci = block_bootstrap_ci(nll, block=1)"),
    ("V10", EV, '"checkpoint": checkpoint_name(ckpt),', '"checkpoint": checkpoint_name(ckpt.parent),'),
    ("V11", EV, '"T": T,', '"T": T + 1,'),
    ("V12", EV, 'summary["n_documents"] = int(ids.size)', 'summary["n_documents"] = int(ids.size) - 1'),
    ("V13", EV, '"checkpoint_files": state.get("files", {}),', '"checkpoint_files": {},'),
    # geometry
    ("G1", GE, '"z_q001": _quantile(z, valid, 0.001),', '"z_q001": _quantile(z, valid, 0.01),'),
    ("G2", GE, 'out["tv"] = 0.5 * (Pn - PE).abs().sum(-1)', 'out["tv"] = (Pn - PE).abs().sum(-1)'),
    ("G3", GE, '        span = out["span"]\n', "        span = -ext.m.squeeze(-1)\n"),  # h from -m
    ("G4", GE, "(valid & (z < -6)).sum(-1)", "(z < -6).sum(-1)"),  # masked keys (z = 0 there)
    ("G5", GE, "/ nv.clamp(min=1),", "/ s.shape[-1],"),  # fraction over future keys too
    (
        "G6",
        GE,
        'zs = torch.where(valid, z, torch.full_like(z, float("inf")))',
        "zs = torch.where(valid, z, torch.zeros_like(z))",
    ),  # quantile over masked keys
    (
        "G7",
        GE,
        "    n = valid.sum(-1, keepdim=True)\n",
        "    n = torch.full_like(valid.sum(-1, keepdim=True), z.shape[-1])\n",
    ),
    ("G8", GE, 'rows["q_norm"] = q[..., 1:, :].norm(dim=-1)', 'rows["q_norm"] = q[..., :-1, :].norm(dim=-1)'),
    (
        "G9",
        GE,
        "mean = {k: float(np.mean([row[k] for row in per_layer])) for k in METRICS}",
        "mean = {k: float(np.median([row[k] for row in per_layer])) for k in METRICS}",
    ),
    (
        "G10",
        GE,
        "mean = {k: float(np.mean([row[k] for row in per_layer])) for k in METRICS}",
        "mean = {k: float(sum(s[k] for s in sums) / max(1, sum(c[k] for c in counts))) for k in METRICS}",
    ),
    (
        "G11",
        GE,
        "probe_spec = OperatorSpec.from_full_name(spec) if isinstance(spec, str) else (spec or own)",
        "probe_spec = own",
    ),  # the spec argument ignored
    ("G12", GE, "        with eval_precision(numerics):\n", "        with torch.backends.cudnn.flags():\n"),
    ("G13", GE, "x, _ = get_block(tokens, b, T)", "x, _ = get_block(tokens, b + 1, T)"),
    ("G14", GE, "    blocks: int = 8,\n    spec", "    blocks: int = 4,\n    spec"),
    ("G15", GE, "idx = torch.where(tail, torch.full_like(idx, nb - 1), idx)", "pass"),  # tail not a bucket
    (
        "G16",
        GE,
        '"entropy": -(PE * logP).sum(-1),',
        '"entropy": -(PE * logP).sum(-1) / nv.clamp(min=2).log(),',
    ),  # normalized entropy
    ("G17", GE, "    model.eval()\n", "    pass\n"),
    # gradient diagnostics
    ("D1", GD, '"zero_sum_residual": float(r.median())', '"zero_sum_residual": float(r.mean())'),
    (
        "D2",
        GD,
        '"err_min_only": sq(t["M"]),\n        "err_max_only": sq(t["m"]),',
        '"err_min_only": sq(t["m"]),\n        "err_max_only": sq(t["M"]),',
    ),
    ("D3", GD, 'full = t["self"] + t["M"] + t["m"]', 'full = t["self"] + t["M"] - t["m"]'),
    ("D4", GD, 'p1 = project_zero_sum(t["self"], valid)', 'p1 = t["self"]'),
    ("D5", GD, "(loss / n).backward()", "loss.backward()"),
    (
        "D6",
        GD,
        "t = score_grad_terms(s, valid, full_spec(spec), u)",
        "t = score_grad_terms(s, valid, spec, u)",
    ),
    (
        "D7",
        GD,
        "mean = {k: float(np.mean([row[k] for row in per_layer])) for k in per_layer[0]}",
        "mean = {k: float(np.median([row[k] for row in per_layer])) for k in per_layer[0]}",
    ),
    ("D8", GD, "            eval_precision(numerics),\n", ""),
    (
        "D9",
        GD,
        'row.update({k: (np.sqrt(sums[idx][k]) / full if full > 0 else float("nan")) for k in DECOMP})',
        'row.update({k: (sums[idx][k] / sums[idx]["full"] if full > 0 else float("nan")) for k in DECOMP})',
    ),
    ("D10", GD, "r = r[g.abs().sum(-1) != 0]", "r = r[g.sum(-1) != 0]"),
    ("D11", GD, "    model.eval()\n", "    pass\n"),
    ("D12", GD, "x, y = get_block(tokens, b, T)", "x, y = get_block(tokens, b + 1, T)"),
    # tau screen
    (
        "S1",
        TS,
        "conds = [(key(K, t), fwm_spec(K, t, reconstruction), stage.tail) for K in stage.K for t in stage.taus]",
        "conds = [(key(K, t), fwm_spec(K, t, reconstruction), stage.tail) for t in stage.taus for K in stage.K]",
    ),
    (
        "S2",
        TS,
        "conds = [(key(K, t), fwm_spec(K, t, reconstruction), stage.tail) for K in stage.K for t in stage.taus]",
        "conds = [(key(K, t), fwm_spec(K, stage.taus[0], reconstruction), stage.tail) for K in stage.K for t in stage.taus]",
    ),
    (
        "S3",
        TS,
        'conds.append(("softmax", OperatorSpec.parse("softmax"), "zero"))',
        'conds.append(("softmax", OperatorSpec.parse("bf16-exp"), "zero"))',
    ),
    (
        "S4",
        TS,
        'conds += [(key(K, "minmax"), minmax_spec(K, reconstruction), "zero") for K in stage.K]',
        'conds += [(key(K, "minmax"), minmax_spec(K), "zero") for K in stage.K]',
    ),
    ("S5", TS, "d = nll - soft\n", "d = soft - nll\n"),
    ("S6", TS, "d = nll - soft\n", "d = nll - soft.mean()\n"),
    (
        "S7",
        TS,
        "res.per_block[name], res.nll[name] = nll, float(nll.mean())",
        "res.per_block[name], res.nll[name] = nll, float(np.median(nll))",
    ),
    ("S8", TS, "star = ci[key(K, tau_star)]", "star = ci[key(K, res.best_tau(K))]"),
    (
        "S9",
        TS,
        "return min(self.stage.taus, key=lambda t: np.mean([self.nll[key(K, t)] for K in self.stage.K]))",
        "return min(self.stage.taus, key=lambda t: self.nll[key(self.stage.K[-1], t)])",
    ),
    ("S10", TS, "g = replace(g, keep=valid)", "g = g"),
    (
        "S11",
        TS,
        "return token_nll(model, tokens, model.config.block_size, max_blocks=blocks).mean(axis=1)",
        "return token_nll(model, tokens, model.config.block_size, max_blocks=None).mean(axis=1)",
    ),
    (
        "S12",
        TS,
        'return OperatorSpec.parse(f"fwm-weight-k{K}", tau=tau)',
        'return OperatorSpec.parse(f"fwm-weight-k{K}")',
    ),
    ("S13", TS, '"minmax": res.nll.get(key(K, "minmax")),', '"minmax": res.nll.get(key(K, tau_star)),'),
    ("S14", TS, 'bold(f"{v:.4f}") if t == r["best_tau"]', 'bold(f"{v:.4f}") if t == r["tau_star"]'),
]


def run(mid, path, old, new) -> str:
    p = Path(path)
    text = p.read_text()
    if text.count(old) != 1:
        return f"BAD ({text.count(old)} matches)"
    p.write_text(text.replace(old, new))
    try:
        files = " ".join(f for f in SEL[path].split() if Path(f).is_file())  # new test files once written
        cmd = f"python -m pytest -x -q -p no:xdist -p no:cacheprovider {files}"
        r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=900)
        lines = r.stdout.strip().splitlines()
        failed = [x.split(" ")[1] for x in lines if x.startswith(("FAILED ", "ERROR "))]
        tail = lines[-1] if lines else r.stderr[-200:]
        return ("killed" if r.returncode != 0 else "survived") + " | " + (failed[0] if failed else tail)
    finally:
        subprocess.run(["git", "checkout", "--", path], check=True)


if __name__ == "__main__":
    want = set(sys.argv[1:])
    for m in MUTANTS:
        if want and m[0] not in want:
            continue
        print(m[0], run(*m), flush=True)
