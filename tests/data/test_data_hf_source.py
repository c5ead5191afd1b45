"""``--source hf:PATH``: any Hugging Face dataset streamed (offline here: local data files and folders, and
the Hub call checked by its arguments)."""

from __future__ import annotations

import itertools
import json
import sys

import numpy as np
import pytest

from kinterval.cli import main
from kinterval.data import TokenShards, prepare, sources
from kinterval.data.tokenizer import EOT, PACKAGED_BPE_FILE, gpt2_encoding

ENC = gpt2_encoding(PACKAGED_BPE_FILE)


def docs(n: int, with_id: bool = True) -> list[dict]:
    return [
        ({"id": f"doc-{i}"} if with_id else {})
        | {"text": f"Document {i}. " + "A line of prose. " * (i % 5 + 1)}
        for i in range(n)
    ]


def write_jsonl(path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def split_ids(out, split) -> list[int]:
    return TokenShards(out, split).tokens().tolist()


def expected(texts) -> list[int]:
    return [t for text in texts for t in ENC.encode_ordinary(text) + [EOT]]


@pytest.mark.parametrize("with_id", [True, False])
def test_a_local_folder_splits_by_the_md5_of_id_or_the_stream_index(tmp_path, with_id):
    rows = docs(300, with_id)
    write_jsonl(tmp_path / "ds" / "part.jsonl", rows)
    meta = prepare(f"hf:{tmp_path / 'ds'}", tmp_path / "out", bpe_file=PACKAGED_BPE_FILE, progress=False)
    for split in ("train", "val", "test"):
        keys = [r["id"] if with_id else str(i) for i, r in enumerate(rows)]
        want = [r["text"] for r, key in zip(rows, keys) if sources.md5_split(key) == split]  # in stream order
        assert split_ids(tmp_path / "out", split) == expected(want), split
        assert meta["splits"][split]["n_documents"] == len(want)
    assert 0 < meta["splits"]["val"]["n_documents"] < 20
    assert meta["params"]["hf_split"] == "train" and meta["params"]["text_field"] == "text"
    assert meta["params"]["split_rule"].startswith("int(md5(id, else stream index), 16) % 100")


def test_a_data_file_a_text_field_and_one_split(tmp_path):
    """A parquet file, the text in "content", every document into val; empty and None texts dropped."""
    import pandas as pd  # a dependency of datasets

    texts = ["First document.", "   ", None, "Second one, longer than the first."]
    pd.DataFrame({"content": texts}).to_parquet(tmp_path / "d.parquet")
    meta = prepare(f"hf:{tmp_path / 'd.parquet'}", tmp_path / "out", text_field="content", split="val",
                   bpe_file=PACKAGED_BPE_FILE, progress=False)  # fmt: skip
    assert list(meta["splits"]) == ["val"]
    assert split_ids(tmp_path / "out", "val") == expected([texts[0], texts[3]])


def test_a_data_file_named_like_a_glob_pattern_is_that_file(tmp_path):
    """hf:d[1].jsonl read d1.jsonl's rows (datasets globs data_files)."""
    write_jsonl(tmp_path / "d[1].jsonl", [{"text": "The real one."}])
    write_jsonl(tmp_path / "d1.jsonl", [{"text": "Another file."}])
    prepare(f"hf:{tmp_path / 'd[1].jsonl'}", tmp_path / "out", split="train", bpe_file=PACKAGED_BPE_FILE,
            progress=False)  # fmt: skip
    assert split_ids(tmp_path / "out", "train") == expected(["The real one."])


def test_tokens_caps_train_and_stops_reading(tmp_path, monkeypatch):
    """--tokens: train cut at exactly N tokens, and the stream is not read to its end (a Hub dataset may hold
    billions of tokens)."""
    consumed = []

    def endless(path, config, split):
        for i in itertools.count():
            consumed.append(i)
            assert i < 5_000, "read on after train was full"
            yield {"id": f"d{i}", "text": f"Row {i} of an endless stream."}

    monkeypatch.setattr(sources, "stream_hf", endless)
    meta = prepare(
        "hf:some/dataset", tmp_path / "out", tokens=5_000, bpe_file=PACKAGED_BPE_FILE, progress=False
    )
    assert meta["splits"]["train"]["n_tokens"] == 5_000
    assert meta["splits"]["val"]["n_tokens"] > 0 and len(consumed) < 2_000


def test_the_hub_is_streamed_with_the_given_config_and_split(monkeypatch):
    """A name that is not a local path goes to datasets.load_dataset(name, config, split=..., streaming=True),
    and the first row is read before prepare clears anything."""
    import datasets

    calls = []

    def load_dataset(*args, **kw):
        calls.append((args, kw))
        return iter([{"text": "one"}, {"text": "two"}])

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    rows = sources.stream_hf("roneneldan/TinyStories", "cfg", "validation")
    assert calls == [(("roneneldan/TinyStories", "cfg"), {"split": "validation", "streaming": True})]
    assert [r["text"] for r in rows] == ["one", "two"]


def test_bad_input_is_refused_before_the_old_dataset_goes(tmp_path, capsys):
    out = tmp_path / "out"
    prepare("synthetic", out, tokens=10_000, progress=False)
    before = (out / "meta.json").read_text()
    write_jsonl(tmp_path / "ds" / "a.jsonl", docs(20))
    write_jsonl(tmp_path / "empty" / "a.jsonl", [])
    write_jsonl(tmp_path / "blank" / "a.jsonl", [{"text": "  "}, {"text": None}])
    (tmp_path / "f.xyz").write_text("x")
    no_field = "has no text field 'body'; its fields: ['id', 'text']"
    cases = [
        (["--source", f"hf:{tmp_path / 'ds'}", "--text-field", "body"], no_field),
        (["--source", f"hf:{tmp_path / 'ds'}", "--hf-split", "validation"], "Bad split: validation"),
        (["--source", f"hf:{tmp_path / 'ds'}", "--hf-config", "nope"], "BuilderConfig 'nope' not found"),
        (["--source", f"hf:{tmp_path / 'empty'}"], "holds no row"),
        (["--source", f"hf:{tmp_path / 'f.xyz'}"], "a data file must end in one of .jsonl"),
        # a data file has one split: another name was recorded as its split and changed nothing
        (["--source", f"hf:{tmp_path / 'blank' / 'a.jsonl'}", "--hf-split", "val"], "a data file is one"),
        (["--source", "hf:"], "needs a path after 'hf:'"),
        (["--source", "synthetic", "--text-field", "text"], "--text-field applies to an hf:PATH source only"),
        (["--source", f"text:{tmp_path / 'ds'}", "--hf-split", "train"], "--hf-split applies to an hf:PATH"),
        (["--source", "c4", "--split", "val"], "--split applies to a text:PATH or hf:PATH source only"),
        # rows, but none with text: found by reading ahead, before anything is removed
        (["--source", f"hf:{tmp_path / 'blank'}"], "no row of split 'train' holds text in field 'text'"),
    ]  # fmt: skip
    for argv, message in cases:
        assert main(["data", "prepare", *argv, "--out", str(out), "--quiet"]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (argv, err)
        assert (out / "meta.json").read_text() == before


def test_rows_without_text_before_the_first_document_are_skipped_not_lost(tmp_path):
    """The rows read ahead for the first document are routed and written like every other row."""
    rows = [{"text": None}, {"text": " "}] * 30 + docs(100, with_id=False)
    write_jsonl(tmp_path / "ds" / "a.jsonl", rows)
    meta = prepare(f"hf:{tmp_path / 'ds'}", tmp_path / "out", bpe_file=PACKAGED_BPE_FILE, progress=False)
    for split in ("train", "val", "test"):
        want = [r["text"] for i, r in enumerate(rows) if r["text"] and r["text"].strip()
                and sources.md5_split(str(i)) == split]  # fmt: skip
        assert split_ids(tmp_path / "out", split) == expected(want), split
        assert meta["splits"][split]["n_documents"] == len(want)


def test_the_cli_prepares_a_folder_training_can_read(tmp_path, capsys):
    write_jsonl(tmp_path / "ds" / "a.jsonl", [{"body": r["text"]} for r in docs(200, with_id=False)])
    argv = [
        "data",
        "prepare",
        "--source",
        f"hf:{tmp_path / 'ds'}",
        "--text-field",
        "body",
        "--split",
        "train",
    ]
    assert main([*argv, "--out", str(tmp_path / "out"), "--quiet", "--block-size", "64"]) == 0
    assert "prepared hf:" in capsys.readouterr().out
    ids = np.asarray(split_ids(tmp_path / "out", "train"))
    assert np.sum(ids == EOT) == 200 and TokenShards(tmp_path / "out", "train").vocab_size == 50257


def test_a_folder_of_several_data_formats_is_refused(tmp_path, capsys):
    """datasets reads only the most common format of a folder: a corpus.jsonl beside two .txt notes would be
    dropped for the notes without a word. Refused; one format (hidden files and a README aside) is read."""
    write_jsonl(tmp_path / "ds" / "corpus.jsonl", docs(30))
    (tmp_path / "ds" / "a.txt").write_text("note one\n")
    (tmp_path / "ds" / "sub").mkdir()
    (tmp_path / "ds" / "sub" / "b.txt").write_text("note two\n")
    argv = ["data", "prepare", "--source", f"hf:{tmp_path / 'ds'}", "--out", str(tmp_path / "out"), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "data files of several formats (text: a.txt, sub/b.txt; json: corpus.jsonl)" in err, err
    assert err.count("\n") == 1
    for f in ("a.txt", "sub/b.txt"):
        (tmp_path / "ds" / f).unlink()
    (tmp_path / "ds" / ".notes.txt").write_text("hidden\n")
    (tmp_path / "ds" / "README.md").write_text("# a corpus\n")
    assert main(argv) == 0
    assert split_ids(tmp_path / "out", "train") == expected(
        [r["text"] for r in docs(30) if sources.md5_split(r["id"]) == "train"]
    )


def test_a_missing_local_path_is_named_not_sent_to_the_hub(tmp_path, monkeypatch, capsys):
    """A path that cannot be a Hub id (NAME or OWNER/NAME) and does not exist is a one-line error at once,
    not half a minute of offline retries ending in 'Repo id must use alphanumeric chars'; a Hub id that
    fails says that no local path of that name exists either."""
    import datasets

    def offline(*args, **kw):
        if args[0] == "owner/corpus":
            raise ConnectionError("Couldn't reach 'owner/corpus' on the Hub (LocalEntryNotFoundError)")
        raise AssertionError(f"load_dataset called for {args}")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    out = str(tmp_path / "out")
    for path in ("./nosuchdir", str(tmp_path / "missing"), "data/sub/corpus", "corpus.jsonl", "x.PARQUET"):
        assert main(["data", "prepare", "--source", f"hf:{path}", "--out", out, "--quiet"]) == 2, path
        err = capsys.readouterr().err
        assert err == f"kinterval data: error: hf:{path}: no such file or folder\n", err
    assert main(["data", "prepare", "--source", "hf:owner/corpus", "--out", out, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "kinterval data: error: hf:owner/corpus (no local file or folder of that name: read as a Hub id): "
        "could not download owner/corpus from the Hugging Face Hub"
    ), err


def test_a_data_file_takes_any_suffix_case_and_no_config(tmp_path, capsys):
    """d.JSONL is a JSON-lines file; --hf-config on a data file was accepted and recorded while the packaged
    builder ignored it: refused now."""
    write_jsonl(tmp_path / "d.JSONL", docs(20, with_id=False))
    out = str(tmp_path / "out")
    argv = ["data", "prepare", "--source", f"hf:{tmp_path / 'd.JSONL'}", "--out", out, "--quiet"]
    argv += ["--split", "val"]
    assert main(argv) == 0
    assert split_ids(out, "val") == expected([r["text"] for r in docs(20)])
    assert main([*argv, "--hf-config", "foo"]) == 2
    err = capsys.readouterr().err
    assert err.endswith("d.JSONL: --hf-config names a dataset's configuration; a data file has none\n"), err


def test_a_row_that_cannot_be_read_is_one_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    """A truncated .arrow file raised pyarrow's OSError at the first row, and a malformed line deep in a big
    file pyarrow's ArrowInvalid in the middle of the stream: both were tracebacks."""
    import datasets
    import pyarrow as pa
    import pyarrow.ipc as ipc

    table = pa.table({"text": [r["text"] for r in docs(50)]})
    with open(tmp_path / "d.arrow", "wb") as f, ipc.new_stream(f, table.schema) as w:
        w.write_table(table)
    data = (tmp_path / "d.arrow").read_bytes()
    (tmp_path / "d.arrow").write_bytes(data[: len(data) - 10])
    out = str(tmp_path / "out")
    assert main(["data", "prepare", "--source", f"hf:{tmp_path / 'd.arrow'}", "--out", out, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kinterval data: error: hf:{tmp_path / 'd.arrow'}: Expected to be able to read")
    assert err.count("\n") == 1

    def stream(*args, **kw):
        yield from docs(700)
        raise pa.lib.ArrowInvalid("JSON parse error: Invalid encoding in string. in row 15192")

    monkeypatch.setattr(datasets, "load_dataset", stream)
    assert main(["data", "prepare", "--source", "hf:owner/corpus", "--out", out, "--quiet"]) == 2
    assert capsys.readouterr().err == (
        "kinterval data: error: hf:owner/corpus: row 700 or a later one cannot be read: JSON parse error: "
        "Invalid encoding in string. in row 15192\n"
    )


def test_a_null_id_is_keyed_by_the_stream_index(tmp_path):
    """A null id is no key (hashing the text "None" would put every such row in one split)."""
    rows = [{"id": None if i % 2 else f"doc-{i}", "text": f"Row {i} of the dataset."} for i in range(400)]
    write_jsonl(tmp_path / "ds" / "a.jsonl", rows)
    prepare(f"hf:{tmp_path / 'ds'}", tmp_path / "out", bpe_file=PACKAGED_BPE_FILE, progress=False)
    for split in ("train", "val", "test"):
        keys = [str(i) if r["id"] is None else r["id"] for i, r in enumerate(rows)]
        want = [r["text"] for r, key in zip(rows, keys) if sources.md5_split(key) == split]
        assert split_ids(tmp_path / "out", split) == expected(want), split


@pytest.mark.parametrize("flag", ["--text-field", "--hf-split", "--hf-config"])
def test_an_empty_hf_flag_is_refused_not_read_as_its_default(tmp_path, capsys, flag):
    write_jsonl(tmp_path / "ds" / "a.jsonl", docs(5))
    argv = ["data", "prepare", "--source", f"hf:{tmp_path / 'ds'}", flag, " ", "--out", str(tmp_path / "o")]
    assert main(argv) == 2  # the command line refuses every blank value
    assert f"argument {flag}: an empty value" in capsys.readouterr().err
    with pytest.raises(ValueError, match=f"{flag} must name something, got ' '"):  # and so does prepare
        prepare(f"hf:{tmp_path / 'ds'}", tmp_path / "o", **{flag[2:].replace("-", "_"): " "}, progress=False)


def test_a_folder_saved_with_save_to_disk_is_read_with_load_from_disk(tmp_path, capsys):
    """``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` folders (which ``load_dataset`` refuses): a
    Dataset whole, a DatasetDict's --hf-split; a missing split or a --hf-config is one error line."""
    datasets = pytest.importorskip("datasets")
    rows = docs(120)
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "one"))
    bodies = [{"id": r["id"], "body": r["text"]} for r in rows]
    train, val = datasets.Dataset.from_list(bodies[:80]), datasets.Dataset.from_list(bodies[80:])
    datasets.DatasetDict({"train": train, "validation": val}).save_to_disk(str(tmp_path / "dd"))
    prepare(f"hf:{tmp_path / 'one'}", tmp_path / "o1", bpe_file=PACKAGED_BPE_FILE, progress=False)
    want = [r["text"] for r in rows if sources.md5_split(r["id"]) == "train"]
    assert split_ids(tmp_path / "o1", "train") == expected(want)
    meta = prepare(f"hf:{tmp_path / 'dd'}", tmp_path / "o2", text_field="body", hf_split="validation",
                   split="val", bpe_file=PACKAGED_BPE_FILE, progress=False)  # fmt: skip
    assert list(meta["splits"]) == ["val"]
    assert split_ids(tmp_path / "o2", "val") == expected([r["text"] for r in rows[80:]])
    for args, message in [
        (["--source", f"hf:{tmp_path / 'dd'}", "--hf-split", "test"], "no split 'test'; its splits: ['tr"),
        (["--source", f"hf:{tmp_path / 'one'}", "--hf-config", "x"], "a save_to_disk folder has none"),
        (["--source", f"hf:{tmp_path / 'one'}", "--hf-split", "validation"], "a saved Dataset is one split"),
    ]:
        assert main(["data", "prepare", *args, "--out", str(tmp_path / "o3"), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


def test_a_local_hf_path_without_datasets_is_one_error_line(tmp_path, monkeypatch, capsys):
    """hf:LOCAL (a data file, a folder, a save_to_disk folder) without the datasets package: an
    ImportError traceback from the offline switch; one line saying what to install now."""
    write_jsonl(tmp_path / "ds" / "a.jsonl", docs(5))
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    for source in (tmp_path / "ds", tmp_path / "ds" / "a.jsonl"):
        args = ["data", "prepare", "--source", f"hf:{source}", "--out", str(tmp_path / "o"), "--quiet"]
        assert main(args) == 2
        err = capsys.readouterr().err
        assert "needs the datasets package: pip install 'kinterval[data]'" in err and "Traceback" not in err


def test_a_data_folder_with_a_dataset_info_file_is_not_a_save_to_disk_folder(tmp_path):
    """A save_to_disk folder holds state.json and dataset_info.json together (or a dataset_dict.json); a
    folder of data files beside a dataset_info.json alone (datasets reads it as metadata) is read with
    load_dataset, not sent to load_from_disk."""
    assert not sources.saved_to_disk(tmp_path)
    write_jsonl(tmp_path / "ds" / "a.jsonl", docs(40))
    (tmp_path / "ds" / "dataset_info.json").write_text(json.dumps({"description": "a corpus"}))
    assert not sources.saved_to_disk(tmp_path / "ds")
    (tmp_path / "st").mkdir()
    (tmp_path / "st" / "state.json").write_text("{}")
    assert not sources.saved_to_disk(tmp_path / "st")
    (tmp_path / "st" / "dataset_info.json").write_text("{}")
    assert sources.saved_to_disk(tmp_path / "st")
    pytest.importorskip("datasets")
    prepare(f"hf:{tmp_path / 'ds'}", tmp_path / "out", bpe_file=PACKAGED_BPE_FILE, progress=False)
    want = [r["text"] for r in docs(40) if sources.md5_split(r["id"]) == "train"]
    assert split_ids(tmp_path / "out", "train") == expected(want)


def test_files_datasets_ignores_are_no_second_format(tmp_path):
    """datasets ignores files under a ``__`` folder (``__MACOSX``, ``__pycache__``) as it ignores hidden ones,
    and a README.md with ``configs:`` names the data files itself: neither is refused as a second format."""
    pytest.importorskip("datasets")
    write_jsonl(tmp_path / "ds" / "corpus.jsonl", docs(30))
    (tmp_path / "ds" / "__MACOSX").mkdir()
    (tmp_path / "ds" / "__MACOSX" / "notes.txt").write_text("not data\n")
    prepare(f"hf:{tmp_path / 'ds'}", tmp_path / "out", bpe_file=PACKAGED_BPE_FILE, progress=False)
    want = [r["text"] for r in docs(30) if sources.md5_split(r["id"]) == "train"]
    assert split_ids(tmp_path / "out", "train") == expected(want)
    write_jsonl(tmp_path / "cfg" / "corpus.jsonl", docs(30))
    (tmp_path / "cfg" / "notes.txt").write_text("not data\n")
    (tmp_path / "cfg" / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n"
        "  - split: train\n    path: corpus.jsonl\n---\n"
    )
    prepare(f"hf:{tmp_path / 'cfg'}", tmp_path / "out2", bpe_file=PACKAGED_BPE_FILE, progress=False)
    assert split_ids(tmp_path / "out2", "train") == expected(want)


def test_an_integer_id_zero_is_a_key(tmp_path):
    """An id of 0 (an integer id column counting from zero) is the key "0", not "no id": only a null id
    falls back to the stream index."""
    n = 200
    rows = [{"id": (i - 4) % n, "text": f"Row {i} of the dataset."} for i in range(n)]  # id 0: the 5th row
    assert sources.md5_split("0") != sources.md5_split("4")  # so the two keys route it apart
    write_jsonl(tmp_path / "ds" / "a.jsonl", rows)
    prepare(f"hf:{tmp_path / 'ds'}", tmp_path / "out", bpe_file=PACKAGED_BPE_FILE, progress=False)
    for split in ("train", "val", "test"):
        want = [r["text"] for r in rows if sources.md5_split(str(r["id"])) == split]
        assert split_ids(tmp_path / "out", split) == expected(want), split


def test_rows_only_for_splits_not_asked_for_are_refused_before_the_old_dataset_goes(tmp_path):
    """splits=["val"] with rows that the md5 rule all puts into train: refused when read ahead (no row a
    requested split takes; the message said no row held text), before the dataset in --out is removed."""
    out = tmp_path / "out"
    prepare("synthetic", out, tokens=10_000, progress=False)
    before = (out / "meta.json").read_text()
    rows = [r for r in docs(40) if sources.md5_split(r["id"]) == "train"][:10]
    write_jsonl(tmp_path / "ds" / "a.jsonl", rows)
    with pytest.raises(
        ValueError,
        match=r"none of the 10 documents of split 'train' goes to the split\(s\) asked for \(val\)",
    ):
        prepare(f"hf:{tmp_path / 'ds'}", out, splits=["val"], bpe_file=PACKAGED_BPE_FILE, progress=False)
    assert (out / "meta.json").read_text() == before
