"""The held-out corpora of the paper's App. C.3 layer 1: PTB test and C4 validation from the Hugging Face Hub
(faked here with ``datasets.load_dataset`` returning rows of the real schema), and local text put whole into
one split (``--split``), so that a held-out corpus arrives complete in the split it is evaluated on."""

from __future__ import annotations

import numpy as np
import pytest

datasets = pytest.importorskip("datasets")

from kinterval import cli  # noqa: E402
from kinterval.data import TokenShards, prepare  # noqa: E402
from kinterval.data.tokenizer import EOT, PACKAGED_BPE_FILE, gpt2_encoding  # noqa: E402

PTB_SENTENCES = [
    "no it was n't black monday",
    "but while the new york stock exchange did n't fall apart friday as the dow jones industrial average "
    "plunged N points most of it in the final hour it barely managed to stay this side of chaos",
    "some circuit breakers installed after the october N crash failed their first test traders say "
    "unable to cool the selling panic in both stocks and futures",
    "the <unk> stock specialist firms on the big board floor",
]


def c4_rows(n: int) -> list[dict]:
    """Rows of allenai/c4 ``en``: ``text``, ``timestamp``, ``url``."""
    return [
        {"text": f"C4 document {i}.\nIt has a second line, and words.", "timestamp": "2019-04-25 12:57:54",
         "url": f"https://example.com/page/{i}"}
        for i in range(n)
    ]  # fmt: skip


@pytest.fixture()
def hub(monkeypatch):
    """A fake Hub with the PTB test split and 400 C4 validation documents; records every call and how many C4
    rows were read."""
    calls, read = [], []

    def load_dataset(path, name=None, **kw):
        calls.append((path, name, kw))
        if (path, name, kw) == ("ptb-text-only/ptb_text_only", "penn_treebank", {"split": "test"}):
            return datasets.Dataset.from_dict({"sentence": PTB_SENTENCES})
        if (path, name, kw) == ("allenai/c4", "en", {"split": "validation", "streaming": True}):
            return (read.append(1) or row for row in c4_rows(400))  # a lazy stream of rows
        raise AssertionError(f"unexpected load_dataset({path!r}, {name!r}, {kw})")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls, read


def test_prepare_ptb_puts_every_test_sentence_in_the_test_split(tmp_path, hub):
    out = tmp_path / "ptb"
    meta = prepare("ptb", out, bpe_file=PACKAGED_BPE_FILE, progress=False)
    assert list(meta["splits"]) == ["test"]
    enc = gpt2_encoding(PACKAGED_BPE_FILE)
    text = "\n".join(PTB_SENTENCES) + "\n"  # the test file again: one sentence a line, one document
    assert TokenShards(out, "test", verify=True).tokens().tolist() == enc.encode_ordinary(text) + [EOT]
    assert meta["splits"]["test"]["n_documents"] == 1
    assert hub[0] == [("ptb-text-only/ptb_text_only", "penn_treebank", {"split": "test"})]


@pytest.mark.parametrize("documents", [None, 7])
def test_prepare_c4_takes_the_first_documents_of_the_validation_stream(tmp_path, hub, documents):
    out = tmp_path / "c4"
    meta = prepare("c4", out, documents=documents, bpe_file=PACKAGED_BPE_FILE, progress=False)
    n = documents or 302  # the paper's 302 C4 validation documents
    assert list(meta["splits"]) == ["val"] and meta["splits"]["val"]["n_documents"] == n
    assert meta["params"]["documents"] == n
    enc = gpt2_encoding(PACKAGED_BPE_FILE)
    expected = [t for row in c4_rows(n) for t in enc.encode_ordinary(row["text"]) + [EOT]]
    ids = TokenShards(out, "val", verify=True).tokens()
    assert ids.tolist() == expected and int(np.sum(ids == EOT)) == n
    assert len(hub[1]) <= n + 1  # the stream is read only as far as needed


def test_a_short_c4_stream_is_refused_before_the_folder_is_touched(tmp_path, hub):
    out = tmp_path / "d"
    prepare("synthetic", out, tokens=5_000, progress=False)
    with pytest.raises(ValueError, match=r"400 documents.*500"):
        prepare("c4", out, documents=500, bpe_file=PACKAGED_BPE_FILE, progress=False)
    assert TokenShards(out, "train").n_tokens == 5_000


def test_cli_prepares_ptb_and_c4(tmp_path, hub, capsys):
    base = ["data", "prepare", "--bpe-file", str(PACKAGED_BPE_FILE), "--quiet"]
    assert cli.main([*base, "--source", "ptb", "--out", str(tmp_path / "ptb")]) == 0
    assert cli.main([*base, "--source", "c4", "--documents", "12", "--out", str(tmp_path / "c4")]) == 0
    assert TokenShards(tmp_path / "c4", "val").tokens().tolist().count(EOT) == 12
    assert "test" in capsys.readouterr().out


@pytest.fixture()
def c4_folder(tmp_path):
    """302 local documents named doc_1 ... doc_302 (natural order differs from string order)."""
    root = tmp_path / "c4_local"
    root.mkdir()
    for i in range(1, 303):
        (root / f"doc_{i}.txt").write_text(f"Local document {i}.\n")
    return root


@pytest.mark.parametrize("split", ["val", "test", "validation"])
def test_text_source_into_one_split_keeps_every_document(tmp_path, c4_folder, split):
    """``text:DIR`` used to spread any folder over train/val/test by md5 (302 files: 292/8/2); with a split
    named, every document goes there, in natural file order, and no other split is written."""
    out = tmp_path / "held"
    meta = prepare(f"text:{c4_folder}", out, split=split, bpe_file=PACKAGED_BPE_FILE, progress=False)
    name = "val" if split == "validation" else split
    assert list(meta["splits"]) == [name] and meta["splits"][name]["n_documents"] == 302
    enc = gpt2_encoding(PACKAGED_BPE_FILE)
    expected = [t for i in range(1, 303) for t in enc.encode_ordinary(f"Local document {i}.\n") + [EOT]]
    assert TokenShards(out, name, verify=True).tokens().tolist() == expected
    with pytest.raises(ValueError, match="unknown split 'train'"):
        TokenShards(out, "train")


def test_a_single_text_file_into_one_split_keeps_paragraph_order(tmp_path):
    """A local PTB test file (no blank lines) is one document; with ``--split test`` all of it is the test
    split (it used to go wholly to train, leaving test empty)."""
    ptb = tmp_path / "ptb.test.txt"
    ptb.write_text("".join(f" {s} \n" for s in PTB_SENTENCES))
    out = tmp_path / "ptb"
    assert cli.main(["data", "prepare", "--source", f"text:{ptb}", "--split", "test", "--out", str(out),
                     "--bpe-file", str(PACKAGED_BPE_FILE), "--quiet"]) == 0  # fmt: skip
    ids = TokenShards(out, "test").tokens().tolist()
    assert ids == gpt2_encoding(PACKAGED_BPE_FILE).encode_ordinary(ptb.read_text()) + [EOT]
    book = tmp_path / "book.txt"
    book.write_text("".join(f"Paragraph {i}.\n\n" for i in range(40)))
    meta = prepare(f"text:{book}", tmp_path / "book", split="val", progress=False)
    assert meta["splits"]["val"]["n_documents"] == 40
    text = gpt2_encoding().decode(TokenShards(tmp_path / "book", "val").tokens().tolist())
    assert text.split("<|endoftext|>")[:40] == [f"Paragraph {i}." for i in range(40)]


@pytest.mark.parametrize(
    "source, kw, message",
    [("synthetic", {"split": "val"}, "--split applies to a text:PATH or hf:PATH source only"),
     ("ptb", {"split": "val"}, "--split applies to a text:PATH or hf:PATH source only"),
     ("text:{text}", {"split": "dev"}, "unknown split"),
     ("ptb", {"documents": 5}, "--documents applies to the c4 source only"),
     ("c4", {"documents": 0}, "documents must be a positive integer")],
)  # fmt: skip
def test_split_and_documents_are_checked_before_the_folder_is_touched(tmp_path, hub, source, kw, message):
    (tmp_path / "doc.txt").write_text("some text\n")
    out = tmp_path / "d"
    prepare("synthetic", out, tokens=5_000, progress=False)
    with pytest.raises(ValueError, match=message):
        prepare(source.format(text=tmp_path / "doc.txt"), out, progress=False, **kw)
    assert TokenShards(out, "train").n_tokens == 5_000 and hub[0] == []


def test_a_hub_copy_that_needs_a_loading_script_is_one_error_line(tmp_path, monkeypatch, capsys):
    """datasets >= 4 refuses a Hub dataset that still ships a loading script: the user is told to prepare the
    corpus from local files instead of getting a RuntimeError traceback."""

    def refuse(path, name=None, **kw):
        raise RuntimeError(f"Dataset scripts are no longer supported, but found {path.split('/')[-1]}.py")

    monkeypatch.setattr(datasets, "load_dataset", refuse)
    assert cli.main(["data", "prepare", "--source", "ptb", "--out", str(tmp_path / "p"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "ptb_text_only.py" in err and "--source text:PATH --split SPLIT" in err
