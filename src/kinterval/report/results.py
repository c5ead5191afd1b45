"""Loading a suite's results from files only: manifest, per-checkpoint evaluations, geometry probes.

One :class:`Point` per (run, checkpoint); identity (operator, axes, seed, group) comes from the manifest.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kinterval.suite.manifest import read_manifest


@dataclass
class Point:
    suite: str
    run_id: str
    group: str
    operator: str
    seed: int
    axes: dict
    step: int
    tokens: int
    nll: np.ndarray  # per-block NLL
    data_key: tuple  # (data dir, split, T, n_blocks): what must match for a paired comparison
    geometry: dict = field(default_factory=dict)  # layer-mean geometry, when probed

    @property
    def mean(self) -> float:
        return float(self.nll.mean())

    @property
    def family(self) -> str:
        """Operator without its K: ``lerp``, ``fwm-prob[range_grad=detach]``, ``softmax``."""
        return family_of(self.operator)

    @property
    def K(self) -> int | None:
        return self.axes.get("K")


def family_of(operator: str) -> str:
    return re.sub(r"-k\d+", "", operator)


@dataclass
class SuiteResults:
    suite: str
    title: str
    dir: Path
    manifest: dict
    points: list[Point]

    def runs(self) -> dict[str, list[Point]]:
        out: dict[str, list[Point]] = {}
        for p in self.points:
            out.setdefault(p.run_id, []).append(p)
        return {k: sorted(v, key=lambda p: p.step) for k, v in out.items()}

    def final(self) -> list[Point]:
        return [v[-1] for v in self.runs().values()]


def load_results(suite_dir: str | Path) -> SuiteResults:
    suite_dir = Path(suite_dir)
    m = read_manifest(suite_dir)
    points = []
    for r in m["runs"]:
        ev = suite_dir / r["eval_dir"]
        geo_dir = suite_dir / r["run_dir"] / "diagnostics" / "geometry"
        axes = {
            k: r.get(k)
            for k in (
                "kind",
                "name",
                "calibration",
                "reconstruction",
                "surrogate",
                "K",
                "tau",
                "range_grad",
                "arithmetic",
            )
        }
        for js in sorted(ev.glob("step_*.json")) if ev.is_dir() else []:
            s = json.loads(js.read_text())
            if s.get("operator_override"):
                continue
            with np.load(js.with_suffix(".npz")) as z:
                nll = z["nll"].astype(np.float64)
            geo = {}
            gj = geo_dir / js.name
            if gj.is_file():
                geo = json.loads(gj.read_text()).get("mean", {})
            points.append(
                Point(
                    m["suite"],
                    r["run_id"],
                    r["group"],
                    r["operator"],
                    int(r["seed"]),
                    axes,
                    int(s["step"]),
                    int(s.get("tokens", 0)),
                    nll,
                    (s.get("data_dir"), s.get("split"), s.get("T"), int(nll.size)),
                    geo,
                )
            )
    return SuiteResults(m["suite"], m.get("title", m["suite"]), suite_dir, m, points)
