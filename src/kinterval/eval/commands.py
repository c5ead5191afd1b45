"""``kinterval eval``, ``geometry``, ``graddiag``, ``tau-screen``, ``fp8-backward`` and ``sample``."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from kinterval.arglists import Extend, check_no_empty_item, numbers
from kinterval.train.commands import set_threads, with_sets


def _eval(args: argparse.Namespace) -> int:
    from kinterval.eval.evaluate import evaluate_run

    set_threads(args.threads)

    rows = evaluate_run(
        args.run,
        checkpoint=args.checkpoint,
        operator=args.operator,
        split=args.split,
        data=args.data,
        out_dir=args.out,
        doc_clusters=args.doc_clusters,
        device=args.device,
        max_blocks=args.max_blocks,
        force=args.force,
        progress=not args.quiet and sys.stderr.isatty(),  # no bar in a log file or pipe
    )
    for r in rows:
        extra = f" (override of {r['operator_trained']})" if r["operator_override"] else ""
        docs = f"  doc-cluster {r['doc_cluster_mean_nll']:.4f}" if "doc_cluster_mean_nll" in r else ""
        if "n_documents" in r and not docs:  # a cluster bootstrap needs two documents
            docs = f"  doc-cluster - ({r['n_documents']} document{'s' * (r['n_documents'] != 1)}: needs 2)"
        if r.get("n_documents_split", r.get("n_documents")) != r.get("n_documents"):
            docs += f" ({r['n_documents']} of the split's {r['n_documents_split']} documents scored)"
        state = "cached" if r["skipped"] else "evaluated"
        print(
            f"{r['checkpoint']}  step {r['step']:>7}  {r['operator_used']}{extra}  {r['split']}  "
            f"{r['n_blocks']} blocks  mean NLL {r['mean_nll']:.4f} nats/token{docs}  [{state}]"
        )
    for trained in sorted({r["operator_trained"] for r in rows if r["operator_override"]}):
        if _same_forward(trained, args.operator):
            print(
                f"kinterval eval: note: {args.operator} differs from the run's {trained} only in range_grad, "
                "which changes the backward alone: these evaluations repeat the run's own forward",
                file=sys.stderr,
            )
    _written(rows)
    return 0


def _written(rows: list[dict]) -> None:
    """Name the folder(s) the results of ``rows`` are in, as the other commands name theirs."""
    for folder in sorted({str(Path(r["path"]).parent) for r in rows if "path" in r}):
        print(f"written to {folder}")


def _same_forward(trained: str, used: str) -> bool:
    """Whether two K-interval operators differ only in ``range_grad`` (which acts in the backward alone)."""
    from kinterval.ops import OperatorSpec

    try:
        a, b = OperatorSpec.from_full_name(trained), OperatorSpec.from_full_name(used)
    except ValueError:  # sdpa, or a name the evaluation itself would have refused
        return False
    return a != b and a.is_kinterval and OperatorSpec.parse(b, range_grad=a.range_grad) == a


def _diag(kind: str):
    def run(args: argparse.Namespace) -> int:
        from kinterval.eval.diagnostics import diagnose_run

        set_threads(args.threads)
        kw = {"spec": args.as_operator} if kind == "geometry" else {}
        if kw.get("spec") is not None:  # --as defines h, buckets and TV: a baseline has none (all NaN)
            from kinterval.ops import OperatorSpec

            try:
                spec = OperatorSpec.from_full_name(args.as_operator)
            except ValueError as err:
                raise ValueError(f"--as: {err}") from None
            if not spec.is_kinterval:
                got = args.as_operator
                raise ValueError(
                    f"--as must name a K-interval operator (it defines h, buckets, TV), got {got!r}"
                )
        rows = diagnose_run(
            args.run,
            kind,
            checkpoint=args.checkpoint,
            blocks=args.blocks,
            data=args.data,
            split=args.split,
            out_dir=args.out,
            device=args.device,
            force=args.force,
            **kw,
        )
        for r in rows:
            mean = "  ".join(f"{k} {v:.4g}" for k, v in r["mean"].items())
            print(f"{r['checkpoint']}  step {r['step']}  {r['operator']}  layer mean: {mean}")
        _written(rows)
        return 0

    return run


def _tau_screen(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    from kinterval import atomic
    from kinterval.data.loader import n_blocks
    from kinterval.eval.checkpoints import evaluation_split, pick_device, run_folder, select_checkpoints
    from kinterval.eval.tau_screen import (
        PAPER_STAGES,
        Stage,
        contrasts,
        fwm_spec,
        run_stage,
        save_per_block,
        screen_numerics,
        stage3_table,
    )
    from kinterval.train.checkpoint import read_state
    from kinterval.train.load import load_run

    for flag, value, least in (  # each contrast's block bootstrap needs a series of at least 2 blocks
        ("--subset-blocks", args.subset_blocks, 2),
        ("--max-blocks", args.max_blocks, 2),
        ("--resamples", args.resamples, 1),
    ):
        if value is not None and value < least:  # --max-blocks 0 used to mean "no cap"
            raise ValueError(f"{flag} must be an integer >= {least}, got {value}")
    if args.checkpoint == "all":
        raise ValueError("--checkpoint: the tau screen takes one checkpoint (latest or a step), got 'all'")
    stages = []  # every stage, K and tau checked before the model is loaded
    for name in args.stages.split(","):
        st = {s.name: s for s in PAPER_STAGES}.get(name)
        if st is None:
            raise ValueError(f"unknown stage {name!r}; choose from {sorted(s.name for s in PAPER_STAGES)}")
        blocks = args.subset_blocks if st.blocks is not None else args.max_blocks
        st = Stage(st.name, st.tail, tuple(args.K or st.K), tuple(args.taus or st.taus), blocks, st.minmax)
        for flag, values in (("--K", st.K), ("--taus", st.taus)):
            if len(set(values)) < len(values):  # each would be screened twice, its rows and columns doubled
                raise ValueError(f"{flag} names a value twice: {', '.join(map(str, values))}")
        for K in st.K:
            for tau in st.taus:
                try:
                    fwm_spec(K, tau, args.reconstruction)  # ValueError on a K or tau outside the family
                except ValueError as err:  # the spec's own message names the screen's operator, not a flag
                    reason = str(err).split(" (operator ")[0]
                    raise ValueError(f"--K {K} --taus {tau:g} (stage {st.name}): {reason}") from None
        stages.append(st)
    ckpt = select_checkpoints(args.run, args.checkpoint)[-1]
    state = read_state(ckpt)
    shards = evaluation_split(args.data, args.split, state, ckpt)  # checked before the model loads
    default = "tau_screen" if args.reconstruction == "nearest" else f"tau_screen__{args.reconstruction}"
    out = Path(args.out) if args.out else run_folder(args.run) / "diagnostics" / default
    info = shards.meta["splits"][shards.split]
    data = {"split": shards.split, "shards_sha256": [x.get("sha256") for x in info["shards"]]}  # by content
    screens = {st.name: {"checkpoint": str(ckpt), **data, "tail": st.tail, "K": list(st.K),
                         "taus": [float(t) for t in st.taus], "blocks": st.blocks,
                         "reconstruction": args.reconstruction} for st in stages}  # fmt: skip
    for name, screen in screens.items():  # a stage of other options is not replaced silently
        if not args.force:
            _refuse_other_screen(out / f"stage{name}.json", screen)
    loaded = load_run(ckpt, device=pick_device(args.device), backend="closed_form")  # the screen forms P
    model = loaded.model
    if model.operator not in ("softmax", "sdpa"):
        warnings.warn(
            f"{ckpt} was trained with {model.operator}, not softmax; screening it anyway", stacklevel=1
        )
    shards.check_vocab(model.config.vocab_size)
    tokens = shards.tokens()
    T = model.config.block_size
    if n_blocks(len(tokens), T) < 2:  # before any stage is computed, as the flags above
        raise ValueError(f"the {args.split} split holds fewer than 2 blocks of {T}+1 tokens; the CIs need 2")
    out.mkdir(parents=True, exist_ok=True)
    for st in stages:
        res = run_stage(model, tokens, st, reconstruction=args.reconstruction, progress=print)
        # stageN.json marks a finished stage: the old one (and the old tables) go before the arrays are
        # replaced, and it is written last, recording the arrays' sha256; every file is written atomically.
        # A kill leaves no stageN.json describing other arrays than stageN.npz.
        for ext in ("json", "md", "tex"):
            (out / f"stage{st.name}.{ext}").unlink(missing_ok=True)
        per_block = save_per_block(res, out / f"stage{st.name}.npz")  # kept before any statistic is formed
        record = {
            **screens[st.name],
            "stage": st.name,
            "trained_operator": getattr(model.operator, "full_name", model.operator),  # App. C.3: softmax
            **screen_numerics(model),  # device and the numerics, as an evaluation summary names them
            "nll": res.nll,
            "contrasts": contrasts(res, n_resamples=args.resamples),  # each condition - softmax [CI]
            "per_block": per_block.name,
            "per_block_sha256": atomic.sha256_file(per_block),
        }
        if not st.minmax:
            record["best_tau"] = {str(K): res.best_tau(K) for K in st.K}
            print(f"stage {st.name} ({st.tail} tail): best tau per K {record['best_tau']}")
        else:
            md, rows = stage3_table(res, n_resamples=args.resamples)
            tex, _ = stage3_table(res, n_resamples=args.resamples, fmt="tex")
            record["table"] = rows
            atomic.write_text(out / f"stage{st.name}.md", md)
            atomic.write_text(out / f"stage{st.name}.tex", tex)
            print(md)
        atomic.write_json(out / f"stage{st.name}.json", record, default=float)
    print(f"written to {out}")
    return 0


def _refuse_other_screen(path: Path, screen: dict) -> None:
    """A ``ValueError`` when the stage record at ``path`` was screened with other options than ``screen``
    (checkpoint, data, tail, K, taus, blocks, reconstruction; a field an older record lacks is not
    compared)."""
    import json

    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):  # none, or unreadable: nothing to keep
        return
    if not isinstance(old, dict):
        return
    diffs = [f"{k} {old[k]!r} -> {v!r}" for k, v in screen.items() if k in old and old[k] != v]
    if diffs:
        raise ValueError(
            f"{path} was screened with other options ({'; '.join(diffs)}); pass --force to replace it, or "
            "--out for another folder"
        )


def _sample(args: argparse.Namespace) -> int:
    import json

    from kinterval.eval.sample import sample_run

    if args.tokens < 0:  # generate() names its parameter, max_new_tokens
        raise ValueError(f"--tokens must be an integer >= 0, got {args.tokens}")
    if args.top_k < 0:  # sample_run's own message names its unset value (None), not this option's 0
        raise ValueError(f"--top-k must be an integer >= 0 (0: no top-k cut), got {args.top_k}")
    ids = None
    if args.prompt_ids is not None:
        try:
            check_no_empty_item(args.prompt_ids)
            ids = [int(x) for x in args.prompt_ids.replace(",", " ").split()]
        except (ValueError, argparse.ArgumentTypeError):
            raise ValueError(f"--prompt-ids takes integers, got {args.prompt_ids!r}") from None
    rows = sample_run(
        args.run,
        prompt=args.prompt,
        prompt_ids=ids,
        max_new_tokens=args.tokens,
        temperature=args.temperature,
        top_k=args.top_k or None,
        samples=args.samples,
        seed=args.seed,
        checkpoint=args.checkpoint,
        operator=args.operator,
        device=args.device,
    )
    if args.json:
        print(json.dumps(rows))
        return 0
    for i, row in enumerate(rows):
        if i:
            print("-" * 40)
        print(row["text"] if row["text"] is not None else " ".join(map(str, row["ids"])))
    return 0


def _common(p, *, checkpoint="all") -> None:
    p.add_argument("--run", required=True, help="run folder (holds checkpoints/)")
    choices = "all | latest | STEP" if checkpoint == "all" else "latest | STEP"
    p.add_argument(
        "--checkpoint", default=checkpoint, help=f"{choices} | a checkpoint folder (default {checkpoint})"
    )
    p.add_argument("--split", default="val", help="split of the data folder (val, test, ...; default val)")
    p.add_argument("--data", default=None, help="prepared data folder (default: the run's training data)")
    p.add_argument("--out", default=None, help="output folder (default: inside the run folder)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")


def register(subparsers) -> None:
    p = subparsers.add_parser("eval", help="per-block validation NLL of a run's checkpoints (resumable)")
    _common(p)
    p.add_argument("--operator", default=None, help="evaluate through this operator instead (e.g. softmax)")
    p.add_argument("--doc-clusters", action="store_true", help="also per-document NLL + document-cluster CI")
    p.add_argument("--max-blocks", type=int, default=None, help="only the first N blocks (not the protocol)")
    p.add_argument("--force", action="store_true", help="re-evaluate checkpoints that already have results")
    p.add_argument(
        "--quiet",
        "--no-progress",
        action="store_true",
        help="no progress bar (there is none when stderr is not a terminal)",
    )
    p.set_defaults(func=_eval)

    for kind, help_ in (
        ("geometry", "geometry probe (span, h, TV, ...) per layer on the first validation blocks"),
        ("graddiag", "zero-sum residual and self/M/m decomposition of the score gradient"),
    ):
        p = subparsers.add_parser(kind, help=help_)
        _common(p)
        p.add_argument("--blocks", type=int, default=8, help="first N validation blocks (default 8)")
        p.add_argument("--force", action="store_true", help="recompute existing results")
        if kind == "geometry":
            p.add_argument(
                "--as",
                dest="as_operator",
                default=None,
                help=(
                    "operator defining h/buckets/TV (default: the run's own; a softmax run has none: its h "
                    "and TV are NaN without --as)"
                ),
            )
        p.set_defaults(func=_diag(kind))

    p = subparsers.add_parser("sample", help="text generated by a run's checkpoint (temperature, top-k)")
    p.add_argument("--run", required=True, help="run folder (holds checkpoints/) or a checkpoint folder")
    p.add_argument(
        "--checkpoint", default="latest", help="latest | STEP | a checkpoint folder (default latest)"
    )
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", default=None, help="text to continue (GPT-2 runs; default <|endoftext|>)")
    prompt.add_argument("--prompt-ids", default=None, help="token ids to continue, e.g. 1,2,3 (any run)")
    p.add_argument("--tokens", type=int, default=100, help="new tokens per sample (default 100)")
    p.add_argument(
        "--temperature", type=float, default=0.8, help="0: always the most likely token (default 0.8)"
    )
    p.add_argument(
        "--top-k", type=int, default=200, help="sample among the k most likely (0: all; default 200)"
    )
    p.add_argument("--samples", type=int, default=1, help="number of samples (default 1)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--operator", default=None, help="sample through this operator instead (e.g. softmax)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    p.add_argument("--json", action="store_true", help="print the samples as JSON (ids, new_ids, text)")
    p.set_defaults(func=_sample)

    p = subparsers.add_parser(
        "tau-screen", help="inference-time tau x K screen on a frozen softmax checkpoint"
    )
    _common(p, checkpoint="latest")
    p.add_argument("--stages", default="1,2a,2b,3", help="comma-separated stages (1, 2a, 2b, 3)")
    p.add_argument(
        "--K",
        type=numbers(int),
        action=Extend,
        nargs="+",
        help="override the K values of every stage (space- or comma-separated)",
    )
    p.add_argument(
        "--taus",
        type=numbers(float),
        action=Extend,
        nargs="+",
        help="override the tau values of every stage (space- or comma-separated)",
    )
    p.add_argument("--subset-blocks", type=int, default=32, help="blocks of the subset stages (default 32)")
    p.add_argument("--max-blocks", type=int, default=None, help="cap the full-split stage (testing only)")
    p.add_argument(
        "--reconstruction",
        default="nearest",
        choices=["nearest", "lerp"],
        help="reconstruction of every screened operator and of the MinMax column (default nearest: the hard "
        "forward of the FWM-Weight/-Prob operators that tau is chosen for)",
    )
    p.add_argument(
        "--resamples", type=int, default=10_000, help="block-bootstrap resamples of the CIs (default 10000)"
    )
    p.add_argument("--force", action="store_true", help="replace stages screened with other options")
    p.set_defaults(func=_tau_screen)

    p = subparsers.add_parser(
        "fp8-backward",
        help="App. D.5: Q/K gradient norms of FP8-exp's first update under the native E4M3-cast backward",
        description="The gradient of a config's first training step at its initialization (its seed), under "
        "FP8-exp's training backward (fp32 exp derivative) and under autograd's own backward of the E4M3 "
        "cast (the gradient cast to E4M3): the L2 norms of the Q and K projection gradients.",
    )
    p.add_argument("--config", required=True, help="TOML file or shipped name (e.g. 124m-100m)")
    p.add_argument("--data", help="prepared dataset folder (config: data.dir)")
    p.add_argument("--seed", type=int, help="seed of the initialization and the first step's sequences")
    p.add_argument("--micro-batches", type=int, help="the first N micro-batches of the step (default: all)")
    p.add_argument("--device", help="cpu | cuda | cuda:N | auto (default: the config's device, as train)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a field")
    p.add_argument("--json", help="also write the result as JSON here")
    p.add_argument("--threads", type=int, help="torch CPU threads of this process")
    p.set_defaults(func=_fp8_backward)


def _fp8_backward(args: argparse.Namespace) -> int:
    import json

    from kinterval import atomic
    from kinterval.eval.fp8_backward import fp8_backward_check
    from kinterval.train.config import TrainConfig

    set_threads(args.threads)
    if args.json:
        atomic.check_target(args.json)
    given = {
        "data.dir": ("--data", args.data),
        "seed": ("--seed", args.seed),
        "device": ("--device", args.device),
    }
    flags = {field: f"{flag} {value}" for field, (flag, value) in given.items()}
    overrides = with_sets({field: value for field, (_, value) in given.items()}, flags, args.set)
    if overrides.get("operator.name") is not None:  # was silently replaced by fp8-exp
        raise ValueError(
            "--set operator.name: the check runs FP8-exp under its two backward designs, no other"
        )
    cfg = TrainConfig.from_toml(args.config).override(overrides).validate()
    res = fp8_backward_check(cfg, args.micro_batches)
    print(f"fp8-exp at seed {res['seed']} on {res['device']}, first step, {res['micro_batches']} "
          f"micro-batches ({res['sequences']} sequences)")  # fmt: skip
    print(f"{'backward':<8} {'||grad Q||':>12} {'||grad K||':>12}  finite")
    for design, r in res["designs"].items():
        print(f"{design:<8} {r['q']:>12.4g} {r['k']:>12.4g}  {r['finite']}")
    if args.json:
        atomic.write_text(args.json, json.dumps(res, indent=1, allow_nan=False) + "\n")
    return 0
