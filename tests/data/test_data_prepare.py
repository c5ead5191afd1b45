from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from shared_folder import SHARED, require_shared

from kinterval.data import TokenShards, import_bin, n_blocks, prepare, sources, synthetic
from kinterval.data.prepare import _fineweb, _wikitext
from kinterval.data.tokenizer import (
    EOT,
    GPT2_BPE_SHA256,
    GPT2_VOCAB,
    PACKAGED_BPE_FILE,
    file_sha256,
    gpt2_encoding,
)


def _name_in(split: str, stem: str, suffix: str) -> str:
    """A file name whose md5 split is ``split``."""
    i = 0
    while sources.md5_split(f"{stem}{i}{suffix}") != split:
        i += 1
    return f"{stem}{i}{suffix}"


@pytest.fixture()
def text_dir(tmp_path) -> Path:
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / ".hidden").mkdir()
    files = {
        _name_in("val", "v", ".txt"): "Validation text: ünïcode, numbers 123 and tabs\t.\n",
        _name_in("test", "t", ".md"): "# Test doc\n\nIt's a *markdown* file.\n",
        "a.txt": "Alpha document.\nSecond line.\n",
        "sub/b.rst": "Beta\n====\n\nA reStructuredText file with   spaces.\n",
        "sub/c.txt": "Gamma, the third train document.\r\nWindows newline.\r\n",
        "empty.txt": "  \n\n",  # whitespace only: skipped
    }
    for name, text in files.items():
        (root / name).write_bytes(text.encode("utf-8"))
    (root / ".hidden/x.txt").write_text("hidden file, ignored")
    (root / "notes.bin").write_bytes(b"\xff\xfe not text, ignored because text files exist")
    return root


def _expected(enc, docs: list[str]) -> list[int]:
    return [t for d in docs for t in enc.encode_ordinary(d) + [EOT]]


def test_text_folder_documents_and_split_rule(text_dir):
    docs = sources.text_documents(text_dir, use_datasets=False)
    assert docs["val"] == ["Validation text: ünïcode, numbers 123 and tabs\t.\n"]
    assert docs["test"] == ["# Test doc\n\nIt's a *markdown* file.\n"]
    keys = sorted(["a.txt", "sub/b.rst", "sub/c.txt"], key=sources.md5_int)
    texts = {k: (text_dir / k).read_text(encoding="utf-8") for k in keys}
    assert docs["train"] == [texts[k] for k in keys]
    assert "Windows newline.\n" in texts["sub/c.txt"]  # universal newlines


def test_datasets_route_matches_plain_reader(text_dir, tmp_path, monkeypatch):
    import datasets

    calls = []
    real = datasets.load_dataset
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append((a, k)) or real(*a, **k))
    assert sources.text_documents(text_dir) == sources.text_documents(text_dir, use_datasets=False)
    assert calls and calls[0][0] == ("text",) and calls[0][1]["sample_by"] == "document"
    single = tmp_path / "book.txt"
    single.write_text("".join(f"Paragraph {i} line one.\nline two.\n\n\n" for i in range(300)))
    by_hf = sources.text_documents(single)
    assert calls[-1][1]["sample_by"] == "paragraph"
    assert by_hf == sources.text_documents(single, use_datasets=False)
    assert sum(len(v) for v in by_hf.values()) == 300 and by_hf["val"] and by_hf["test"]


def test_file_names_with_glob_characters_are_those_files(tmp_path):
    """datasets reads data_files as glob patterns: "notes[1].txt" read notes1.txt, and a folder holding
    both gave notes1.txt's text twice and lost the other; both routes now read each file as named."""
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "notes[1].txt").write_text("first\n")
    (folder / "notes1.txt").write_text("one\n")
    (folder / "a*b?.txt").write_text("star\n")
    (folder / "aXbY.txt").write_text("other\n")
    docs = sources.text_documents(folder)
    assert sorted(d for v in docs.values() for d in v) == ["first\n", "one\n", "other\n", "star\n"]
    assert docs == sources.text_documents(folder, use_datasets=False)
    single = sources.text_documents(folder / "notes[1].txt")
    assert [d for v in single.values() for d in v] == ["first\n"]


def test_prepare_text_writes_shards_meta_and_eot(text_dir, tmp_path):
    out = tmp_path / "prepared"
    meta = prepare(f"text:{text_dir}", out, bpe_file=PACKAGED_BPE_FILE, progress=False)
    enc = gpt2_encoding(PACKAGED_BPE_FILE)
    docs = sources.text_documents(text_dir)
    saved = json.loads((out / "meta.json").read_text())
    assert saved == meta
    assert meta["format_version"] == 1 and meta["source"] == f"text:{text_dir}"
    assert meta["vocab_size"] == GPT2_VOCAB and meta["eot"] == EOT
    assert meta["tokenizer"] == {"name": "gpt2", "sha256": GPT2_BPE_SHA256}
    for split in ("train", "val", "test"):
        rec = meta["splits"][split]
        ids = TokenShards(out, split, verify=True).tokens()
        assert ids.tolist() == _expected(enc, docs[split])
        assert rec["n_tokens"] == len(ids) and rec["n_documents"] == len(docs[split]) == np.sum(ids == EOT)
        assert ids[-1] == EOT
        (shard,) = rec["shards"]
        assert shard["file"] == f"{split}_0000.bin"
        assert shard["bytes"] == (out / shard["file"]).stat().st_size == 2 * len(ids)
        assert shard["sha256"] == hashlib.sha256((out / shard["file"]).read_bytes()).hexdigest()
    assert not list(out.glob("*.tmp"))


def test_prepare_synthetic_sizes_blocks_and_shards(tmp_path):
    out = tmp_path / "syn"
    meta = prepare("synthetic", out, tokens=50_000, seed=5, shard_tokens=20_000, progress=False)
    assert meta["vocab_size"] == synthetic.VOCAB_SIZE and meta["eot"] == synthetic.EOT and meta["seed"] == 5
    assert meta["tokenizer"]["name"] == "synthetic" and meta["tokenizer"]["layout"] == synthetic.LAYOUT
    train = TokenShards(out, "train", verify=True)
    assert train.n_tokens == 50_000 and [s["n_tokens"] for s in meta["splits"]["train"]["shards"]] == [
        20_000
    ] * 2 + [10_000]
    assert np.array_equal(train.tokens(), synthetic.generate(50_000, 5, stream=0))
    assert n_blocks(train.n_tokens, 128) == 49_999 // 128 == 390
    for split in ("val", "test"):
        shards = TokenShards(out, split)
        assert shards.n_tokens == 64 * 128 + 1 and shards.n_blocks(128) == 64
    assert meta["splits"]["train"]["n_documents"] == int(np.sum(train.tokens() == synthetic.EOT))
    val, test = TokenShards(out, "val").tokens(), TokenShards(out, "test").tokens()
    assert not np.array_equal(val, test) and not np.array_equal(val, train.tokens()[: len(val)])
    # Re-preparing the folder with fewer shards leaves no stale shard behind.
    prepare("synthetic", out, tokens=10_000, seed=5, progress=False)
    assert sorted(p.name for p in out.glob("train_*")) == ["train_0000.bin"]


def test_synthetic_splits_come_from_their_own_streams(tmp_path):
    """docs/data.md: val and test are max(5 % of train, 64·128+1) tokens each, from streams (seed, 1) and
    (seed, 2); 200,000 train tokens put 5 % (10,000) above the 8,193 floor."""
    meta = prepare("synthetic", tmp_path, tokens=200_000, seed=5, progress=False)
    train, val, test = (TokenShards(tmp_path, s).tokens() for s in ("train", "val", "test"))
    expected = max(200_000 * 5 // 100, 64 * 128 + 1)
    assert expected == 10_000 and len(train) == 200_000 and len(val) == len(test) == expected
    assert np.array_equal(val, synthetic.generate(expected, 5, stream=1))
    assert np.array_equal(test, synthetic.generate(expected, 5, stream=2))
    assert not np.array_equal(test, train[: len(test)]) and not np.array_equal(val, train[: len(val)])
    assert meta["params"]["synthetic_streams"] == {"train": 0, "val": 1, "test": 2}


def test_import_bin_copy_and_reference(tmp_path):
    src = tmp_path / "raw"
    src.mkdir()
    data = {s: np.random.default_rng(i).integers(0, 1000, n).astype("<u2") for i, (s, n) in
            enumerate([("train", 5000), ("val", 2049), ("test", 1025)])}  # fmt: skip
    data["val"][-1] = EOT
    for s, ids in data.items():
        ids.tofile(src / f"tiny.{s}.bin")
    for copy in (True, False):
        out = tmp_path / f"imported_{copy}"
        meta = prepare(f"bin:{src}", out, copy=copy, progress=False)
        assert meta["splits"]["val"]["n_documents"] == 1
        for s, ids in data.items():
            shards = TokenShards(out, s, verify=True)
            assert np.array_equal(shards.tokens(), ids)
            assert meta["splits"][s]["shards"][0]["sha256"] == file_sha256(src / f"tiny.{s}.bin")
        assert (out / "val_0000.bin").exists() == copy
    assert n_blocks(2049, 1024) == TokenShards(out, "val").n_blocks(1024) == 2


def test_bin_source_applies_the_train_token_cap(tmp_path):
    """``--tokens N`` with ``bin:DIR`` used to be ignored silently: the train split is now its first N ids
    (across its files, recorded in params); the other splits stay whole; a referenced copy is refused."""
    from kinterval import cli

    src = tmp_path / "raw"
    src.mkdir()
    parts = [np.random.default_rng(i).integers(0, 1000, 3000).astype("<u2") for i in range(2)]
    parts[0].tofile(src / "train_0.bin")
    parts[1].tofile(src / "train_1.bin")
    val = np.random.default_rng(9).integers(0, 1000, 2049).astype("<u2")
    val.tofile(src / "val.bin")
    meta = prepare(f"bin:{src}", tmp_path / "capped", tokens=4000, progress=False)
    assert meta["params"]["tokens"] == 4000 and meta["splits"]["train"]["n_tokens"] == 4000
    assert np.array_equal(
        TokenShards(tmp_path / "capped", "train", verify=True).tokens(), np.concatenate(parts)[:4000]
    )
    assert np.array_equal(TokenShards(tmp_path / "capped", "val").tokens(), val)
    small = prepare(f"bin:{src}", tmp_path / "small", tokens=1000, progress=False)["splits"]
    assert (small["train"]["n_tokens"], small["val"]["n_tokens"]) == (1000, 2049)  # a cap below val's size
    with pytest.warns(UserWarning, match=r"train: 6,000 of 1,000,000 tokens"):  # a cap beyond the files
        assert (
            prepare(f"bin:{src}", tmp_path / "all", tokens=10**6, progress=False)["splits"]["train"][
                "n_tokens"
            ]
            == 6000
        )
    args = ["data", "prepare", "--source", f"bin:{src}", "--out", str(tmp_path / "cli"), "--quiet"]
    assert cli.main([*args, "--tokens", "2500"]) == 0
    assert TokenShards(tmp_path / "cli", "train").n_tokens == 2500
    with pytest.raises(ValueError, match=r"--tokens.*--reference.*used whole"):
        prepare(f"bin:{src}", tmp_path / "capped", tokens=4000, copy=False, progress=False)
    assert TokenShards(tmp_path / "capped", "train").n_tokens == 4000  # refused before the folder is touched


def test_import_shared_docs_val_by_reference(tmp_path):
    val = require_shared(SHARED / "corpora" / "docs" / "docs.val.bin")
    meta = import_bin({"validation": val}, tmp_path / "docs", copy=False, progress=False)
    assert meta["splits"]["val"]["shards"][0]["sha256"] == (
        "89e293056fbb94db4bee46580c27d6c617d8d8c0059b0f33a3992807670959b3"
    )
    shards = TokenShards(tmp_path / "docs", "val")
    assert shards.n_tokens == 360_457 and shards.n_blocks(1024) == 352 and shards.tokens()[-1] == EOT


def test_wikitext_articles_grouping():
    rows = ["", " = Alpha = \n", "", " Alpha text . \n", "", " = = Section = = \n", " More . \n", "",
            " = Beta = \n", "", " Beta text @-@ here . \n", ""]  # fmt: skip
    articles = list(sources.wikitext_articles(rows))
    assert articles == [
        " = Alpha = \n\n Alpha text . \n\n = = Section = = \n More . \n",
        " = Beta = \n\n Beta text @-@ here . \n",
    ]


def test_wikitext_prepare_with_local_rows(tmp_path):
    fake = {
        "train": {"text": ["", " = A = \n", " a . \n", " = B = \n", " b . \n"]},
        "validation": {"text": [" = V = \n", " v . \n"]},
        "test": {"text": [" = T = \n", " t . \n", " = U = \n", " u . \n", " = W = \n", " w . \n"]},
    }
    records, tok = _wikitext(
        tmp_path, ("train", "val", "test"), None, 1000, PACKAGED_BPE_FILE, False, dataset=fake
    )
    assert [records[s]["n_documents"] for s in ("train", "val", "test")] == [2, 1, 3]
    enc = gpt2_encoding(PACKAGED_BPE_FILE)
    val = np.fromfile(tmp_path / "val_0000.bin", dtype="<u2").tolist()
    assert val == enc.encode_ordinary(" = V = \n v . \n") + [EOT]


def test_fineweb_budget_and_md5_val_routing(tmp_path):
    rows = [{"id": f"<urn:uuid:{i}>", "text": f"Document number {i} about science."} for i in range(6000)]
    val_ids = [r["id"] for r in rows if sources.fineweb_split(r["id"]) == "val"]
    assert 0 < len(val_ids) < 20
    records, _ = _fineweb(tmp_path, ("train", "val"), 20_000, 30, 8_000, PACKAGED_BPE_FILE, False, rows=rows)
    assert records["train"]["n_tokens"] == 20_000 and len(records["train"]["shards"]) == 3
    assert records["val"]["n_tokens"] == 30  # capped exactly
    enc = gpt2_encoding(PACKAGED_BPE_FILE)
    val = np.fromfile(tmp_path / "val_0000.bin", dtype="<u2").tolist()
    first = next(r for r in rows if r["id"] == val_ids[0])
    assert val[: len(enc.encode_ordinary(first["text"])) + 1] == enc.encode_ordinary(first["text"]) + [EOT]
    train = np.concatenate([np.fromfile(tmp_path / f"train_{k:04d}.bin", dtype="<u2") for k in range(3)])
    first_train = enc.encode_ordinary(rows[0]["text"]) + [EOT]
    assert (
        train[: len(first_train)].tolist() == first_train and sources.fineweb_split(rows[0]["id"]) == "train"
    )
    # documents written, the last one cut by the budget included; none counted once a split is full
    for split, ids in (("train", train), ("val", np.array(val))):
        assert records[split]["n_documents"] == np.sum(ids == EOT) + (ids[-1] != EOT)


def test_md5_split_rule_matches_docs_corpus_rule():
    # shared/corpora/docs: int(md5(doc_path).hexdigest(), 16) % 100 -> 0-1 val, 2-3 test, the rest train.
    keys = [f"pkg/usr/share/doc/file{i}.rst" for i in range(2000)]
    for key in keys:
        bucket = int(hashlib.md5(key.encode()).hexdigest(), 16) % 100
        assert sources.md5_split(key) == ("val" if bucket < 2 else "test" if bucket < 4 else "train")
    counts = {s: sum(sources.md5_split(k) == s for k in keys) for s in ("val", "test")}
    assert 15 < counts["val"] < 65 and 15 < counts["test"] < 65


def test_tokens_caps_only_the_train_split_of_a_text_source(tmp_path):
    """``tokens`` caps the train split; val and test stay whole (text sources, WikiText-103)."""
    fake = {
        "train": {"text": [" = A = \n", " a a a a a a . \n", " = B = \n", " b b b b b . \n"]},
        "validation": {"text": [" = V = \n", " v v v v v v . \n"]},
        "test": {"text": [" = T = \n", " t t t t t t . \n"]},
    }
    splits = ("train", "val", "test")
    (tmp_path / "full").mkdir()
    (tmp_path / "cap").mkdir()
    full, _ = _wikitext(tmp_path / "full", splits, None, 1000, PACKAGED_BPE_FILE, False, dataset=fake)
    capped, _ = _wikitext(tmp_path / "cap", splits, 5, 1000, PACKAGED_BPE_FILE, False, dataset=fake)
    assert full["train"]["n_tokens"] > 5 and capped["train"]["n_tokens"] == 5
    for split in ("val", "test"):
        assert capped[split]["n_tokens"] == full[split]["n_tokens"] > 5


def test_a_train_budget_beyond_the_source_warns_for_every_source(tmp_path):
    """An hf: stream that ended before --tokens warned; text: and bin: wrote the smaller train split
    silently while meta.json recorded the budget."""
    (tmp_path / "a.txt").write_text("one small document.\n\nand another one.\n")
    with pytest.warns(
        UserWarning, match=r"text source ended before every budget was met \(train: \d+ of 1,000"
    ):
        prepare(f"text:{tmp_path / 'a.txt'}", tmp_path / "t", tokens=1000, progress=False)
    (tmp_path / "bins").mkdir()
    np.arange(300, dtype=np.uint16).tofile(tmp_path / "bins" / "train.bin")
    with pytest.warns(UserWarning, match=r"files ended before every budget was met \(train: 300 of 1,000"):
        prepare(f"bin:{tmp_path / 'bins'}", tmp_path / "b", tokens=1000, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a budget the source meets: no warning
        prepare(f"bin:{tmp_path / 'bins'}", tmp_path / "b", tokens=200, progress=False)


def test_preparing_over_a_dataset_removes_the_splits_it_does_not_write(tmp_path):
    """A bin: source with train and val only, prepared over a synthetic train/val/test folder, used to leave
    the old test shard beside a meta.json that no longer lists it."""
    from kinterval.data.writer import clear_outputs

    out = tmp_path / "d"
    out.mkdir()
    old = {"format": "kinterval-tokens", "splits": {"train": {}, "val": {}, "test": {}}}
    (out / "meta.json").write_text(json.dumps(old))
    for name in ("train_0000.bin", "val_0000.bin", "test_0000.bin", "test_0001.bin.tmp", "notes.txt"):
        (out / name).write_bytes(b"")
    clear_outputs(out, ["train", "val"])
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("source", ["wikitext103", "fineweb-edu", "ptb", "c4"])
def test_an_unreachable_hub_is_one_error_line(tmp_path, monkeypatch, capsys, source):
    """Offline, datasets raises ConnectionError; it used to reach the user as a traceback."""
    import datasets

    from kinterval.cli import main

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    assert main(["data", "prepare", "--source", source, "--out", str(tmp_path / "d"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "could not download" in err and "Check the network" in err


@pytest.mark.parametrize("source", ["wikitext103", "fineweb-edu", "ptb", "c4"])
@pytest.mark.parametrize("where", ["open", "first row"])
def test_an_unreachable_hub_leaves_the_dataset_in_place(tmp_path, monkeypatch, source, where):
    """fineweb-edu used to clear ``out`` before opening its stream: offline, the old dataset was gone. A Hub
    that fails when the dataset is opened, or (streams) when its first row is read, now costs nothing."""
    import datasets

    out = tmp_path / "d"
    prepare("synthetic", out, tokens=5_000, progress=False)

    def offline_rows():
        raise ConnectionError("Couldn't reach the Hub")
        yield

    def load_dataset(*args, **kwargs):
        if where == "open" or not kwargs.get("streaming"):
            raise ConnectionError("Couldn't reach the Hub (LocalEntryNotFoundError)")
        return offline_rows()

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    with pytest.raises(ValueError, match="could not download"):
        prepare(source, out, bpe_file=PACKAGED_BPE_FILE, progress=False)
    assert TokenShards(out, "train", verify=True).n_tokens == 5_000


def test_bin_split_files_are_read_in_natural_order(tmp_path):
    """``train_10.bin`` used to come before ``train_2.bin`` (string sort), re-ordering the token stream."""
    src = tmp_path / "raw"
    src.mkdir()
    for i in (1, 2, 10):
        np.full(100, i, dtype="<u2").tofile(src / f"train_{i}.bin")
    meta = prepare(f"bin:{src}", tmp_path / "out", progress=False)
    assert meta["params"]["files"]["train"] == [str(src / f"train_{i}.bin") for i in (1, 2, 10)]
    ids = TokenShards(tmp_path / "out", "train").tokens()
    assert ids.tolist() == [1] * 100 + [2] * 100 + [10] * 100


def _fineweb_rows(n_val: int, n_train: int, val_text: str, train_text: str) -> list[dict]:
    """FineWebEdu rows whose ids route ``n_val`` documents to val (md5 rule), interleaved with train ones."""
    rows, i = [], 0
    while n_val or n_train:
        doc_id = f"<urn:uuid:{i}>"
        i += 1
        if sources.fineweb_split(doc_id) == "val" and n_val:
            rows.append({"id": doc_id, "text": val_text})
            n_val -= 1
        elif sources.fineweb_split(doc_id) == "train" and n_train:
            rows.append({"id": doc_id, "text": train_text})
            n_train -= 1
    return rows


@pytest.mark.parametrize("splits", [("val",), ("train", "val")])
def test_fineweb_fills_val_even_when_train_is_done_first(tmp_path, monkeypatch, splits):
    """``splits=["val"]`` (or a train budget met before val's) used to stop after the first batch, leaving a
    nearly empty val split: the stream now runs until every requested split has its budget."""
    val_text = "The quick brown fox jumps over the lazy dog. " * 300  # about 3000 tokens
    rows = _fineweb_rows(24, 3000, val_text, "A short train document.")
    monkeypatch.setattr(sources, "stream_fineweb_edu", lambda: iter(rows))
    tokens = 1_000 if "train" in splits else None  # a train cap without a train split is refused
    meta = prepare("fineweb-edu", tmp_path / "fw", splits=splits, tokens=tokens, val_tokens=50_000,
                   bpe_file=PACKAGED_BPE_FILE, progress=False)  # fmt: skip
    assert meta["splits"]["val"]["n_tokens"] == 50_000
    if "train" not in splits:
        with pytest.raises(ValueError, match=r"--tokens caps the train split; splits \['val'\] lack train"):
            prepare("fineweb-edu", tmp_path / "fw", splits=splits, tokens=1_000, progress=False)
        assert TokenShards(tmp_path / "fw", "val").n_tokens == 50_000  # the dataset in out is kept
    assert TokenShards(tmp_path / "fw", "val", verify=True).n_tokens == 50_000
    if "train" in splits:
        assert meta["splits"]["train"]["n_tokens"] == 1_000


def test_fineweb_warns_when_the_stream_ends_before_a_budget(tmp_path, monkeypatch):
    rows = _fineweb_rows(2, 50, "A validation document.", "A train document.")
    monkeypatch.setattr(sources, "stream_fineweb_edu", lambda: iter(rows))
    with pytest.warns(UserWarning, match=r"stream ended.*val: 10 of 50,000 tokens"):
        meta = prepare("fineweb-edu", tmp_path / "fw", splits=["val"], val_tokens=50_000,
                       bpe_file=PACKAGED_BPE_FILE, progress=False)  # fmt: skip
    assert meta["splits"]["val"] == {**meta["splits"]["val"], "n_tokens": 10, "n_documents": 2}


def test_an_out_folder_inside_the_source_is_never_read_back_as_source(tmp_path):
    """--out inside a text: folder of non-text files (every file is a document then): preparing twice reads
    the same documents, not the shards and meta.json the first prepare wrote; an hf: folder and --out equal
    to the source folder are refused before anything is written."""
    notes = tmp_path / "notes"
    notes.mkdir()
    for i in range(5):
        (notes / f"n{i}.note").write_text(f"Note number {i}.\n")
    first = prepare(f"text:{notes}", notes / "prep", bpe_file=PACKAGED_BPE_FILE, progress=False)
    second = prepare(f"text:{notes}", notes / "prep", bpe_file=PACKAGED_BPE_FILE, progress=False)
    assert first["splits"] == second["splits"]
    assert sum(s["n_documents"] for s in second["splits"].values()) == 5
    for same in (notes, notes / "prep" / ".."):  # the folder by another spelling is the same folder
        with pytest.raises(ValueError, match="is the source folder"):
            prepare(f"text:{notes}", same, bpe_file=PACKAGED_BPE_FILE, progress=False)
    pytest.importorskip("datasets")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "d.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n')
    with pytest.raises(ValueError, match="lies inside the source folder"):
        prepare(f"hf:{tmp_path / 'hf'}", tmp_path / "hf" / "prep", bpe_file=PACKAGED_BPE_FILE, progress=False)
    assert not (tmp_path / "hf" / "prep").exists()


@pytest.mark.parametrize("use_datasets", [False, True])
def test_a_leading_byte_order_mark_is_not_document_text(tmp_path, use_datasets):
    """A UTF-8 file saved with a byte-order mark (as Windows editors do): the mark is not tokenized."""
    if use_datasets:
        pytest.importorskip("datasets")
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_bytes("\ufeffCafé doc\r\nline two\r\n".encode())
    (tmp_path / "single.txt").write_bytes("\ufeffFirst paragraph.\n\nSecond, \ufeff kept inside.\n".encode())
    docs = sources.text_documents(tmp_path / "corpus", use_datasets=use_datasets, split="train")
    assert docs == {"train": ["Café doc\nline two\n"]}
    docs = sources.text_documents(tmp_path / "single.txt", use_datasets=use_datasets, split="train")
    assert docs == {"train": ["First paragraph.", "Second, \ufeff kept inside.\n"]}


def test_an_hf_text_files_byte_order_mark_is_not_document_text():
    """datasets' text reader keeps a .txt file's mark in its first row (its json and csv readers drop it):
    the hf: router drops it as text: does; a mark inside a text stays."""
    route = sources.hf_router("text", None)
    assert route(0, {"text": "\ufeffFirst line"})[1] == "First line"
    assert route(1, {"text": "\ufeff"})[1] is None  # nothing but the mark: no document
    assert route(2, {"text": "a \ufeff b"})[1] == "a \ufeff b"


def test_a_whole_number_float_id_splits_as_its_integer():
    """A csv id column with one blank cell reads as floats, so row 1 was keyed "1.0" instead of "1": one
    blank id moved other documents between splits (282/8/10 vs 292/3/5 of 300 documents)."""
    route = sources.hf_router("text", None)
    for i in range(300):
        assert route(i, {"text": "x", "id": float(i)})[0] == route(i, {"text": "x", "id": i})[0]
    assert route(7, {"text": "x", "id": 2.5})[0] == sources.md5_split("2.5")
    # a fractional id keeps its fraction (300 of them: int() would move some to the split of their integer)
    assert [route(i, {"text": "x", "id": i + 0.5})[0] for i in range(300)] == [
        sources.md5_split(str(i + 0.5)) for i in range(300)
    ]
    assert [sources.md5_split(str(i + 0.5)) for i in range(300)] != [
        sources.md5_split(str(i)) for i in range(300)
    ]
    assert route(7, {"text": "x", "id": None})[0] == sources.md5_split("7")


def test_a_file_name_that_is_not_utf8_is_split_by_its_bytes(tmp_path):
    """A folder holding a Latin-1 file name (``café.txt`` written by an old tool): the md5 split rule raised
    UnicodeEncodeError (a traceback); the name's own bytes are hashed now."""
    import hashlib
    import os

    root = tmp_path / "latin"
    root.mkdir()
    name = b"caf\xe9.txt"
    try:
        (Path(os.fsdecode(os.fsencode(root) + b"/" + name))).write_text("A document with a Latin-1 name.\n")
    except (OSError, UnicodeError):
        pytest.skip("this file system refuses a file name that is not UTF-8")
    (root / "ok.txt").write_text("Plain one.\n")
    docs = sources.text_documents(root, use_datasets=False)
    assert sorted(d for split in docs.values() for d in split) == [
        "A document with a Latin-1 name.\n",
        "Plain one.\n",
    ]
    bucket = int(hashlib.md5(name).hexdigest(), 16) % 100
    # the key is the name's own bytes (Python's surrogates turned back), not the name with a replacement mark
    assert sources.md5_int(name.decode("utf-8", "surrogateescape")) == int(hashlib.md5(name).hexdigest(), 16)
    want = "val" if bucket < 2 else "test" if bucket < 4 else "train"
    assert "A document with a Latin-1 name.\n" in docs[want]
    meta = prepare(f"text:{root}", tmp_path / "out", bpe_file=PACKAGED_BPE_FILE, progress=False)
    assert sum(s["n_documents"] for s in meta["splits"].values()) == 2


@pytest.mark.parametrize("use_datasets", [False, True])
def test_a_single_file_splits_its_paragraphs_by_name_and_index(tmp_path, use_datasets):
    """docs/data.md: the i-th paragraph (from 0) of a single file has the key ``name#i``; within a split the
    paragraphs are ordered by that key's md5."""
    if use_datasets:
        pytest.importorskip("datasets")
    paragraphs = [f"Paragraph number {i}." for i in range(60)]
    (tmp_path / "one.txt").write_text("\n\n".join(paragraphs) + "\n")
    docs = sources.text_documents(tmp_path / "one.txt", use_datasets=use_datasets)
    for split in sources.SPLITS:
        keys = sorted((i for i in range(60) if sources.md5_split(f"one.txt#{i}") == split),
                      key=lambda i: sources.md5_int(f"one.txt#{i}"))  # fmt: skip
        assert [d.strip() for d in docs[split]] == [paragraphs[i] for i in keys], split


def test_a_broken_link_in_a_text_folder_is_named(tmp_path):
    """A link whose target is gone was skipped in silence: a document lost without a word."""
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "a.txt").write_text("kept\n")
    (folder / "b.txt").symlink_to(tmp_path / "gone.txt")
    with pytest.raises(FileNotFoundError, match=r"b\.txt: a link to a file that does not exist \(1 such\)"):
        sources.text_documents(folder)
