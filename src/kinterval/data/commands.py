"""``kinterval data prepare``: build a prepared dataset folder and print its splits."""

from __future__ import annotations

import argparse

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
        progress=not args.quiet,
        split=args.split,
        documents=args.documents,
        hf_config=args.hf_config,
        hf_split=args.hf_split,
        text_field=args.text_field,
    )
    print(f"prepared {meta['source']} -> {args.out} (vocab {meta['vocab_size']}, eot {meta['eot']})")
    print(summary_table(meta, args.block_size))
    return 0


def register(subparsers) -> None:
    data = subparsers.add_parser("data", help="prepare token datasets (uint16 shards + meta.json)")
    sub = data.add_subparsers(dest="data_command", metavar="ACTION")
    sub.required = True
    p = sub.add_parser("prepare", help="tokenize a corpus into uint16 shards + meta.json")
    p.add_argument("--source", required=True, help=f"one of: {', '.join(SOURCES)}")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--tokens", type=int, default=None, help="train-token budget (synthetic: exact size)")
    p.add_argument("--seed", type=int, default=0, help="synthetic generator seed")
    p.add_argument(
        "--bpe-file", default=None, help="GPT-2 ranks file (gpt2.tiktoken) for offline tokenization"
    )
    p.add_argument("--block-size", type=int, default=1024, help="T for the printed block counts")
    p.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard file")
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
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_prepare)
