"""``build_report``: regenerate every table and figure of one or more suite folders from result files only,
and ``demo_report`` for ``kinterval demo``. Output: ``index.md`` linking Markdown + LaTeX tables, PNG figures
and
``report.json`` (all numbers)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from kinterval.report import analysis as A
from kinterval.report import figures as F
from kinterval.report import tables as T
from kinterval.report.results import SuiteResults, load_results


def _write_table(out: Path, name: str, headers, rows, caption: str, index: list[str]) -> None:
    (out / f"{name}.md").write_text(T.render(headers, rows, "md", caption))
    (out / f"{name}.tex").write_text(T.render(headers, rows, "tex", caption))
    index += [
        f"### {caption}",
        "",
        T.render(headers, rows, "md"),
        f"[Markdown]({name}.md) · [LaTeX]({name}.tex)",
        "",
    ]


def _suite_section(res: SuiteResults, out: Path, index: list[str], data: dict) -> list[dict]:
    s = res.suite
    deltas = A.paired_deltas(res.points)
    index += [
        f"## Suite {s}: {res.title}",
        "",
        f"{len({p.run_id for p in res.points})} runs with evaluations, {len(res.points)} evaluated "
        f"checkpoints (folder `{res.dir}`). ΔNLL = condition − same-seed softmax, paired per validation "
        "block, in nats/token (positive: worse than softmax).",
        "",
    ]
    rows = A.delta_table(deltas)
    data[s] = {"delta": rows}
    if rows:
        _write_table(out, f"{s}_delta", *T.delta_rows(rows), f"Suite {s}: endpoint ΔNLL vs softmax", index)
    fac = A.factorial_effects(res.points)
    if fac:
        data[s]["factorial"] = fac
        _write_table(
            out, f"{s}_factorial", *T.factorial_rows(fac), f"Suite {s}: 2x2 factorial effects by K", index
        )
    trends = A.k_trends(deltas)
    if trends:
        data[s]["k_trends"] = trends
        _write_table(out, f"{s}_ktrend", *T.trend_rows(trends), f"Suite {s}: K-trend slopes of ΔNLL", index)
    traj = A.trajectories(deltas)
    if traj:
        F.trajectory_figure(
            traj, out / f"{s}_trajectories.png", f"Suite {s}: ΔNLL along training (mean over seeds)"
        )
        index += [f"![ΔNLL trajectories]({s}_trajectories.png)", ""]
        data[s]["trajectories"] = traj
    geo: dict[str, list] = {}
    for p in res.points:
        if p.geometry:
            geo.setdefault(p.operator, []).append((p.tokens, p.geometry))
    if geo:
        geo = {op: _mean_geometry(v) for op, v in geo.items()}
        F.geometry_figure(geo, out / f"{s}_geometry.png", f"Suite {s}: layer-mean geometry (mean over seeds)")
        index += [f"![geometry]({s}_geometry.png)", ""]
    pairs = A.detach_pairs(deltas)
    if pairs:
        F.detach_figure(pairs, out / f"{s}_detach.png", f"Suite {s}: modified vs full calibration gradient")
        index += [f"![detach vs full]({s}_detach.png)", ""]
    return rows


def _mean_geometry(pts: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    by_t: dict[int, list[dict]] = {}
    for t, g in pts:
        by_t.setdefault(t, []).append(g)
    out = []
    for t in sorted(by_t):
        keys = by_t[t][0].keys()
        vals = {k: [g[k] for g in by_t[t] if g.get(k) is not None and math.isfinite(g[k])] for k in keys}
        out.append((t, {k: float(np.mean(v)) if v else float("nan") for k, v in vals.items()}))
    return out


def build_report(suite_dirs, out: str | Path) -> Path:
    """Report of one or more suite folders into ``out``; returns the path of ``index.md``."""
    dirs = [Path(d) for d in ([suite_dirs] if isinstance(suite_dirs, (str, Path)) else suite_dirs)]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    index = [
        "# kinterval report",
        "",
        "Regenerated from result files only (manifests, per-block NLL arrays, "
        "geometry probes). Single-seed intervals: circular block bootstrap over validation blocks (block 16, "
        "4000 resamples; evaluation sampling only). Several seeds: mean of same-seed paired differences, "
        "seed SD, t interval, exact sign-permutation p, BH q.",
        "",
    ]
    data: dict = {}
    tables = {}
    for d in dirs:
        res = load_results(d)
        tables[res.suite] = _suite_section(res, out, index, data)
    if len(tables) > 1:
        rows = A.cross_suite(tables)
        _write_table(
            out, "cross_suite", *T.cross_rows(rows, list(tables)), "Cross-suite ΔNLL contrasts", index
        )
    (out / "report.json").write_text(json.dumps(data, indent=1, default=_json_default) + "\n")
    index += ["All numbers: [report.json](report.json)", ""]
    path = out / "index.md"
    path.write_text("\n".join(index))
    return path


def _json_default(o):
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if hasattr(o, "run_id"):
        return o.run_id
    return str(o)


def demo_report(
    per_block: Mapping[str, np.ndarray],
    out_dir: str | Path,
    *,
    trajectories: Mapping[str, list[tuple[int, float]]] | None = None,
    title: str = "kinterval demo",
) -> dict:
    """Endpoint ΔNLL vs softmax with block-bootstrap CIs for the demo.

    ``per_block``: operator name -> per-block validation NLL (same blocks for all, ``"softmax"`` included).
    ``trajectories`` (optional): operator -> [(training tokens, mean val NLL)], softmax included, same tokens.
    Writes ``delta.md``, ``delta.tex``, ``delta.png`` (and ``trajectories.png``) and ``index.md`` into
    ``out_dir``; returns ``{"rows": [{operator, nll, delta, lo, hi, separated}], "index": path}``.
    """
    if "softmax" not in per_block:
        raise ValueError("per_block must include the softmax reference")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    soft = np.asarray(per_block["softmax"], dtype=np.float64)
    rows = []
    for op, nll in per_block.items():
        if op == "softmax":
            continue
        nll = np.asarray(nll, dtype=np.float64)
        if nll.shape != soft.shape:
            raise ValueError(f"{op}: {nll.shape[0]} blocks, softmax has {soft.shape[0]}")
        d = nll - soft
        lo, hi = A._ci(d)
        sep = bool(math.isfinite(lo) and lo > 0.01)
        rows.append(
            {
                "operator": op,
                "seeds": [0],
                "nll": float(nll.mean()),
                "delta": float(d.mean()),
                "lo": lo,
                "hi": hi,
                "interval": "block bootstrap",
                "separated": sep,
            }
        )
    headers, cells = T.delta_rows(rows)
    cap = f"{title}: ΔNLL vs softmax (softmax NLL {soft.mean():.4f} nats/token, {soft.size} blocks)"
    (out / "delta.md").write_text(T.render(headers, cells, "md", cap))
    (out / "delta.tex").write_text(T.render(headers, cells, "tex", cap))
    plot_rows = [
        dict(
            r,
            lo=r["lo"] if math.isfinite(r["lo"]) else r["delta"],
            hi=r["hi"] if math.isfinite(r["hi"]) else r["delta"],
        )
        for r in rows
    ]
    F.endpoint_figure(plot_rows, out / "delta.png", cap)
    index = [f"# {title}", "", T.render(headers, cells, "md", cap), "![ΔNLL](delta.png)", ""]
    if trajectories and "softmax" in trajectories:
        base = dict(trajectories["softmax"])
        traj = {
            op: [(t, v - base[t], v - base[t], v - base[t]) for t, v in pts if t in base]
            for op, pts in trajectories.items()
            if op != "softmax"
        }
        F.trajectory_figure(traj, out / "trajectories.png", f"{title}: ΔNLL along training")
        index += ["![trajectories](trajectories.png)", ""]
    path = out / "index.md"
    path.write_text("\n".join(index))
    return {"rows": rows, "index": path}
