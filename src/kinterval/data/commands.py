"""``kinterval data prepare``: build a prepared dataset folder and print its splits. ``kinterval data
overlap``: n-gram overlap of one split with another (e.g. validation with training)."""

from __future__ import annotations

import argparse
import sys

from kinterval import atomic
from kinterval.data.prepare import SOURCES, prepare, summary_table


def _prepare(args: argparse.Namespace) -> int:
    if args.block_size < 1:  # before the work, not after it
        raise ValueError(f"--block-size must be positive, got {args.block_size}")
    if args.reference and not args.source.startswith("bin:"):
        raise ValueError(f"--reference applies to a bin:DIR source only, got --source {args.source}")
    meta = prepare(
        args.source,
        args.out,
        tokens=args.tokens,
        seed=args.seed,
        bpe_file=args.bpe_file,
        shard_tokens=args.shard_tokens,
        copy=not args.reference,
        progress=not args.quiet and sys.stderr.isatty(),  # no bar in a log file or pipe
        split=args.split,
        documents=args.documents,
        hf_config=args.hf_config,
        hf_split=args.hf_split,
        text_field=args.text_field,
    )
    print(f"prepared {meta['source']} -> {args.out} (vocab {meta['vocab_size']}, eot {meta['eot']})")
    print(summary_table(meta, args.block_size))
    from kinterval.data.loader import n_blocks

    for split, rec in meta.get("splits", {}).items():  # e.g. one small file: every document hashed into train
        if n_blocks(rec["n_tokens"], args.block_size) == 0:
            print(f"note: the {split} split holds no block of {args.block_size}+1 tokens ({rec['n_tokens']} "
                  f"tokens): training or evaluation on it will be refused; add documents, or prepare that "
                  f"split's own documents with --split {split}", file=sys.stderr)  # fmt: skip
    return 0


def _overlap(args: argparse.Namespace) -> int:
    from kinterval.data.overlap import split_overlap

    if args.n < 1:
        raise ValueError(f"--n must be a positive window length, got {args.n}")
    if args.block_size is not None and args.block_size < 1:
        raise ValueError(f"--block-size must be positive, got {args.block_size}")
    if args.json:  # before the work, not after it
        atomic.check_target(args.json)
    if args.block_size is not None:  # a split of no block would write a coverage file of no block
        from kinterval.data.loader import TokenShards

        checked = TokenShards(args.data, args.split)
        if checked.n_blocks(args.block_size) == 0:
            raise ValueError(
                f"--block-size {args.block_size}: the {checked.split} split of {args.data} "
                f"({checked.n_tokens} tokens) holds no evaluation block of {args.block_size}+1 tokens"
            )
    o = split_overlap(args.data, args.split, args.against, args.against_data, args.n)
    other = f"{args.against_data or args.data} {args.against}"
    d = o.to_dict()
    blocks = {}
    if args.block_size is not None:
        cover = o.block_coverage(args.block_size)
        blocks = {"block_size": args.block_size, "block_coverage": [round(float(c), 6) for c in cover]}
    if args.json:  # before the lines: `... | head` stops the printing, never the file
        where = {"data": str(args.data), "split": o.split}
        where.update(against_data=str(args.against_data or args.data), against=args.against)
        record = {**where, "shards_sha256": list(o.shards_sha256), **d, **blocks}
        atomic.write_json(args.json, record)  # a kill leaves the old file or the new one, never half
    print(f"{o.n}-gram overlap of {args.data} {args.split} ({o.tokens:,} tokens, {d['documents']} documents) "
          f"with {other} ({o.against_tokens:,} tokens)")  # fmt: skip
    print(f"windows of {o.n} tokens within a document: {o.windows:,}; also in {args.against}: {o.found:,} "
          f"({o.window_share:.1%})")  # fmt: skip
    print(f"tokens inside such a window: {o.covered:,} ({o.token_share:.1%})")
    print(f"documents with such a token: {d['documents_touched']} of {d['documents']}; with more than half "
          f"of their tokens: {d['documents_over_half']}")  # fmt: skip
    if args.block_size is not None:
        print(f"blocks of {args.block_size} tokens (as `kinterval eval` scores them) with no target inside "
              f"such a window: {int((cover == 0).sum()):,} of {cover.size:,}")  # fmt: skip
    return 0


def register(subparsers) -> None:
    data = subparsers.add_parser("data", help="prepare token datasets (uint16 shards + meta.json)")
    sub = data.add_subparsers(dest="data_command", metavar="ACTION")
    sub.required = True
    p = sub.add_parser("prepare", help="tokenize a corpus into uint16 shards + meta.json")
    p.add_argument("--source", required=True, help=f"one of: {', '.join(SOURCES)}")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--tokens", type=int, default=None, help="train-token budget (synthetic: exact size)")
    p.add_argument("--seed", type=int, default=None, help="synthetic only: the generator seed (default 0)")
    p.add_argument(
        "--bpe-file", default=None, help="GPT-2 ranks file (gpt2.tiktoken) for offline tokenization"
    )
    p.add_argument(
        "--block-size", type=int, default=1024, help="T for the printed block counts (default 1024)"
    )
    p.add_argument(
        "--shard-tokens", type=int, default=100_000_000, help="tokens per shard file (default 100,000,000)"
    )
    p.add_argument("--reference", action="store_true", help="bin:DIR only: reference the files, do not copy")
    p.add_argument(
        "--split",
        default=None,
        help="text:PATH or hf:PATH only: every document into this split (train, val or test)",
    )
    p.add_argument("--hf-config", default=None, help="hf:PATH only: the dataset's configuration (subset)")
    p.add_argument("--hf-split", default=None, help="hf:PATH only: the split to stream (default train)")
    p.add_argument("--text-field", default=None, help="hf:PATH only: the text's field (default text)")
    p.add_argument(
        "--documents", type=int, default=None, help="c4 only: the first N validation documents (default 302)"
    )
    p.add_argument(
        "--quiet",
        "--no-progress",
        action="store_true",
        help="no progress bars (there is none when stderr is not a terminal)",
    )
    p.set_defaults(func=_prepare)

    o = sub.add_parser(
        "overlap", help="n-gram overlap of a split with another (e.g. val with train): contamination"
    )
    o.add_argument("data", help="prepared data folder")
    o.add_argument("--split", default="val", help="the split checked (default val)")
    o.add_argument("--against", default="train", help="the split it is looked up in (default train)")
    o.add_argument(
        "--against-data", default=None, help="look it up in this prepared folder's split (same tokenizer)"
    )
    o.add_argument("--n", type=int, default=13, help="window length in tokens (default 13, as GPT-3)")
    o.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="also each evaluation block's share of covered targets (for `kinterval report --clean-blocks`)",
    )
    o.add_argument("--json", default=None, help="also write the numbers and each document's share here")
    o.set_defaults(func=_overlap)
