"""``prepare``: turn a source into a prepared dataset folder (uint16 shards + meta.json).

Sources: ``synthetic`` (embedded default), ``wikitext103``, ``fineweb-edu``, the held-out ``ptb`` and ``c4``,
``hf:PATH`` (any Hugging Face dataset, streamed; or a local dataset folder or data file), ``text:PATH``
(local text) and ``bin:DIR`` (existing flat uint16 files, e.g. a pre-tokenized corpus, wrapped by
``import_bin``). Every source is checked and opened (a Hub dataset reached) first; the new shards are
written to a staging folder inside ``out`` and replace the dataset already there only once they are all
written (``writer.replacing``); meta.json is removed first and written last, so a folder with a meta.json
is always complete.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from kinterval import atomic
from kinterval.data import sources, synthetic
from kinterval.data.import_bin import find_bin_files, gpt2_tokenizer, import_bin
from kinterval.data.loader import n_blocks
from kinterval.data.tokenizer import (
    EOT,
    GPT2_VOCAB,
    encode_documents,
    gpt2_encoding,
    tokenizer_hash,
)
from kinterval.data.writer import ShardWriter, check_replaceable, replacing, warn_short, write_meta

SOURCES = ("synthetic", "wikitext103", "fineweb-edu", "ptb", "c4", "hf:PATH", "text:PATH", "bin:DIR")
SYNTHETIC_TRAIN_TOKENS = 2_000_000
SYNTHETIC_MIN_EVAL_TOKENS = 64 * 128 + 1  # at least 64 blocks of T=128
FINEWEB_TOKENS = 3_000_000_000  # the paper's FineWebEdu-3B
FINEWEB_VAL_TOKENS = 1_000_000  # (1e6 - 1) // 1024 = 976 validation blocks, as in the paper
PREPARE_LOCK = ".prepare.lock"  # in --out while a prepare writes it (kinterval.atomic.exclusive)
DOC_BATCH = 512  # documents per tiktoken batch


def _write(writer: ShardWriter, chunks: Iterable[np.ndarray], limit: int | None, eot: int, bar: tqdm) -> dict:
    """Write chunks until ``limit`` tokens (None: all); return the split record of meta.json."""
    n_docs = 0
    for chunk in chunks:
        if limit is not None:
            chunk = chunk[: limit - writer.n_tokens]
        writer.write(chunk)
        n_docs += int(np.count_nonzero(chunk == eot))
        bar.update(len(chunk))
        if limit is not None and writer.n_tokens >= limit:
            break
    return {"n_tokens": writer.n_tokens, "n_documents": n_docs, "shards": writer.close()}


def _encoded(enc, docs: Iterable[str]) -> Iterator[np.ndarray]:
    batch: list[str] = []
    for doc in docs:
        batch.append(doc)
        if len(batch) == DOC_BATCH:
            yield encode_documents(enc, batch)
            batch = []
    if batch:
        yield encode_documents(enc, batch)


def _synthetic(out, splits, tokens, shard_tokens, seed, progress) -> tuple[dict, dict, dict]:
    train = SYNTHETIC_TRAIN_TOKENS if tokens is None else tokens
    sizes = {"train": train, "val": max(train // 20, SYNTHETIC_MIN_EVAL_TOKENS)}
    sizes["test"] = sizes["val"]
    need, free = 2 * sum(sizes[s] for s in splits), shutil.disk_usage(out).free  # uint16: 2 bytes a token
    if need > free:  # known before the first token: say so now, not after filling the disk
        raise ValueError(
            f"--tokens {train:,}: the synthetic splits take {need / 2**30:.1f} GiB, and {Path(out).parent} "
            f"has {free / 2**30:.1f} GiB free"
        )
    records = {}
    for split in splits:
        # Each split is its own stream (seed, index): val/test never repeat train documents' randomness.
        stream = sources.SPLITS.index(split)
        writer = ShardWriter(out, split, synthetic.VOCAB_SIZE, shard_tokens)
        with tqdm(total=sizes[split], desc=f"synthetic {split}", unit="tok", disable=not progress) as bar:
            docs = synthetic.documents(seed, stream)  # endless; cut at the exact size
            records[split] = _write(writer, docs, sizes[split], synthetic.EOT, bar)
    tokenizer = {"name": "synthetic", "sha256": None, "layout": synthetic.LAYOUT}
    return records, tokenizer, {"synthetic_streams": {s: sources.SPLITS.index(s) for s in splits}}


def _text_like(
    out, splits, docs_by_split, limit, shard_tokens, bpe_file, progress, name
) -> tuple[dict, dict]:
    enc = gpt2_encoding(bpe_file)
    records = {}
    for split in splits:
        writer = ShardWriter(out, split, GPT2_VOCAB, shard_tokens)
        cap = limit if split == "train" else None
        with tqdm(desc=f"{name} {split}", unit="tok", disable=not progress) as bar:
            records[split] = _write(writer, _encoded(enc, docs_by_split[split]), cap, EOT, bar)
        if cap is not None:
            warn_short(f"{name} source", {split: (records[split]["n_tokens"], cap)})
    return records, {"name": "gpt2", "sha256": tokenizer_hash(bpe_file)}


def _fineweb(
    out, splits, tokens, val_tokens, shard_tokens, bpe_file, progress, rows=None
) -> tuple[dict, dict]:
    """Stream FineWebEdu until every requested split has its budget: train ``tokens``, val (md5 of id)
    ``val_tokens``; warn when the stream ends first."""
    rows = sources.stream_fineweb_edu() if rows is None else rows
    budget = {s: b for s, b in (("train", tokens), ("val", val_tokens)) if s in splits}
    route = lambda i, row: (sources.fineweb_split(str(row["id"])), row["text"])  # noqa: E731
    return _stream(out, budget, rows, route, shard_tokens, bpe_file, progress, "fineweb-edu")


def _stream(out, budget, rows, route, shard_tokens, bpe_file, progress, name) -> tuple[dict, dict]:
    """Tokenize streamed rows into the splits of ``budget`` (split -> token cap, None: no cap);
    ``route(i, row)`` gives a row's (split, text), text None to skip it. Reading stops once every capped split
    is full (with no cap, at the end of the stream); a stream that ends before a cap is met warns."""
    enc = gpt2_encoding(bpe_file)
    writers = {s: ShardWriter(out, s, GPT2_VOCAB, shard_tokens) for s in budget}
    n_docs = dict.fromkeys(writers, 0)
    capped = {s: b for s, b in budget.items() if b is not None}
    rows = enumerate(rows)
    total = sum(capped.values()) if len(capped) == len(budget) else None
    with tqdm(total=total, desc=name, unit="tok", disable=not progress) as bar:
        while batch := list(itertools.islice(rows, DOC_BATCH)):
            routed = [route(i, row) for i, row in batch]
            if _stream_batch(enc, routed, writers, budget, n_docs, bar) and capped:
                break
        else:
            warn_short(f"{name} stream", {s: (writers[s].n_tokens, b) for s, b in capped.items()})
    records = {
        s: {"n_tokens": w.n_tokens, "n_documents": n_docs[s], "shards": w.close()} for s, w in writers.items()
    }
    return records, {"name": "gpt2", "sha256": tokenizer_hash(bpe_file)}


def _stream_batch(enc, routed, writers, budget, n_docs, bar) -> bool:
    """Write one batch of routed documents (tokenizing only those a split still needs); True once every
    capped split is full."""

    def open_(split):
        return split in writers and (budget[split] is None or writers[split].n_tokens < budget[split])

    routed = [(s, text) for s, text in routed if text is not None and open_(s)]
    ids = enc.encode_ordinary_batch([text for _, text in routed]) if routed else []
    for (split, _), doc in zip(routed, ids):
        if not open_(split):
            continue
        chunk = np.append(np.asarray(doc, dtype=np.uint16), np.uint16(EOT))
        if budget[split] is not None:
            chunk = chunk[: budget[split] - writers[split].n_tokens]
        writers[split].write(chunk)
        n_docs[split] += 1
        bar.update(len(chunk))
    return all(w.n_tokens >= budget[s] for s, w in writers.items() if budget[s] is not None)


def _wikitext(out, splits, tokens, shard_tokens, bpe_file, progress, dataset=None) -> tuple[dict, dict]:
    dataset = sources.load_wikitext103() if dataset is None else dataset
    hf_name = {"train": "train", "val": "validation", "test": "test"}
    docs = {s: sources.wikitext_articles(dataset[hf_name[s]]["text"]) for s in splits}
    return _text_like(out, splits, docs, tokens, shard_tokens, bpe_file, progress, "wikitext103")


def prepare(
    source: str,
    out: str | Path,
    *,
    tokens: int | None = None,
    seed: int | None = None,
    bpe_file: str | Path | None = None,
    shard_tokens: int = 100_000_000,
    splits: Iterable[str] = sources.SPLITS,
    val_tokens: int = FINEWEB_VAL_TOKENS,
    copy: bool = True,
    progress: bool = True,
    split: str | None = None,
    documents: int | None = None,
    hf_config: str | None = None,
    hf_split: str | None = None,
    text_field: str | None = None,
) -> dict:
    """Prepare ``source`` into ``out`` and return its meta.json contents.

    ``tokens`` caps the train split (synthetic: its exact size, default 2M; fineweb-edu: the streamed
    budget, default 3B; bin:DIR: its first ``tokens`` ids, copied only), and is an error where no train split
    is written (``ptb``, ``c4``, ``split`` other than train); ``val_tokens`` caps fineweb-edu's held-out
    split. ``seed`` drives the synthetic generator only (default 0; an error with another source);
    ``copy=False`` makes ``bin:DIR`` reference its files instead of copying them. ``split`` (``text:PATH``
    only) puts every document into that one split; ``documents`` is the number of C4 validation documents
    (default 302). ``ptb`` writes ``test`` and ``c4`` writes ``val`` whatever ``splits`` says. ``hf:PATH``
    only: ``hf_config`` (the dataset's configuration), ``hf_split`` (the split streamed, default
    ``train``), ``text_field`` (default ``text``); ``split`` works for it as for ``text:PATH``.
    """
    out = Path(out)
    splits = tuple(dict.fromkeys(sources.SPLIT_ALIASES.get(s, s) for s in splits))
    unknown = [s for s in splits if s not in sources.SPLITS]
    if unknown:
        raise ValueError(f"unknown split(s) {unknown}; choose from {list(sources.SPLITS)}")
    if tokens is not None and tokens < 1:
        raise ValueError(f"tokens must be positive, got {tokens}")
    # Checked before clear_outputs, which removes a previous dataset in ``out``: bad input must not cost it.
    if isinstance(shard_tokens, bool) or not isinstance(shard_tokens, int) or shard_tokens < 1:
        raise ValueError(f"shard_tokens must be positive, got {shard_tokens!r}")
    if seed is not None and source != "synthetic":  # nothing else draws: a given seed would go unused
        raise ValueError(f"--seed applies to the synthetic source only, got --source {source}")
    seed = 0 if seed is None else seed
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    kind, _, path = source.partition(":")
    if kind in ("text", "bin", "hf") and not path.strip():
        # Path("") is the current directory: its stray files are not a source anyone meant
        raise ValueError(f"--source {source!r} needs a path after '{kind}:', e.g. {kind}:path/to/dir")
    for flag, value in (("--hf-config", hf_config), ("--hf-split", hf_split), ("--text-field", text_field)):
        if value is not None and kind != "hf":
            raise ValueError(f"{flag} applies to an hf:PATH source only, got --source {source}")
        if value is not None and not (isinstance(value, str) and value.strip()):
            raise ValueError(f"{flag} must name something, got {value!r}")
    if split is not None:
        if kind not in ("text", "hf"):
            raise ValueError(f"--split applies to a text:PATH or hf:PATH source only, got --source {source}")
        split = sources.SPLIT_ALIASES.get(split, split)
        if split not in sources.SPLITS:
            raise ValueError(f"unknown split {split!r}; choose from {list(sources.SPLITS)}")
        splits = (split,)
    if documents is not None:
        if source != "c4":
            raise ValueError(f"--documents applies to the c4 source only, got --source {source}")
        if isinstance(documents, bool) or not isinstance(documents, int) or documents < 1:
            raise ValueError(f"documents must be a positive integer, got {documents!r}")
    if tokens is not None and source != "synthetic":  # synthetic sizes val and test from it too
        # elsewhere --tokens caps the train split only (a bin: folder without train files: import_bin)
        no_train = {"ptb": "--source ptb writes the test split only", "c4": "--source c4 writes val only"}
        reason = no_train.get(source)
        if reason is None and "train" not in splits:
            reason = (
                f"--split {split} writes no train split" if split else f"splits {list(splits)} lack train"
            )
        if reason:
            raise ValueError(f"--tokens caps the train split; {reason}: drop --tokens")
    if source in ("wikitext103", "fineweb-edu", "ptb", "c4") or kind in ("text", "hf"):
        gpt2_encoding(bpe_file)  # a missing or wrong --bpe-file
    elif source == "synthetic" and bpe_file is not None:
        raise ValueError("--bpe-file applies to GPT-2-tokenized sources; --source synthetic makes its ids")
    params = {"tokens": tokens, "shard_tokens": shard_tokens, "splits": list(splits)}
    check_replaceable(out, splits)  # another tool's files in --out: refused before any source is read
    # one prepare of a folder at a time: two would share its staging folder and could leave one's
    # meta.json over the other's shards
    busy = f"{out} is being prepared by {{who}}: wait for it to finish, or prepare into another --out"
    with atomic.exclusive(out / PREPARE_LOCK, busy, remove=True):
        if source.startswith("bin:"):
            found = find_bin_files(source[4:])
            return import_bin({s: f for s, f in found.items() if s in splits}, out, source=source, copy=copy,
                              shard_tokens=shard_tokens, progress=progress, tokens=tokens,
                              tokenizer=gpt2_tokenizer(bpe_file))  # fmt: skip
        if source == "synthetic":
            with replacing(out, splits) as stage:
                records, tokenizer, extra = _synthetic(stage, splits, tokens, shard_tokens, seed, progress)
            return write_meta(
                out, source, records, synthetic.VOCAB_SIZE, synthetic.EOT, tokenizer, seed, params | extra
            )
        if source == "wikitext103":
            dataset = sources.load_wikitext103()
            with replacing(out, splits) as stage:
                records, tokenizer = _wikitext(
                    stage, splits, tokens, shard_tokens, bpe_file, progress, dataset
                )
        elif source == "fineweb-edu":
            splits = tuple(s for s in splits if s != "test")  # FineWebEdu has no test split here
            params |= {"tokens": tokens or FINEWEB_TOKENS, "val_tokens": val_tokens, "splits": list(splits),
                       "val_rule": "int(md5(id), 16) % 1000 == 0"}  # fmt: skip
            rows = sources.stream_fineweb_edu()  # reaches the Hub before the old dataset is removed
            with replacing(out, splits) as stage:
                records, tokenizer = _fineweb(
                    stage,
                    splits,
                    tokens or FINEWEB_TOKENS,
                    val_tokens,
                    shard_tokens,
                    bpe_file,
                    progress,
                    rows,
                )
        elif source == "ptb":
            docs = {"test": [sources.ptb_test_document()]}
            params |= {"splits": ["test"], "hub": list(sources.PTB_HUB), "hub_split": "test",
                       "document": "every sentence, one a line, as one document"}  # fmt: skip
            with replacing(out, ["test"]) as stage:
                records, tokenizer = _text_like(
                    stage, ["test"], docs, None, shard_tokens, bpe_file, progress, "ptb"
                )
        elif source == "c4":
            n = documents or sources.C4_DOCUMENTS
            docs = {"val": sources.c4_validation_documents(n)}
            params |= {"splits": ["val"], "hub": list(sources.C4_HUB), "hub_split": "validation",
                       "documents": n,
                       "document_rule": f"the first {n} documents of the validation stream"}  # fmt: skip
            with replacing(out, ["val"]) as stage:
                records, tokenizer = _text_like(
                    stage, ["val"], docs, None, shard_tokens, bpe_file, progress, "c4"
                )
        elif kind == "hf":
            hf_split, text_field = hf_split or "train", text_field or "text"
            if Path(path).is_dir() and out.resolve().is_relative_to(Path(path).resolve()):
                raise ValueError(
                    f"--out {out} lies inside the source folder {path}: datasets would read the dataset "
                    "written there as data files of the source; choose an --out outside it"
                )
            if hf_split != "train" and Path(path).is_file():  # load_dataset would call the file that split
                raise ValueError(
                    f"hf:{path}: --hf-split names a split of a dataset; a data file is one split (leave "
                    "--hf-split out)"
                )
            rows = sources.stream_hf(path, hf_config, hf_split)  # the Hub, before the old dataset goes
            route = sources.hf_router(text_field, split)
            # Read up to the first row that a split takes (a missing or non-text field, a split with no row
            # or no text are refused here), before the old dataset goes; the rows read are written first.
            head, texts = [], 0
            for i, row in enumerate(rows):
                head.append(row)
                target, text = route(i, row)
                texts += text is not None
                if text is not None and target in splits:
                    break
            else:
                if not head:
                    raise ValueError(f"{path}: split {hf_split!r} holds no row")
                if texts:  # documents, all routed to splits not asked for
                    raise ValueError(
                        f"{path}: none of the {texts} documents of split {hf_split!r} goes to the split(s) "
                        f"asked for ({', '.join(splits)}): the md5 rule puts each elsewhere (--split names "
                        "one split)"
                    )
                raise ValueError(f"{path}: no row of split {hf_split!r} holds text in field {text_field!r}")
            budget = {s: (tokens if s == "train" else None) for s in splits}
            rule = "int(md5(id, else stream index), 16) % 100: 0-1 val, 2-3 test, else train"
            rule = f"every document in {split}, in stream order" if split else rule
            params |= {"hf_path": path, "hf_config": hf_config, "hf_split": hf_split,
                       "text_field": text_field, "split_rule": rule}  # fmt: skip
            with replacing(out, splits) as stage:
                records, tokenizer = _stream(stage, budget, itertools.chain(head, rows), route, shard_tokens,
                                             bpe_file, progress, "hf")  # fmt: skip
        elif source.startswith("text:"):
            if out.resolve() == Path(path).resolve():
                raise ValueError(
                    f"--out {out} is the source folder: choose another folder (or one inside it)"
                )
            docs = sources.text_documents(path, split=split, exclude=out)  # files under --out are not read
            params["split_rule"] = (
                f"every document in {split}, in natural file order"
                if split
                else "int(md5(relative path), 16) % 100: 0-1 val, 2-3 test, else train"
            )
            with replacing(out, splits) as stage:
                records, tokenizer = _text_like(
                    stage, splits, docs, tokens, shard_tokens, bpe_file, progress, "text"
                )
        else:
            raise ValueError(f"unknown source {source!r}; choose from {', '.join(SOURCES)}")
        return write_meta(out, source, records, GPT2_VOCAB, EOT, tokenizer, None, params)


def summary_table(meta: dict, block_size: int = 1024) -> str:
    """Per split: tokens, documents and non-overlapping blocks of ``block_size`` tokens."""
    rows = [f"{'split':<6} {'tokens':>14} {'documents':>10} {f'blocks@T={block_size}':>14}"]
    for split, rec in meta["splits"].items():
        n = rec["n_tokens"]
        rows.append(f"{split:<6} {n:>14,} {rec.get('n_documents', 0):>10,} {n_blocks(n, block_size):>14,}")
    return "\n".join(rows)
