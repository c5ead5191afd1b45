"""Suite definition files: the paper's suites as data (``suite/suites/*.toml``), expanded into runs.

A suite file names a training protocol (a config shipped in ``kinterval/configs``), its corpus, seeds,
checkpoint count and ``[[group]]`` tables of operators. ``"{K}"`` in an operator name is expanded over the
group's ``K`` list;
``arithmetic`` (suite or group level) is applied to Weight-/Prob-STE operators that do not set it themselves;
``overrides`` holds dotted training-config fields (``{"schedule.tokens" = 5_000_000}``). Optional tables:
``[data]`` (``source`` + ``tokens`` for ``kinterval data prepare`` when no ``--data`` is given) and ``[eval]``
(``split``, ``doc_clusters``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from kinterval.ops import OperatorSpec

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - python 3.10
    import tomli as tomllib

SUITE_KEYS = {
    "name",
    "title",
    "protocol",
    "corpus",
    "seeds",
    "checkpoints",
    "arithmetic",
    "overrides",
    "group",
    "data",
    "eval",
    "supplementary",
}
GROUP_KEYS = {"name", "operators", "K", "seeds", "checkpoints", "arithmetic", "overrides", "protocol"}


@dataclass(frozen=True)
class RunSpec:
    """One training run of a suite; ``operator`` is an :attr:`OperatorSpec.full_name` (or ``sdpa``)."""

    run_id: str
    group: str
    operator: str
    seed: int
    protocol: str
    checkpoints: int
    overrides: dict = field(default_factory=dict)

    @property
    def spec(self) -> OperatorSpec:
        return OperatorSpec.from_full_name(self.operator)

    def axes(self) -> dict:
        """The operator's design axes (calibration, reconstruction, surrogate, K, tau, range_grad, ...)"""
        s = self.spec
        return {
            "kind": s.kind,
            "name": s.name,
            "calibration": s.calibration,
            "reconstruction": s.reconstruction,
            "surrogate": s.surrogate,
            "K": s.K,
            "tau": s.tau,
            "range_grad": s.range_grad,
            "arithmetic": s.arithmetic,
        }


@dataclass(frozen=True)
class Suite:
    name: str
    title: str
    protocol: str
    corpus: str
    runs: tuple[RunSpec, ...]
    data: dict = field(default_factory=dict)
    eval: dict = field(default_factory=dict)
    source: str = ""  # the file it was read from

    def run(self, run_id: str) -> RunSpec:
        for r in self.runs:
            if r.run_id == run_id:
                return r
        raise ValueError(f"suite {self.name}: no run {run_id!r}")

    @property
    def n_jobs(self) -> int:
        """Evaluation jobs: one per checkpoint of every run."""
        return sum(r.checkpoints for r in self.runs)


def shipped_suites() -> list[str]:
    root = resources.files("kinterval") / "suite" / "suites"
    return sorted(p.name.removesuffix(".toml") for p in root.iterdir() if p.name.endswith(".toml"))


def suite_path(name: str | Path) -> Path:
    path = Path(name)
    if path.suffix == ".toml" and path.is_file():
        return path
    shipped = resources.files("kinterval") / "suite" / "suites" / f"{name}.toml"
    if shipped.is_file():
        return Path(str(shipped))
    raise FileNotFoundError(
        f"unknown suite {str(name)!r}: not a .toml file and not shipped ({shipped_suites()})"
    )


def safe_name(full_name: str) -> str:
    """``lerp-k32[range_grad=detach]`` -> ``lerp-k32.range_grad-detach`` (file-system safe)."""
    base, _, extra = full_name.partition("[")
    parts = [p.replace("=", "-") for p in extra.rstrip("]").split(",") if p]
    return ".".join([base, *parts])


def _operator(template: str, K, arithmetic: str | None) -> str:
    name = template.replace("{K}", str(K)) if K is not None else template
    if "{" in name:
        raise ValueError(f"operator {template!r} has a {{K}} placeholder but its group gives no K list")
    spec = OperatorSpec.from_full_name(name)
    if arithmetic and spec.surrogate is not None and "arithmetic=" not in name:
        spec = OperatorSpec.parse(spec, arithmetic=arithmetic)
    return spec.full_name


def load_suite(name: str | Path) -> Suite:
    """Read and expand a suite file (shipped name such as ``"D"``/``"ci"`` or a path)."""
    path = suite_path(name)
    try:
        d = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: invalid TOML ({err})") from None
    unknown = set(d) - SUITE_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown suite field(s) {sorted(unknown)}; known: {sorted(SUITE_KEYS)}")
    for key in ("name", "protocol", "seeds", "checkpoints", "group"):
        if key not in d:
            raise ValueError(f"{path}: missing required field {key!r}")
    runs: list[RunSpec] = []
    for i, g in enumerate(d["group"]):
        bad = set(g) - GROUP_KEYS
        if bad:
            raise ValueError(
                f"{path}: group {i}: unknown field(s) {sorted(bad)}; known: {sorted(GROUP_KEYS)}"
            )
        seeds = g.get("seeds", d["seeds"])
        overrides = {**d.get("overrides", {}), **g.get("overrides", {})}
        arithmetic = g.get("arithmetic", d.get("arithmetic"))
        for template in g["operators"]:
            for K in g.get("K", [None]):
                op = _operator(template, K, arithmetic)
                for seed in seeds:
                    runs.append(
                        RunSpec(
                            run_id=f"{safe_name(op)}-s{seed}",
                            group=g.get("name", f"group{i}"),
                            operator=op,
                            seed=int(seed),
                            protocol=g.get("protocol", d["protocol"]),
                            checkpoints=int(g.get("checkpoints", d["checkpoints"])),
                            overrides=overrides,
                        )
                    )
    ids = [r.run_id for r in runs]
    dup = sorted({x for x in ids if ids.count(x) > 1})
    if dup:
        raise ValueError(f"{path}: duplicate runs {dup} (same operator and seed twice)")
    return Suite(
        name=d["name"],
        title=d.get("title", d["name"]),
        protocol=d["protocol"],
        corpus=d.get("corpus", ""),
        runs=tuple(runs),
        data=d.get("data", {}),
        eval=d.get("eval", {}),
        source=str(path),
    )


def select(runs, only: list[str] | None) -> list[RunSpec]:
    """Runs whose id, group or operator matches any of the shell-style patterns in ``only``."""
    if not only:
        return list(runs)
    pats = [re.compile(_glob(p)) for p in only]
    return [
        r
        for r in runs
        if any(p.fullmatch(r.run_id) or p.fullmatch(r.group) or p.fullmatch(r.operator) for p in pats)
    ]


def _glob(pattern: str) -> str:
    return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
