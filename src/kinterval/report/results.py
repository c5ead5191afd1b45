"""Loading suite results from files only: manifests, per-checkpoint evaluations, geometry probes, run logs.

One :class:`Point` per (run, checkpoint, evaluation tag); identity (model, operator, seed, token budget,
group) comes from the manifest, never from folder names. Several suite folders load into one list, so that a
run can be paired with a control of another folder (a supplementary run with its suite-D softmax), and suites
of one budget and corpus but other models (C: 1B, D: 124M, both 100M tokens of WikiText-103) stay apart.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kinterval.environment import ENVIRONMENT_FILE, read_environment
from kinterval.eval.evaluate import check_arrays
from kinterval.model.config import PRESETS
from kinterval.ops import OperatorSpec
from kinterval.suite.manifest import read_manifest, stopped_step
from kinterval.train.checkpoint import checkpoint_step, list_checkpoints
from kinterval.train.config import flatten
from kinterval.train.metrics import last_logged_step, read_metrics
from kinterval.train.trainer import EXECUTION_FIELDS

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - python 3.10
    import tomli as tomllib

REFERENCES = ("softmax", "sdpa")  # exact-softmax operators: the controls of every ΔNLL
# Suites whose runs are a record of single runs, never a seed distribution (App. D.4, D.5, F: "supplementary
# runs, not merged into the five-seed tables"): each seed of a condition is its own row. A suite file of
# another name opts in with ``supplementary = true``.
PER_SEED_SUITES = ("supplementary",)


def operator_spec(operator: str) -> OperatorSpec:
    """The :class:`OperatorSpec` of an operator name with overrides (``sdpa`` is softmax computed by SDPA)."""
    return OperatorSpec.parse("softmax") if operator == "sdpa" else OperatorSpec.from_full_name(operator)


def operator_family(operator: str) -> str:
    """Operator with overrides but without its K (``lerp``, ``fwm-prob[arithmetic=historical]``); a baseline
    without K (``softmax``) is its own family."""
    s = operator_spec(operator)
    if s.K is None:
        return operator
    base = str(s).rsplit("-k", 1)[0]
    extra = operator.partition("[")[2]
    return f"{base}[{extra}" if extra else base


@dataclass(frozen=True)
class Key:
    """What a table row is about: the operator with its overrides, the run's token budget, the evaluation
    data, the evaluation tag (``val``, ``test__ptb``, ``val__op-softmax``, ...), the model
    (:func:`model_label`) and, for a row of one seed of a supplementary run (:attr:`Point.per_seed`), that
    seed."""

    operator: str
    budget: int
    data: str
    tag: str
    model: str = ""
    seed: int | None = None  # None: every seed of the condition (a designed seed set)

    def setting(self) -> tuple[int, str, str, str]:
        """The key without the operator and seed: the columns of a cross-setting table."""
        return (self.budget, self.data, self.tag, self.model)


@dataclass
class Point:
    """One evaluated checkpoint of one run."""

    suite: str
    run_id: str
    group: str
    operator: str
    seed: int
    budget: int  # the run's planned training tokens
    step: int
    tokens: int  # training tokens at this checkpoint
    tag: str  # evaluation folder name under RUN/eval/
    data: tuple  # (data folder name, split, T, n_blocks): what must match for a paired comparison
    nll: np.ndarray  # per-block NLL
    operator_used: str = ""  # differs from ``operator`` for an operator-substitution evaluation
    docs: dict = field(default_factory=dict)  # doc_ids, doc_nll, doc_tokens when evaluated with clusters
    geometry: dict = field(default_factory=dict)  # layer-mean geometry, when probed
    primary: bool = True  # the suite's own evaluation (manifest eval_dir), not a held-out one
    # The design: the seeds the loaded manifests plan for this operator at this token budget (a crashed or
    # unevaluated run's seed included); empty for a point built without a manifest.
    design_seeds: tuple[int, ...] = ()
    model: str = ""  # the model shape (:func:`model_label`): runs of other models are never paired
    options: tuple[str, ...] = ()  # its attention options (:func:`model_options`): () for GPT-2's attention
    per_seed: bool = False  # a supplementary run: its contrasts are one row per seed, never pooled over seeds
    device_name: str = ""  # the GPU (or CPU) model the evaluation ran on; "" in files that do not record it
    # (step, training tokens) at which the trainer stopped the run with a non-finite loss (its status.json);
    # None for a run that completed or is still training
    stopped: tuple[int, int] | None = None
    # passes over its train split the checkpoint was trained on (> 1: a multi-epoch run); None when the
    # evaluation does not record it
    passes: float | None = None
    shards: tuple[str, ...] = ()  # the evaluated split's shard hashes (its request); () when not recorded
    # the run's training protocol: every field of its manifest row's config but the execution fields, its
    # seed and operator (:func:`protocol_of`); runs of one model and budget under two are never paired
    protocol: tuple = ()
    # a short hash of the training data the evaluated checkpoint records (:func:`train_data_hash`); "" when
    # the evaluation does not record it
    train_data: str = ""
    # the suite folder it was loaded from: two folders of one suite (two sittings, unmerged) hold runs of the
    # same id, whose logs and probes are each their own
    folder: str = ""
    # training tokens of the run's last checkpoint (a completed status.json, or its checkpoint folders),
    # evaluated or not: the endpoint of a row counts them (:func:`at_endpoint`); 0 if stopped or unknown
    reached: int = 0

    @property
    def mean(self) -> float:
        return float(self.nll.mean())

    @property
    def spec(self) -> OperatorSpec:
        return operator_spec(self.operator)

    @property
    def K(self) -> int | None:
        return self.spec.K

    @property
    def family(self) -> str:
        """Operator with overrides but without its K: ``lerp``, ``fwm-prob[arithmetic=historical]``."""
        return operator_family(self.operator)

    @property
    def is_reference(self) -> bool:
        return self.operator in REFERENCES

    @property
    def key(self) -> Key:
        seed = self.seed if self.per_seed else None
        return Key(self.operator, self.budget, data_label(self.data), self.tag, self.model, seed)

    @property
    def identity(self) -> tuple:
        """The run's identity across folders: model, operator, seed, budget and evaluation data."""
        return (self.model, self.operator, self.seed, self.budget, self.data)


def data_label(data: tuple) -> str:
    name, split, T, n = data
    return f"{name}:{split} (T={T}, {n} blocks)"


def model_label(config: dict) -> str:
    """The model shape of a manifest row's training config, ``"12L 12H d768"`` (a preset's value where the
    config leaves a field unset), with the attention options that are set (``"6L 6H d384 2KV softcap30
    sinks rope10000"``: grouped-query heads, softcap, sinks, rotary positions); "" without one."""
    shape, options = _model_parts(config)
    return " ".join([shape, *options]) if shape else ""


def model_options(config: dict) -> tuple[str, ...]:
    """The attention options of :func:`model_label` alone (``("2KV", "sinks", "rope10000")``; () for none)."""
    return _model_parts(config)[1]


def _model_parts(config: dict) -> tuple[str, tuple[str, ...]]:
    m = config.get("model") or {}
    base = PRESETS.get(m.get("preset"))

    def get(k):
        return m.get(k) if m.get(k) is not None else getattr(base, k, None)

    shape = [get(k) for k in ("n_layer", "n_head", "n_embd")]
    if None in shape:
        return "", ()
    kv, cap, theta = get("n_kv_head"), get("attn_softcap"), get("rope_theta")
    options = [
        f"{kv}KV" if kv not in (None, shape[1]) else "",
        f"softcap{cap:g}" if cap is not None else "",
        "sinks" if get("attn_sinks") else "",
        f"rope{theta:g}" if theta is not None else "",
    ]
    return "{}L {}H d{}".format(*shape), tuple(filter(None, options))


NOT_PROTOCOL = EXECUTION_FIELDS | {"seed", "operator.name"}  # a run's own, not its setting's


def protocol_of(row: dict) -> tuple:
    """What a manifest row's training config sets beyond its seed, operator and execution fields (the
    optimizer, schedule, model and numerics), with its optimizer ``steps`` (the batch: micro-batch, accum and
    world size are execution fields, their product is not), as sorted (field, value) pairs."""
    config = row.get("config")
    flat = flatten(config) if isinstance(config, dict) else {}
    flat = {k: v for k, v in flat.items() if k not in NOT_PROTOCOL} | {"steps": row.get("steps")}
    return tuple(sorted((k, json.dumps(_whole(v))) for k, v in flat.items()))


def _whole(v):
    """A whole float as the integer it equals (``10000.0`` -> ``10000``, as a config or a resume compares
    them: ``rope_theta = 10000`` and ``10000.0`` are one protocol), in lists too; anything else as it is."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return [_whole(x) for x in v] if isinstance(v, list) else v


@dataclass
class RunRecord:
    """What a run folder records of where and how long it trained (the hardware table)."""

    run_id: str
    group: str
    operator: str
    sessions: list[dict]  # the lines of its environment.jsonl, one per training session; [] when not recorded
    train_s: float | None  # status.json's train_s (training wall time over all sessions); None: not recorded
    world_size: int | None  # run_config.json's world_size; None: not recorded


@dataclass
class SuiteResults:
    suite: str
    title: str
    dir: Path
    manifest: dict
    points: list[Point]
    logs: dict[str, list[dict]] = field(default_factory=dict)  # run_id -> metrics.jsonl rows
    graddiag: dict[str, list[dict]] = field(default_factory=dict)  # run_id -> `kinterval graddiag` outputs
    # runs the trainer stopped with a non-finite loss before any evaluated checkpoint (no Point carries them):
    # run_id -> operator, seed, budget, model, step, tokens
    stopped_unevaluated: dict[str, dict] = field(default_factory=dict)
    # the manifest's runs that have a run folder, in manifest order: run_id -> its machine and training time
    records: dict[str, RunRecord] = field(default_factory=dict)

    def runs(self) -> dict[str, list[Point]]:
        out: dict[str, list[Point]] = {}
        for p in self.points:
            if p.primary:
                out.setdefault(p.run_id, []).append(p)
        return {k: sorted(v, key=lambda p: p.step) for k, v in out.items()}


def _json(path: Path) -> dict:
    """A result file's JSON object (evaluation summary, probe, diagnostic); ValueError naming the file."""
    try:
        obj = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"{path}: corrupt, not JSON ({err}); `kinterval suite gate` checks every file"
        ) from None
    if not isinstance(obj, dict):
        raise ValueError(
            f"{path}: not a JSON object ({type(obj).__name__}); `kinterval suite gate` checks every file"
        )
    return obj


def _passes(value) -> float | None:
    """An evaluation's ``train_passes``: a positive finite number, else None (not recorded, or not valid)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")
    return float(value) if ok else None


def _shards(request) -> tuple[str, ...]:
    """The shard hashes an evaluation's request records, () when it records none."""
    shards = request.get("shards_sha256") if isinstance(request, dict) else None
    return tuple(shards) if isinstance(shards, list) and all(isinstance(x, str) for x in shards) else ()


def train_data_hash(summary: dict) -> str:
    """A short hash of the training data an evaluation summary records (``train_data``: vocabulary, split,
    token count and shard hashes of what the checkpoint trained on), "" when it records none."""
    data = summary.get("train_data")
    if not isinstance(data, dict):
        return ""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:8]


def _nll_arrays(npz: Path) -> tuple[np.ndarray, dict]:
    try:
        with np.load(npz) as z:
            nll = z["nll"].astype(np.float64)
            docs = {k: z[k] for k in ("doc_ids", "doc_nll", "doc_tokens") if k in z.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:
        raise ValueError(
            f"{npz}: unreadable per-block arrays ({type(err).__name__}: {err}); "
            "`kinterval suite gate` checks every file"
        ) from None
    for name, x in (("nll", nll), ("doc_nll", docs.get("doc_nll")), ("doc_tokens", docs.get("doc_tokens"))):
        if x is not None and not np.all(np.isfinite(x)):
            i = int(np.flatnonzero(~np.isfinite(x))[0])
            raise ValueError(
                f"{npz}: '{name}' holds a non-finite value ({x[i]}) at index {i}; "
                "`kinterval suite gate` checks every file"
            )
    return nll, docs


def _number(value, minimum: float) -> float | None:
    """A recorded number (not a bool, finite, at least ``minimum``), else None."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and minimum <= value < float("inf")
    return value if ok else None


def _run_record(run_dir: Path, run: dict) -> RunRecord:
    """The run's training machine (``environment.jsonl``), ``train_s`` (``status.json``) and world size
    (``run_config.json``), each None or [] where the folder does not record it."""
    status = run_dir / "status.json"
    train_s = _number(_json(status).get("train_s"), 0) if status.is_file() else None
    config = run_dir / "run_config.json"
    world = _number(_json(config).get("world_size"), 1) if config.is_file() else None
    return RunRecord(
        run_id=run["run_id"],
        group=run["group"],
        operator=run["operator"],
        sessions=read_environment(run_dir / ENVIRONMENT_FILE),
        train_s=None if train_s is None else float(train_s),
        world_size=None if world is None or world != int(world) else int(world),
    )


def _trained_steps(run_dir: Path, run: dict, eval_steps: list[int]) -> tuple[int, str] | None:
    """The step count of a run that finished training, and where that is read: ``status.json`` when it says
    "completed", else the manifest's planned ``steps`` when a checkpoint at that step was evaluated. None for
    a run still training or stopped early (its log may end anywhere)."""
    status = run_dir / "status.json"
    if status.is_file():
        st = _json(status)
        if st.get("status") == "completed":
            if isinstance(st.get("step"), bool) or not isinstance(st.get("step"), int):
                raise ValueError(f"{status}: a completed run without a valid 'step' ({st.get('step')!r})")
            return st["step"], f"{status.name} of the completed run"
    planned = run.get("steps")
    if isinstance(planned, int) and planned in eval_steps:
        return planned, f"its checkpoint at step {planned} is evaluated"
    return None


def _reached(run_dir: Path, run: dict) -> int:
    """Training tokens of the run's last checkpoint, evaluated or not: a completed ``status.json``'s, else its
    latest checkpoint folder's step times the manifest's tokens per step; 0 when neither says."""
    status = run_dir / "status.json"
    st = _json(status) if status.is_file() else {}
    tokens = st.get("tokens")
    if st.get("status") == "completed" and isinstance(tokens, int) and not isinstance(tokens, bool):
        return tokens
    ckpts = list_checkpoints(run_dir)
    steps = int(run.get("steps") or 0)
    step = checkpoint_step(ckpts[-1]) if ckpts else None
    return step * int(run.get("tokens") or 0) // steps if step and steps else 0


def _stopped(run_dir: Path, run: dict) -> tuple[int, int] | None:
    """(step, training tokens) of the non-finite loss that stopped the run, from its ``status.json`` (the
    tokens from the manifest's tokens per step where the status has none)."""
    path = run_dir / "status.json"
    n = stopped_step(_json(path) if path.is_file() else None)
    if n is None:
        return None
    tokens = _json(path).get("tokens")
    if isinstance(tokens, bool) or not isinstance(tokens, int):
        tokens = n * int(run.get("tokens") or 0) // max(1, int(run.get("steps") or 1))
    return n, tokens


def _read_logs(run_dir: Path, run: dict, eval_steps: list[int]) -> list[dict]:
    """The rows of the run's metrics.jsonl. A torn last line (a run killed mid-write) is left out; a log that
    stops short of the last step of a run that finished training is refused (the trainer always logs the last
    step): the clip statistics and validation rows would describe its first steps only."""
    rows = read_metrics(run_dir)
    path = run_dir / "metrics.jsonl"
    trained = _trained_steps(run_dir, run, eval_steps) if path.is_file() else None
    if trained is not None:
        last = last_logged_step(rows)
        n, source = trained
        if last is None or last < n:
            ends = "it holds no logged step" if last is None else f"its last row is step {last}"
            raise ValueError(
                f"{path}: truncated: {ends}, but the run trained {n} steps ({source}); the rows after "
                f"step {last or 0} are missing"
            )
    return rows


def load_results(suite_dir: str | Path) -> SuiteResults:
    """Every evaluation (all tags) of every run of the suite folder ``suite_dir``."""
    suite_dir = Path(suite_dir)
    m = read_manifest(suite_dir)
    per_seed = m["suite"] in PER_SEED_SUITES or bool(
        tomllib.loads(m.get("suite_toml") or "").get("supplementary")
    )
    points, logs, graddiag, unevaluated, records = [], {}, {}, {}, {}
    planned: dict[tuple, set[int]] = {}  # (model, operator, budget) -> the seeds the manifest plans
    for r in m["runs"]:
        planned.setdefault(_plan(r), set()).add(int(r["seed"]))
    for r in m["runs"]:
        run_dir = suite_dir / r["run_dir"]
        if run_dir.is_dir():
            records[r["run_id"]] = _run_record(run_dir, r)
        primary_tag = Path(r["eval_dir"]).name
        geo_dir = run_dir / "diagnostics" / "geometry"
        gd_files = sorted((run_dir / "diagnostics" / "graddiag").glob("step_*.json"))
        gd = [_json(f) for f in gd_files]
        for f, d in zip(gd_files, gd):
            if isinstance(d.get("step"), bool) or not isinstance(d.get("step"), int):
                raise ValueError(f"{f}: no valid 'step' ({d.get('step')!r})")
        if gd:
            graddiag[r["run_id"]] = sorted(gd, key=lambda d: d["step"])
        budget = int(r.get("tokens") or 0)
        stopped = _stopped(run_dir, r)
        reached = 0 if stopped is not None else _reached(run_dir, r)
        eval_steps = []  # the run's evaluated checkpoints, all tags
        for js in sorted((run_dir / "eval").glob("*/step_*.json")):
            s = _json(js)
            npz = js.with_suffix(".npz")
            if not npz.is_file():
                raise ValueError(f"{js}: its per-block arrays {npz.name} are missing")
            check_arrays(js, s)
            if Path(str(s.get("run_dir", run_dir.name))).name != run_dir.name:
                raise ValueError(
                    f"{js}: an evaluation of run {s['run_dir']!r}, not of {r['run_dir']} (a moved or swapped "
                    "file); `kinterval suite gate` checks every file"
                )
            nll, docs = _nll_arrays(npz)
            tag = js.parent.name
            geo = {}
            gj = geo_dir / js.name
            if tag == primary_tag and gj.is_file():
                geo = _json(gj).get("mean", {})
                if not isinstance(geo, dict):
                    raise ValueError(f"{gj}: 'mean' is not a JSON object")
            data = (Path(str(s.get("data_dir", ""))).name, s.get("split"), s.get("T"), int(nll.size))
            try:
                step, tokens = int(s["step"]), int(s.get("tokens", 0))
            except (KeyError, TypeError, ValueError) as err:
                raise ValueError(f"{js}: no valid step / tokens ({err!r})") from None
            eval_steps.append(step)
            points.append(
                Point(
                    suite=m["suite"],
                    folder=str(suite_dir),
                    run_id=r["run_id"],
                    group=r["group"],
                    operator=r["operator"],
                    seed=int(r["seed"]),
                    budget=budget,
                    step=step,
                    tokens=tokens,
                    tag=tag,
                    data=data,
                    nll=nll,
                    operator_used=s.get("operator_used", r["operator"]),
                    docs=docs,
                    geometry=geo,
                    primary=tag == primary_tag,
                    design_seeds=tuple(sorted(planned[_plan(r)])),
                    model=model_label(r.get("config") or {}),
                    options=model_options(r.get("config") or {}),
                    per_seed=per_seed,
                    device_name=str(s.get("device_name") or ""),
                    stopped=stopped,
                    passes=_passes(s.get("train_passes")),
                    shards=_shards(s.get("request")),
                    protocol=protocol_of(r),
                    train_data=train_data_hash(s),
                    reached=reached,
                )
            )
        logs[r["run_id"]] = _read_logs(run_dir, r, eval_steps)
        if stopped is not None and not any(p.run_id == r["run_id"] and p.primary for p in points):
            unevaluated[r["run_id"]] = dict(
                operator=r["operator"],
                seed=int(r["seed"]),
                budget=budget,
                model=model_label(r.get("config") or {}),
                protocol=protocol_of(r),
                step=stopped[0],
                tokens=stopped[1],
            )
    return SuiteResults(
        m["suite"], m.get("title", m["suite"]), suite_dir, m, points, logs, graddiag, unevaluated, records
    )


def _plan(row: dict) -> tuple:
    """What a manifest row plans seeds for: its model, operator and token budget."""
    return (model_label(row.get("config") or {}), row["operator"], int(row.get("tokens") or 0))


def load_many(dirs) -> list[SuiteResults]:
    """Several suite folders; a run (model, operator, seed, budget, data) found in two folders is an error.
    Other corpora under one data folder name are told apart (:func:`_name_corpora_apart`), never paired, and
    so are runs trained under other protocols or on other data (:func:`_name_protocols_apart`,
    :func:`_name_training_data_apart`). A condition's design seeds are those every folder plans for it
    (``mini`` and ``mini-seeds`` together). A folder given twice (``d`` and ``d/``, or through a link) is an
    error: its runs would count twice, as seeds of their own."""
    dirs, given = [Path(d) for d in dirs], {}
    for d in dirs:
        key = d.resolve()
        if key in given:
            raise ValueError(
                f"suite folder {key} is given twice (as {given[key]} and {d}); its runs would count twice"
            )
        given[key] = d
    out = [load_results(d) for d in dirs]
    _name_protocols_apart(out)
    _name_training_data_apart(out)
    planned: dict[tuple, set[int]] = {}
    for res in out:
        for p in res.points:
            planned.setdefault((p.model, p.operator, p.budget), set()).update(p.design_seeds)
    for res in out:
        for p in res.points:
            p.design_seeds = tuple(sorted(planned[(p.model, p.operator, p.budget)]))
    _name_corpora_apart(out)
    seen: dict[tuple, Path] = {}
    for res in out:
        for run_id, pts in res.runs().items():
            p = pts[0]
            if p.identity in seen and seen[p.identity] != res.dir:
                raise ValueError(
                    f"run {run_id} ({p.operator}, seed {p.seed}, {p.budget} tokens, model {p.model}, "
                    f"data {data_label(p.data)}) is in both {seen[p.identity]} and {res.dir}; "
                    "give each run once"
                )
            seen[p.identity] = res.dir
    return out


def _name_corpora_apart(results: list[SuiteResults]) -> None:
    """Evaluations of other corpora under one data label (folder name, split, T, block count), e.g. two suite
    folders that each prepared their own ``OUT/data`` from another source or seed, are never paired: where
    one label holds evaluations of more than one split content (the shard hashes their requests record),
    each content's label gets a short hash of its shards (``data#1a2b3c4d:val (T=64, 128 blocks)``).
    Evaluations that record no shard hashes keep the plain label."""
    contents: dict[tuple, set[tuple[str, ...]]] = defaultdict(set)
    for res in results:
        for p in res.points:
            if p.shards:
                contents[p.data].add(p.shards)
    for res in results:
        for p in res.points:
            if p.shards and len(contents[p.data]) > 1:
                name, *rest = p.data
                short = hashlib.sha256("\n".join(p.shards).encode()).hexdigest()[:8]
                p.data = (f"{name}#{short}", *rest)


def _name_training_data_apart(results: list[SuiteResults]) -> None:
    """Runs of one model and token budget trained on other data (two folders that each prepared their own
    corpus, evaluated on one validation split) are other settings, never paired: where one model label and
    budget hold evaluations of checkpoints trained on more than one corpus (:func:`train_data_hash`), each
    such point's model label gets its training data's hash (``2L 2H d64 [train data#1a2b3c4d]``).
    Evaluations that record no training data keep the plain label."""
    hashes: dict[tuple, set[str]] = defaultdict(set)
    for res in results:
        for p in res.points:
            if p.train_data:
                hashes[(p.model, p.budget)].add(p.train_data)
    for res in results:
        for p in res.points:
            if p.train_data and len(hashes[(p.model, p.budget)]) > 1:
                p.model = f"{p.model} [train data#{p.train_data}]"


def _name_protocols_apart(results: list[SuiteResults]) -> None:
    """Runs of one model and token budget trained under other protocols (another learning rate, warmup, batch
    or numerics: a suite file of a second folder that does not repeat the first one's overrides) are other
    settings, never paired: where one model label and budget hold more than one protocol
    (:func:`protocol_of`), each such run's model label gets the fields that differ, with its values
    (``2L 2H d64 [optim.lr=0.001]``)."""
    points = [p for res in results for p in res.points]
    stopped = [u for res in results for u in res.stopped_unevaluated.values()]
    items = [(p.model, p.budget, p.protocol) for p in points] + [
        (u["model"], u["budget"], u["protocol"]) for u in stopped
    ]
    protocols: dict[tuple, set[tuple]] = defaultdict(set)
    for model, budget, protocol in items:
        protocols[(model, budget)].add(protocol)

    def label(model: str, budget: int, protocol: tuple) -> str:
        group = [dict(p) for p in protocols[(model, budget)]]
        if len(group) < 2:
            return model
        keys = sorted({k for g in group for k in g})
        own = dict(protocol)
        differ = [k for k in keys if len({g.get(k) for g in group}) > 1]
        return "{} [{}]".format(model, ", ".join(f"{k}={own.get(k, '-')}" for k in differ))

    for p in points:
        p.model = label(p.model, p.budget, p.protocol)
    for u in stopped:
        u["model"] = label(u["model"], u["budget"], u["protocol"])
