"""Every bad input gives a clear error that names the file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kinterval.cli import main
from kinterval.data import TokenShards, import_bin, prepare
from kinterval.data.tokenizer import GPT2_VOCAB


@pytest.fixture()
def ds(tmp_path):
    out = tmp_path / "ds"
    prepare("synthetic", out, tokens=20_000, seed=0, progress=False)
    return out


def test_missing_dir_and_meta(tmp_path, ds):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        TokenShards(tmp_path / "nowhere", "train")
    (ds / "meta.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"ds/meta\.json"):
        TokenShards(ds, "train")


def test_missing_shard(ds):
    (ds / "val_0000.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"val_0000\.bin"):
        TokenShards(ds, "val")
    TokenShards(ds, "train")  # other splits still open


def test_truncated_shard(ds):
    path = ds / "train_0000.bin"
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(ValueError, match=r"train_0000\.bin.*truncated"):
        TokenShards(ds, "train")


def test_a_shard_of_wider_ids_says_what_meta_json_counts(ds):
    """An int32 shard with meta.json's bytes right but its token count that of the int32 ids: the error
    said "800 bytes, meta.json says 800"; it now names the token count and the 2 bytes each."""
    path = ds / "train_0000.bin"
    ids = np.fromfile(path, dtype="<u2").astype("<i4")
    ids.tofile(path)
    meta = json.loads((ds / "meta.json").read_text())
    shard = meta["splits"]["train"]["shards"][0]
    shard["bytes"] = path.stat().st_size
    (ds / "meta.json").write_text(json.dumps(meta))
    said = rf"{ids.nbytes} bytes, meta\.json says {ids.nbytes} bytes and {len(ids)} tokens of 2 bytes"
    with pytest.raises(ValueError, match=rf"train_0000\.bin: {said} \(truncated or corrupt"):
        TokenShards(ds, "train")


def test_shard_size_must_match_the_bytes_in_meta(ds):
    """meta.json's ``bytes`` is checked against the file as well as ``n_tokens``: a meta.json whose byte count
    disagrees with its own token count is corrupt."""
    meta = json.loads((ds / "meta.json").read_text())
    meta["splits"]["train"]["shards"][0]["bytes"] += 2
    (ds / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"train_0000\.bin.*meta\.json says"):
        TokenShards(ds, "train")


@pytest.mark.parametrize("delta", [1, -1])
def test_split_token_count_must_be_the_sum_of_its_shards(ds, delta):
    meta = json.loads((ds / "meta.json").read_text())
    meta["splits"]["train"]["n_tokens"] += delta
    (ds / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="shard token counts do not add up"):
        TokenShards(ds, "train")


def test_corrupted_shard_caught_by_verify(ds):
    path = ds / "train_0000.bin"
    ids = np.fromfile(path, dtype="<u2")
    ids[:10] = ids[:10][::-1].copy()  # same size, ids still in vocabulary
    ids.tofile(path)
    TokenShards(ds, "train")  # size and vocabulary checks pass
    with pytest.raises(ValueError, match=r"train_0000\.bin.*sha256"):
        TokenShards(ds, "train", verify=True)


def test_wrong_vocabulary_in_shard(ds):
    meta = json.loads((ds / "meta.json").read_text())
    meta["vocab_size"], meta["eot"] = 300, 299  # the synthetic ids go up to 511 (an eot >= 300: malformed)
    (ds / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"train_0000\.bin.*wrong vocabulary"):
        TokenShards(ds, "train")


def test_vocab_too_large_for_model(ds):
    shards = TokenShards(ds, "train")
    with pytest.raises(ValueError, match=r"meta\.json.*512 > model vocab_size 256"):
        shards.check_vocab(256)


def test_unknown_split_lists_available(ds):
    with pytest.raises(ValueError, match=r"meta\.json.*'dev'.*test, train, val"):
        TokenShards(ds, "dev")


def test_bad_format_version(ds):
    meta = json.loads((ds / "meta.json").read_text())
    meta["format_version"] = 99
    (ds / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"meta\.json.*format_version"):
        TokenShards(ds, "train")


def test_bad_sources(tmp_path):
    with pytest.raises(ValueError, match="unknown source 'openwebtext'"):
        prepare("openwebtext", tmp_path / "x", progress=False)
    with pytest.raises(FileNotFoundError, match="no_such_text"):
        prepare(f"text:{tmp_path / 'no_such_text'}", tmp_path / "x", progress=False)
    with pytest.raises(FileNotFoundError, match="no_such_bins"):
        prepare(f"bin:{tmp_path / 'no_such_bins'}", tmp_path / "x", progress=False)
    with pytest.raises(ValueError, match="unknown split"):
        prepare("synthetic", tmp_path / "x", splits=("train", "dev"), progress=False)
    bad = tmp_path / "bad.utf8"
    bad.mkdir()
    (bad / "a.txt").write_bytes(b"\xff\xfe\xfa not utf-8")
    with pytest.raises(ValueError, match=r"bad\.utf8/a\.txt: not UTF-8"):
        prepare(f"text:{bad}", tmp_path / "x", progress=False)


def test_bad_bin_files(tmp_path):
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x02\x03")
    with pytest.raises(ValueError, match=r"odd\.bin.*uint16"):
        import_bin({"train": odd}, tmp_path / "o", progress=False)
    big = tmp_path / "big.bin"
    np.array([1, 2, 60000], dtype="<u2").tofile(big)
    with pytest.raises(ValueError, match=r"big\.bin.*60000 >= vocab_size 50257"):
        import_bin({"train": big}, tmp_path / "o", progress=False)
    with pytest.raises(FileNotFoundError, match=r"gone\.bin"):
        import_bin({"train": tmp_path / "gone.bin"}, tmp_path / "o", progress=False)


@pytest.mark.parametrize("link", ["dangling", "loop"])
def test_a_split_file_that_is_a_broken_link_is_named_not_dropped(tmp_path, capsys, link):
    """A val.bin that was a dangling symlink (or a loop) was left out silently: the dataset had no val
    split, exit 0 (a val.bin folder was refused)."""
    src = tmp_path / "src"
    src.mkdir()
    np.arange(100, dtype="<u2").tofile(src / "train.bin")
    (src / "val.bin").symlink_to(
        tmp_path / "unmounted" / "val.bin" if link == "dangling" else src / "val.bin"
    )
    assert main(["data", "prepare", "--source", f"bin:{src}", "--out", str(tmp_path / "out")]) == 2
    assert "token file not found" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_import_refuses_to_overwrite_its_source(tmp_path):
    src = tmp_path / "train_0000.bin"
    np.array([1, 2, 3], dtype="<u2").tofile(src)
    with pytest.raises(ValueError, match=r"train_0000\.bin.*overwrite"):
        import_bin({"train": src}, tmp_path, progress=False)
    assert src.stat().st_size == 6
    other = tmp_path / "corpus.train.bin"  # beside meta.json, referenced in place: fine
    np.array([1, 2, 3], dtype="<u2").tofile(other)
    meta = import_bin({"train": other}, tmp_path, copy=False, progress=False)
    assert meta["splits"]["train"]["shards"][0]["file"] == "corpus.train.bin"
    assert TokenShards(tmp_path, "train", verify=True).tokens().tolist() == [1, 2, 3]


def test_a_copy_into_the_folder_of_its_token_files_is_refused(tmp_path, capsys):
    """`data prepare --source bin:DIR --out DIR` wrote train_0000.bin beside train.bin, and the next prepare
    of DIR read both (twice the tokens). Copying into the files' own folder is refused, before anything is
    written; --reference still wraps them in place."""
    for split in ("train", "val"):
        np.arange(100, dtype="<u2").tofile(tmp_path / f"{split}.bin")
    argv = ["data", "prepare", "--source", f"bin:{tmp_path}", "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "is the folder of the token files" in err and "--reference" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.bin", "val.bin"]
    assert main([*argv, "--reference"]) == 0
    assert TokenShards(tmp_path, "train").n_tokens == 100


def test_wider_integer_bin_files_are_refused(tmp_path):
    ids = np.random.default_rng(0).integers(1, 50257, 1000)
    for width in ("int32", "int64"):
        path = tmp_path / f"corpus_{width}.train.bin"
        ids.astype(np.dtype(width).newbyteorder("<")).tofile(path)
        with pytest.raises(ValueError, match=rf"corpus_{width}\.train\.bin: looks like {width} token ids"):
            import_bin({"train": path}, tmp_path / f"o_{width}", progress=False)
    ok = tmp_path / "ok" / "corpus.train.bin"
    ok.parent.mkdir()
    ids.astype("<u2").tofile(ok)
    meta = prepare(f"bin:{ok.parent}", tmp_path / "o", progress=False)
    assert meta["splits"]["train"]["n_tokens"] == 1000


@pytest.mark.parametrize("content", [b"", b"  \n\n\t\n"])
def test_empty_text_sources_are_named(tmp_path, content):
    single = tmp_path / "notes.txt"
    single.write_bytes(content)
    with pytest.raises(ValueError, match=r"notes\.txt: (empty text file|no text)"):
        prepare(f"text:{single}", tmp_path / "o", progress=False)
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_bytes(content)
    (folder / "b.md").write_bytes(content)
    with pytest.raises(ValueError, match=r"docs: (every text file in it is empty|no text, only whitespace)"):
        prepare(f"text:{folder}", tmp_path / "o", progress=False)


@pytest.mark.parametrize(
    "edit, problem",
    [
        (lambda m: m.pop("splits"), "'splits' must be an object"),
        (lambda m: m.update(vocab_size="512"), "'vocab_size' must be a non-negative integer"),
        (lambda m: m.update(tokenizer=None), "'tokenizer' must be an object"),
        (lambda m: m["splits"].update(train=[]), "split 'train' needs 'n_tokens'"),
        (lambda m: m["splits"]["train"]["shards"][0].pop("bytes"), "'n_tokens' and 'bytes' must be integers"),
        (lambda m: m["splits"]["val"]["shards"].append("x.bin"), "split 'val': every shard needs a 'file'"),
        # the element type is the writer's; another one was read as uint16 (int32 ids as id, 0, id, 0, ...)
        (lambda m: m.update(dtype="int32"), "'dtype' is 'int32': shards are read as little-endian uint16"),
        (lambda m: m.update(byteorder="big"), "'byteorder' is 'big': shards are read as little-endian"),
        (lambda m: m.pop("dtype"), "'dtype' is None"),
        # GPT-2 ids with another eot: every document boundary moved (--doc-clusters, overlap), unnoticed
        (lambda m: m["tokenizer"].update(name="gpt2"), "GPT-2 tokens have vocab_size 50257 and eot 50256"),
    ],
)
def test_malformed_meta_is_named(ds, edit, problem):
    meta = json.loads((ds / "meta.json").read_text())
    edit(meta)
    (ds / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=rf"ds/meta\.json: malformed meta\.json \(.*{problem}"):
        TokenShards(ds, "train")
    (ds / "meta.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"meta\.json: malformed meta\.json"):
        TokenShards(ds, "train")


def test_largest_token_id_must_be_below_vocab_size(ds):
    meta = json.loads((ds / "meta.json").read_text())
    top = int(TokenShards(ds, "train").tokens().max())
    meta["vocab_size"] = top + 1  # every id fits
    (ds / "meta.json").write_text(json.dumps(meta))
    TokenShards(ds, "train")
    meta["vocab_size"], meta["eot"] = top, top - 1  # id ``top`` is one past the last valid id (eot too)
    (ds / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=rf"token id {top} >= vocab_size {top}"):
        TokenShards(ds, "train")


def test_bin_import_refuses_the_first_id_past_the_vocabulary(tmp_path):
    src = tmp_path / "raw"
    src.mkdir()
    ids = np.arange(100, dtype="<u2")
    ids[7] = GPT2_VOCAB - 1  # the largest valid id
    ids.tofile(src / "x.train.bin")
    import_bin({"train": src / "x.train.bin"}, tmp_path / "ok", progress=False)
    ids[7] = GPT2_VOCAB
    ids.tofile(src / "x.train.bin")
    with pytest.raises(ValueError, match=rf"x\.train\.bin: token id {GPT2_VOCAB} >= vocab_size {GPT2_VOCAB}"):
        import_bin({"train": src / "x.train.bin"}, tmp_path / "bad", progress=False)


def test_shard_writer_refuses_the_first_id_past_the_vocabulary(tmp_path):
    from kinterval.data.writer import ShardWriter

    writer = ShardWriter(tmp_path, "train", vocab_size=10)
    writer.write(np.array([0, 9]))  # the smallest and the largest valid id
    for bad in (10, -1):
        with pytest.raises(ValueError, match=r"token id out of range \[0, 10\) for split 'train'"):
            writer.write(np.array([3, bad]))
    assert writer.close()[0]["n_tokens"] == 2  # nothing of a refused array was written


def test_a_prepare_that_fails_part_way_leaves_the_old_dataset_whole(tmp_path, monkeypatch):
    """The new shards go to a staging folder and replace the old dataset only once all are written: a
    prepare that dies midway (a bad row deep in a stream, Ctrl-C) leaves the old meta.json and shards as
    they were, and no partial shard. It used to delete the old dataset first and leave *.tmp files."""
    import importlib

    from kinterval.data.writer import STAGING

    prepare_module = importlib.import_module("kinterval.data.prepare")  # the module, not the function

    out = tmp_path / "syn"
    prepare("synthetic", out, tokens=5_000, seed=0, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def die(stage, splits, *args):
        (stage / "train_0000.bin").write_bytes(b"\0\0" * 5_000)  # a new shard of the old size
        (stage / "val_0000.bin.tmp").write_bytes(b"\0\0")
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_module, "_synthetic", die)
    with pytest.raises(KeyboardInterrupt):
        prepare("synthetic", out, tokens=5_000, seed=1, progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and not (out / STAGING).exists()
    TokenShards(out, "train")


def test_a_bin_import_that_fails_part_way_leaves_the_old_dataset_whole(tmp_path, monkeypatch):
    """bin: wrote its copies straight into --out after removing the dataset there: Ctrl-C or a full disk
    during the copy left an empty folder. It stages them as the other sources do."""
    from kinterval.data import writer

    src = tmp_path / "tokens"
    src.mkdir()
    (np.arange(3000) % 50).astype(np.uint16).tofile(src / "train.bin")
    out = tmp_path / "d"
    prepare("synthetic", out, tokens=5_000, seed=0, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def die(self, ids):
        raise KeyboardInterrupt

    monkeypatch.setattr(writer.ShardWriter, "write", die)
    with pytest.raises(KeyboardInterrupt):
        prepare(f"bin:{src}", out, progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    monkeypatch.undo()
    prepare(f"bin:{src}", out, progress=False)  # and a whole import replaces it
    assert TokenShards(out, "train").n_tokens == 3000


def test_a_bad_row_deep_in_an_hf_stream_leaves_the_old_dataset(tmp_path):
    """Row 2500 of a local jsonl holds a number where the text goes: found after the rows before it were
    written, and the old dataset used to be gone by then."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": 7 if i == 2500 else f"row {i}"}) + "\n" for i in range(3000)))
    out = tmp_path / "d"
    prepare("synthetic", out, tokens=5_000, seed=0, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ValueError, match="row 2500"):
        prepare(f"hf:{rows}", out, progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize("foreign", ["meta.json", "train_1.bin"])
def test_a_folder_of_another_tools_files_is_refused_and_left_alone(tmp_path, foreign):
    """A meta.json that is not a kinterval dataset's, or pre-tokenized files of the bin: layout (train_1.bin):
    preparing there deleted them (or wrote new shards beside them, which a bin: import reads together)."""
    out = tmp_path / "d"
    out.mkdir()
    (out / foreign).write_text('{"my": "notes"}')
    with pytest.raises(ValueError, match=rf"{foreign} is not"):
        prepare("synthetic", out, tokens=5_000, seed=0, progress=False)
    assert [p.name for p in out.iterdir()] == [foreign]
    assert main(["data", "prepare", "--source", "synthetic", "--out", str(out), "--quiet"]) == 2


@pytest.mark.parametrize(
    "source, kw, message",
    [("synthetic", {"seed": -1}, "seed must be"),
     ("synthetic", {"shard_tokens": 0}, "shard_tokens must be"),
     ("synthetic", {"tokens": 0}, "tokens must be positive"),
     ("text:{missing}", {}, "text source not found"),
     ("text:{text}", {"bpe_file": "{missing}"}, "not found")],
)  # fmt: skip
def test_bad_input_leaves_an_existing_dataset_in_place(tmp_path, ds, source, kw, message):
    """These used to fail only after clear_outputs had removed the meta.json and shards already in ``out``."""
    (tmp_path / "doc.txt").write_text("some text\n")
    fill = {"missing": tmp_path / "missing", "text": tmp_path / "doc.txt"}
    kw = {k: v.format(**fill) if isinstance(v, str) else v for k, v in kw.items()}
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        prepare(source.format(**fill), ds, progress=False, **kw)
    assert TokenShards(ds, "train").n_tokens == 20_000


@pytest.mark.parametrize("reference", [False, True])
def test_a_refused_bin_import_leaves_the_dataset_in_out_byte_unchanged(tmp_path, ds, capsys, reference):
    """The vocabulary check used to run after clear_outputs: a file with an id past the vocabulary (here in
    the last file of the last split) emptied ``out`` before it was refused."""
    from kinterval import cli

    before = {p.name: p.read_bytes() for p in ds.iterdir()}
    raw = tmp_path / "raw"
    raw.mkdir()
    np.arange(100, dtype="<u2").tofile(raw / "x.train.bin")
    bad = np.arange(100, dtype="<u2")
    bad[-1] = 60_000
    bad.tofile(raw / "x.val.bin")
    argv = ["data", "prepare", "--source", f"bin:{raw}", "--out", str(ds), "--quiet"]
    assert cli.main(argv + ["--reference"] * reference) == 2
    assert "token id 60000 >= vocab_size 50257" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in ds.iterdir()} == before
    with pytest.raises(ValueError, match="need 0 <= eot < vocab_size"):  # the API's own arguments, too
        import_bin({"train": raw / "x.train.bin"}, ds, eot=60_000, progress=False)
    assert {p.name: p.read_bytes() for p in ds.iterdir()} == before


@pytest.mark.parametrize("eot", [512, 99_999])
def test_meta_json_eot_must_be_below_vocab_size(ds, capsys, eot):
    """An eot no token can equal used to be accepted: eval --doc-clusters then saw one document."""
    from kinterval.data.loader import read_meta

    meta = json.loads((ds / "meta.json").read_text())
    meta["eot"] = eot
    (ds / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(
        ValueError, match=rf"malformed meta\.json \('eot' {eot} must be below 'vocab_size' 512"
    ):
        read_meta(ds)
    with pytest.raises(ValueError, match="'eot'"):
        TokenShards(ds, "val")
    meta["eot"] = 511  # the largest valid one
    (ds / "meta.json").write_text(json.dumps(meta))
    assert TokenShards(ds, "val").eot == 511


@pytest.mark.parametrize("route", ["env", "flag"])
@pytest.mark.parametrize("ranks", ["missing", "wrong"])
def test_a_bad_bpe_file_refuses_a_bin_import_and_leaves_the_dataset_in_out(
    tmp_path, ds, capsys, monkeypatch, route, ranks
):
    """bin: used to clear ``out`` before it hashed the ranks file (a missing $KINTERVAL_BPE_FILE then cost the
    dataset there), and recorded the sha256 of a ranks file that is not GPT-2's (--bpe-file was ignored)."""
    from kinterval import cli

    before = {p.name: p.read_bytes() for p in ds.iterdir()}
    raw = tmp_path / "raw"
    raw.mkdir()
    np.arange(100, dtype="<u2").tofile(raw / "x.train.bin")
    np.arange(100, dtype="<u2").tofile(raw / "x.val.bin")
    bpe = tmp_path / "gpt2.tiktoken"
    if ranks == "wrong":
        bpe.write_text("wrong\n")
    argv = ["data", "prepare", "--source", f"bin:{raw}", "--out", str(ds), "--quiet"]
    if route == "env":
        monkeypatch.setenv("KINTERVAL_BPE_FILE", str(bpe))
    else:
        argv += ["--bpe-file", str(bpe)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    want = "GPT-2 BPE ranks file not found" if ranks == "missing" else "not the GPT-2 ranks file"
    assert want in err and str(bpe) in err and "\n" not in err
    assert {p.name: p.read_bytes() for p in ds.iterdir()} == before
    if route == "env":  # the API's default tokenizer record, too
        with pytest.raises((FileNotFoundError, ValueError), match=want):
            import_bin({"train": raw / "x.train.bin"}, ds, progress=False)
        assert {p.name: p.read_bytes() for p in ds.iterdir()} == before


def test_a_bin_import_records_the_gpt2_ranks_file(tmp_path, monkeypatch):
    from kinterval.data.tokenizer import GPT2_BPE_SHA256, PACKAGED_BPE_FILE

    raw = tmp_path / "raw"
    raw.mkdir()
    np.arange(100, dtype="<u2").tofile(raw / "x.train.bin")
    monkeypatch.setenv("KINTERVAL_BPE_FILE", str(PACKAGED_BPE_FILE))
    meta = prepare(f"bin:{raw}", tmp_path / "o", progress=False)
    assert meta["tokenizer"] == {"name": "gpt2", "sha256": GPT2_BPE_SHA256}


@pytest.mark.parametrize(
    ("source", "extra", "message"),
    [("text:{text}", ["--split", "val"], "--split val writes no train split"),
     ("text:{text}", ["--split", "test"], "--split test writes no train split"),
     ("ptb", [], "--source ptb writes the test split only"),
     ("c4", [], "--source c4 writes val only"),
     ("bin:{raw}", [], "needs a train split; the files are of ['val']")],
)  # fmt: skip
def test_tokens_is_refused_where_no_train_split_is_written(tmp_path, ds, capsys, monkeypatch, source, extra,
                                                           message):  # fmt: skip
    """--tokens used to be accepted and ignored there, while meta.json recorded params.tokens as the cap."""
    from kinterval import cli
    from kinterval.data import sources

    monkeypatch.setattr(sources, "ptb_test_document", lambda: pytest.fail("the Hub was reached"))
    monkeypatch.setattr(sources, "c4_validation_documents", lambda n: pytest.fail("the Hub was reached"))
    (tmp_path / "txt").mkdir()
    (tmp_path / "txt" / "doc.txt").write_text("some text\n")
    (tmp_path / "raw").mkdir()
    np.arange(100, dtype="<u2").tofile(tmp_path / "raw" / "x.val.bin")
    before = {p.name: p.read_bytes() for p in ds.iterdir()}
    source = source.format(text=tmp_path / "txt", raw=tmp_path / "raw")
    argv = ["data", "prepare", "--source", source, "--out", str(ds), "--quiet"] + extra
    assert cli.main(argv + ["--tokens", "1000"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "--tokens" in err and "\n" not in err
    assert {p.name: p.read_bytes() for p in ds.iterdir()} == before
    if source.startswith("text:"):  # without --tokens the same split is written whole
        assert cli.main(argv) == 0
        assert TokenShards(ds, extra[1]).n_tokens > 0


def test_a_bpe_file_with_the_synthetic_source_is_refused(tmp_path):
    """--bpe-file nope with --source synthetic (generated ids, no tokenizer) was silently ignored."""
    with pytest.raises(ValueError, match="--bpe-file applies to GPT-2-tokenized sources"):
        prepare("synthetic", tmp_path / "s", tokens=1_000, bpe_file="nope", progress=False)
    assert not (tmp_path / "s").exists()


def test_a_seed_with_another_source_than_synthetic_is_refused(tmp_path, capsys):
    """--seed 7 with a text: source gave byte-identical shards and recorded nothing (the CLI's default 0
    could not tell a given seed from none)."""
    from kinterval import cli

    (tmp_path / "a.txt").write_text("one document.\n")
    with pytest.raises(ValueError, match="--seed applies to the synthetic source only"):
        prepare(f"text:{tmp_path / 'a.txt'}", tmp_path / "t", seed=7, progress=False)
    args = ["data", "prepare", "--source", f"text:{tmp_path / 'a.txt'}", "--out", str(tmp_path / "t")]
    assert cli.main([*args, "--seed", "0"]) == 2
    assert "--seed applies to the synthetic source only" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()
    assert cli.main([*args, "--quiet"]) == 0


TOY = {"name": "toy", "sha256": None}


def test_import_bin_argument_bounds_aliases_all_zero_files_and_document_counts(tmp_path):
    """A train cap of 0 tokens and an eot equal to the vocabulary size are refused; a shard writer takes at
    most 65536 ids; ``x.validation.bin`` is the val split; a file of zeros is uint16 (not a wider file); the
    documents are the eot ids, not their neighbours."""
    from kinterval.data.import_bin import find_bin_files
    from kinterval.data.writer import ShardWriter

    raw = tmp_path / "raw"
    raw.mkdir()
    ids = np.array([5, 6, 7, 8, 9] * 10, dtype="<u2")  # eot 9: ten documents, ids 8 beside each
    ids.tofile(raw / "x.train.bin")
    np.zeros(32, "<u2").tofile(raw / "x.validation.bin")
    assert {s: [p.name for p in g] for s, g in find_bin_files(raw).items()} == {
        "train": ["x.train.bin"],
        "val": ["x.validation.bin"],
    }
    files = {"train": raw / "x.train.bin"}
    for kw, says in (({"tokens": 0}, "tokens must be a positive integer"), ({"eot": 10}, "need 0 <= eot <")):
        with pytest.raises(ValueError, match=says):
            import_bin(
                files, tmp_path / "o", **{"vocab_size": 10, "eot": 9, **kw}, tokenizer=TOY, progress=False
            )
    with pytest.raises(ValueError, match="does not fit the uint16"):
        ShardWriter(tmp_path / "o", "train", vocab_size=(1 << 16) + 1)
    with pytest.raises(ValueError, match="GPT-2 tokens have vocab_size 50257 and eot 50256, got 10, 9"):
        import_bin(find_bin_files(raw), tmp_path / "o", vocab_size=10, eot=9, progress=False)
    meta = import_bin(
        find_bin_files(raw), tmp_path / "o", vocab_size=10, eot=9, tokenizer=TOY, progress=False
    )
    assert meta["splits"]["train"]["n_documents"] == 10 and meta["splits"]["val"]["n_tokens"] == 32
    assert TokenShards(tmp_path / "o", "train").eot == 9  # readable: the loader takes a toy tokenizer's eot


def test_a_meta_json_of_bytes_that_are_not_text_is_a_named_error(ds):
    """A meta.json holding non-UTF-8 bytes stopped `eval` and `data overlap` with a UnicodeDecodeError."""
    from kinterval.data.loader import read_meta

    (ds / "meta.json").write_bytes(b'{"format_version": \xff\xfe}')
    with pytest.raises(ValueError, match=r"meta\.json: not valid JSON"):
        read_meta(ds)


def test_a_dataset_path_that_is_a_file_is_named_as_such(tmp_path):
    """``--against-data FILE`` said "dataset directory not found" of a path that exists."""
    (tmp_path / "afile").write_text("x")
    from kinterval.data.loader import read_meta

    with pytest.raises(ValueError, match=r"afile is not a folder \(a dataset folder of `kinterval data"):
        read_meta(tmp_path / "afile")
    with pytest.raises(FileNotFoundError, match="dataset directory not found"):
        read_meta(tmp_path / "none")


def test_synthetic_tokens_beyond_the_free_disk_are_refused_before_writing(tmp_path, capsys, monkeypatch):
    """``--source synthetic --tokens 1e12`` began writing 2 TB of shards (974 MB in six minutes), to fail
    when the disk was full."""
    import collections
    import shutil

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(2**41, 0, 2**40))  # 1 TiB free
    argv = ["data", "prepare", "--source", "synthetic", "--tokens", str(10**12), "--out", str(tmp_path / "d")]
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--tokens 1,000,000,000,000: the synthetic splits take 2048.9 GiB" in err and "GiB free" in err
    assert not (tmp_path / "d").exists()
