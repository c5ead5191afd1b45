"""Suite definition files: the paper's suites as data (``suite/suites/*.toml``), expanded into runs.

A suite file names a training protocol (a config shipped in ``kinterval/configs``), its corpus, seeds,
checkpoint count and ``[[group]]`` tables of operators. ``"{K}"`` in an operator name is expanded over the
group's ``K`` list;
``arithmetic`` (suite or group level) is applied to Weight-/Prob-STE operators that do not set it themselves;
``overrides`` holds dotted training-config fields (``{"schedule.tokens" = 5_000_000}``). Optional tables:
``[data]`` (``source``, ``tokens``, ``seed`` for ``kinterval data prepare`` when no ``--data`` is given) and
``[eval]`` (``split``, ``doc_clusters``, ``geometry``, ``geometry_blocks``). Every key and the type of its
value are checked when the file is loaded (:data:`SUITE_FIELDS`, ...): an error names the file and the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from kinterval.data.sources import SPLITS
from kinterval.model.gpt import SDPA, safe_operator
from kinterval.ops import OperatorSpec
from kinterval.ops.seeds import SEED_LIMIT, is_seed
from kinterval.train.config import TrainConfig, flatten

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - python 3.10
    import tomli as tomllib


# What each field of a suite file may hold: (test, description for the error).
def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_STR = (lambda v: isinstance(v, str), "a string")
_BOOL = (lambda v: isinstance(v, bool), "true or false")
_POS_INT = (lambda v: _is_int(v) and v >= 1, "an integer >= 1")
# seeds reach torch, numpy's legacy RNG and lm-eval: a larger one failed every run of the suite
_SEED = (is_seed, f"an integer from 0 to {SEED_LIMIT - 1} (2^32 - 1)")
_SEEDS = (
    lambda v: isinstance(v, list) and v and all(map(is_seed, v)),
    f"a non-empty list of integers from 0 to {SEED_LIMIT - 1} (2^32 - 1)",
)
_POS_INTS = (
    lambda v: isinstance(v, list) and v and all(_is_int(x) and x >= 1 for x in v),
    "a non-empty list of integers >= 1",
)
_STRS = (
    lambda v: isinstance(v, list) and v and all(isinstance(x, str) for x in v),
    "a non-empty list of strings",
)
_TABLE = (lambda v: isinstance(v, dict), "a table")
_GROUPS = (
    lambda v: isinstance(v, list) and v and all(isinstance(x, dict) for x in v),
    "one or more [[group]] tables",
)
_SPLIT = (lambda v: v in SPLITS, f"one of {list(SPLITS)}")

SUITE_FIELDS = {
    "name": _STR,
    "title": _STR,
    "protocol": _STR,
    "corpus": _STR,
    "corpus_source": _STR,  # the `kinterval data prepare --source` that makes the paper's corpus
    "seeds": _SEEDS,
    "checkpoints": _POS_INT,
    "arithmetic": _STR,
    "overrides": _TABLE,
    "group": _GROUPS,
    "data": _TABLE,
    "eval": _TABLE,
    "supplementary": _BOOL,
}
GROUP_FIELDS = {
    "name": _STR,
    "operators": _STRS,
    "K": _POS_INTS,
    "seeds": _SEEDS,
    "checkpoints": _POS_INT,
    "arithmetic": _STR,
    "overrides": _TABLE,
    "protocol": _STR,
}
DATA_FIELDS = {"source": _STR, "tokens": _POS_INT, "seed": _SEED}  # kinterval data prepare
EVAL_FIELDS = {"split": _SPLIT, "doc_clusters": _BOOL, "geometry": _BOOL, "geometry_blocks": _POS_INT}
SUITE_KEYS, GROUP_KEYS = set(SUITE_FIELDS), set(GROUP_FIELDS)


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
        """The operator's spec (``sdpa``: softmax, which SDPA computes)."""
        return (
            OperatorSpec.parse("softmax")
            if self.operator == SDPA
            else OperatorSpec.from_full_name(self.operator)
        )

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
    corpus_source: str = ""  # `kinterval data prepare --source` of the paper's corpus ("": any corpus)

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
    if path.suffix == ".toml":  # a suite file's path that names no file
        raise FileNotFoundError(f"suite file {str(name)!r} not found (shipped suites: {shipped_suites()})")
    raise FileNotFoundError(
        f"unknown suite {str(name)!r}: not a .toml file and not shipped ({shipped_suites()})"
    )


# Config fields that every run of a suite sets itself (manifest.expected_config): an override of one would be
# silently replaced
RUN_FIELDS = {"name", "seed", "operator.name", "checkpoint.count", "data.dir"}


def _operator(template: str, K, arithmetic: str | None) -> str:
    name = template.replace("{K}", str(K)) if K is not None else template
    if "{" in name:
        raise ValueError(f"operator {template!r} has a {{K}} placeholder but its group gives no K list")
    if name.strip() == SDPA:  # exact softmax by PyTorch's SDPA, a control as in `train --operator`
        return SDPA
    spec = OperatorSpec.from_full_name(name)
    given = re.search(r"[\[,]\s*arithmetic\s*=", name)  # the operator's own, however it is spaced
    if arithmetic and spec.surrogate is not None and not given:
        spec = OperatorSpec.parse(spec, arithmetic=arithmetic)
    return spec.full_name


def load_suite(name: str | Path) -> Suite:
    """Read and expand a suite file (shipped name such as ``"D"``/``"ci"`` or a path)."""
    path = suite_path(name)
    try:
        d = tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text, as TOML must be ({err})") from None
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: invalid TOML ({err})") from None
    unknown = set(d) - SUITE_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown suite field(s) {sorted(unknown)}; known: {sorted(SUITE_KEYS)}")
    _check_fields(path, "", d, SUITE_FIELDS, ("name", "protocol", "seeds", "checkpoints", "group"))
    _check_fields(path, "[data]: ", d.get("data", {}), DATA_FIELDS)
    if "seed" in d.get("data", {}) and d["data"].get("source") != "synthetic":  # as data prepare's --seed
        raise ValueError(f"{path}: [data]: seed applies to the synthetic source only, got source "
                         f"{d['data'].get('source')!r}")  # fmt: skip
    _check_fields(path, "[eval]: ", d.get("eval", {}), EVAL_FIELDS)
    _check_overrides(path, "[overrides]", d["protocol"], flatten(d.get("overrides", {})))
    runs: list[RunSpec] = []
    for i, g in enumerate(d["group"]):
        _check_fields(path, f"group {i}: ", g, GROUP_FIELDS, ("operators",))
        seeds = g.get("seeds", d["seeds"])
        # key by key (a group's [overrides] table never drops the suite's other keys of a section)
        overrides = {**flatten(d.get("overrides", {})), **flatten(g.get("overrides", {}))}
        _check_overrides(path, f"group {i}", g.get("protocol", d["protocol"]), overrides)
        arithmetic = g.get("arithmetic", d.get("arithmetic"))
        for template in g["operators"]:
            if "K" in g and "{K}" not in template:  # each K would repeat the same runs
                raise ValueError(f"{path}: group {i}: operator {template!r} has no {{K}} placeholder, but "
                                 f"the group gives K = {g['K']} (put operators without {{K}} in a group of "
                                 "their own)")  # fmt: skip
            for K in g.get("K", [None]):
                try:
                    op = _operator(template, K, arithmetic)
                except ValueError as err:
                    raise ValueError(f"{path}: group {i}: {err}") from None
                if op == SDPA:  # the one operator a model option can rule out (softcap, sinks)
                    _check_overrides(path, f"group {i}: operator {op!r}", g.get("protocol", d["protocol"]),
                                     overrides, operator=op)  # fmt: skip
                for seed in seeds:
                    runs.append(
                        RunSpec(
                            run_id=f"{safe_operator(op)}-s{seed}",
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
        variants = any(
            len({repr(sorted(r.overrides.items())) for r in runs if r.run_id == x}) > 1 for x in dup
        )
        raise ValueError(
            f"{path}: duplicate runs {dup} (same operator and seed twice)"
            + (
                "; a run id names the operator and seed, not a group's overrides: put the variant in a suite "
                "file of its own, run it into another --out and report both folders together"
                if variants
                else ""
            )
        )
    return Suite(
        name=d["name"],
        title=d.get("title", d["name"]),
        protocol=d["protocol"],
        corpus=d.get("corpus", ""),
        runs=tuple(runs),
        data=d.get("data", {}),
        eval=d.get("eval", {}),
        source=str(path),
        corpus_source=d.get("corpus_source", ""),
    )


def _check_overrides(
    path: Path, where: str, protocol: str, overrides: dict, operator: str | None = None
) -> None:
    """``overrides`` set none of :data:`RUN_FIELDS`, and the protocol config with them applied (and with
    ``operator``, when given) is a valid training config (checked when the file is loaded, so that ``suite
    show`` and ``suite run`` name the file and the table, before anything runs)."""
    if fixed := sorted(set(overrides) & RUN_FIELDS):
        raise ValueError(f"{path}: {where}: overrides may not set {fixed}: each run sets them itself "
                         "(operators, seeds, checkpoints, the suite's data folder)")  # fmt: skip
    try:
        config = TrainConfig.from_toml(protocol)
    except (ValueError, TypeError, FileNotFoundError) as err:  # the protocol field names no config
        raise ValueError(f"{path}: protocol {protocol!r}: {err}") from None
    try:
        # data.dir: each run sets it (RUN_FIELDS); a stand-in, as validate() requires one
        own = {"data.dir": "data", **({"operator.name": operator} if operator is not None else {})}
        config.override({**overrides, **own}).validate()
    except (ValueError, TypeError, FileNotFoundError) as err:
        raise ValueError(f"{path}: {where}: {err}") from None


def _check_fields(path: Path, where: str, table: dict, fields: dict, required=()) -> None:
    """Every key of ``table`` (at ``where`` in the suite file) is known and holds what ``fields`` says."""
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ValueError(f"{path}: {where}unknown field(s) {unknown}; known: {sorted(fields)}")
    for key in required:
        if key not in table:
            raise ValueError(f"{path}: {where}missing required field {key!r}")
    for key, value in table.items():
        test, want = fields[key]
        if not test(value):
            raise ValueError(f"{path}: {where}field {key!r} must be {want}, got {value!r}")


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
