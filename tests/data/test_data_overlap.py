"""``kinterval data overlap``: n-gram overlap of one split with another, checked against a direct
set-of-tuples implementation, on planted copies, across chunk boundaries and document ends, and through the
CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kinterval.cli import main
from kinterval.data.overlap import ngram_overlap, window_hashes

EOT = 9


def direct(tokens, against, n, eot):
    """The definition, with Python sets of windows (no hashing, no chunks)."""
    tokens, against = list(map(int, tokens)), list(map(int, against))

    def windows(x):
        return {tuple(x[i : i + n]) for i in range(len(x) - n + 1) if eot not in x[i : i + n]}

    ref = windows(against)
    starts = [i for i in range(len(tokens) - n + 1) if eot not in tokens[i : i + n]]
    found = [i for i in starts if tuple(tokens[i : i + n]) in ref]
    covered = {j for i in found for j in range(i, i + n)}
    docs, doc, share = [], [], []
    for j, t in enumerate(tokens):
        if t == eot:
            docs.append(doc)
            doc = []
        else:
            doc.append(j)
    docs.append(doc)
    share = [sum(j in covered for j in d) / len(d) for d in docs if d]
    return len(starts), len(found), len([j for j in covered if tokens[j] != eot]), share


@pytest.mark.parametrize("n", [1, 3, 5])
@pytest.mark.parametrize("chunk", [7, 40, 1 << 20])
def test_overlap_is_the_set_definition(n, chunk):
    rng = np.random.default_rng([n, chunk])
    for _ in range(5):
        against = rng.integers(0, 10, 300)  # ids 0..9, 9 is the end-of-text token: short documents
        tokens = rng.integers(0, 10, 120)
        tokens[50:70] = against[200:220]  # a planted copy
        if chunk < n:
            continue
        o = ngram_overlap(tokens, against, n=n, eot=EOT, chunk=chunk)
        windows, found, covered, share = direct(tokens, against, n, EOT)
        assert (o.windows, o.found, o.covered) == (windows, found, covered)
        assert o.tokens == int((tokens != EOT).sum())
        assert o.doc_coverage == pytest.approx(share)


def test_a_planted_copy_is_found_and_nothing_else():
    rng = np.random.default_rng(0)
    against = rng.integers(0, 50_000, 10_000).astype(np.uint16)
    tokens = rng.integers(0, 50_000, 2_000).astype(np.uint16)
    tokens[500:540] = against[7_000:7_040]  # 40 tokens: 9 windows of 32
    o = ngram_overlap(tokens, against, n=32, eot=50_256, chunk=4_096)  # the copy sits across a chunk seam
    assert (o.found, o.covered, o.windows) == (9, 40, 2_000 - 31)
    assert o.token_share == pytest.approx(40 / 2_000) and o.doc_coverage == pytest.approx([0.02])


def test_windows_never_span_a_document_end():
    """The same 8 tokens in both splits, but across a document end in each: no window of 8 holds them."""
    against = np.array([1, 2, 3, 4, EOT, 5, 6, 7, 8, 0, 0, 0])
    tokens = np.array([1, 2, 3, 4, EOT, 5, 6, 7, 8])
    assert ngram_overlap(tokens, against, n=8, eot=EOT).found == 0
    assert ngram_overlap(tokens, against, n=4, eot=EOT).found == 2  # each half, inside its document
    assert ngram_overlap(tokens, against, n=9, eot=None).found == 1  # without an end-of-text token: one text


def test_degenerate_inputs():
    assert ngram_overlap(np.arange(5), np.arange(3), n=4).found == 0  # against shorter than a window
    assert ngram_overlap(np.arange(3), np.arange(30), n=4).windows == 0
    h, valid = window_hashes(np.arange(10), 3, None)
    assert h.dtype == np.uint64 and h.size == 8 and valid.all() and np.unique(h).size == 8
    with pytest.raises(ValueError, match="positive window length"):
        window_hashes(np.arange(10), 0, None)
    with pytest.raises(ValueError, match="chunk"):
        ngram_overlap(np.arange(10), np.arange(10), n=8, chunk=4)


def test_cli_prints_the_shares_and_writes_json(tmp_path, capsys):
    from kinterval.data.prepare import prepare

    prepare("synthetic", tmp_path / "syn", tokens=30_000, seed=0, progress=False)
    code = main(["data", "overlap", str(tmp_path / "syn"), "--n", "8", "--json", str(tmp_path / "o.json")])
    out = capsys.readouterr().out
    assert code == 0 and "8-gram overlap of" in out and "also in train:" in out
    record = json.loads((tmp_path / "o.json").read_text())
    assert record["split"] == "val" and record["against"] == "train" and record["n"] == 8
    assert (
        main(
            [
                "data",
                "overlap",
                str(tmp_path / "syn"),
                "--split",
                "validation",
                "--json",
                str(tmp_path / "v.json"),
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "v.json").read_text())["split"] == "val"  # the split's name in the folder
    capsys.readouterr()
    assert len(record["doc_coverage"]) == record["documents"] > 0
    assert f"({record['window_share']:.1%})" in out and f"({record['token_share']:.1%})" in out

    # a folder of another tokenizer cannot be compared by token ids
    other = tmp_path / "other"
    prepare("synthetic", other, tokens=30_000, seed=1, progress=False)
    meta = json.loads((other / "meta.json").read_text())
    meta["tokenizer"]["name"] = "another"
    (other / "meta.json").write_text(json.dumps(meta))
    assert main(["data", "overlap", str(tmp_path / "syn"), "--against-data", str(other)]) == 2
    assert "different tokenizers" in capsys.readouterr().err
    assert main(["data", "overlap", str(tmp_path / "syn"), "--n", "0"]) == 2
    assert main(["data", "overlap", str(tmp_path / "syn"), "--split", "nope"]) == 2
    assert "unknown split 'nope'" in capsys.readouterr().err


def test_a_json_target_that_cannot_be_written_is_refused_before_the_work(tmp_path, capsys):
    """A folder or a path in a missing folder as --json: one line, before anything is computed or printed."""
    from kinterval.data.prepare import prepare

    prepare("synthetic", tmp_path / "syn", tokens=30_000, seed=0, progress=False)
    for target, says in ((tmp_path, "is a directory"), (tmp_path / "no" / "o.json", "does not exist")):
        assert main(["data", "overlap", str(tmp_path / "syn"), "--json", str(target)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and says in err


def test_a_block_size_longer_than_the_split_is_refused(tmp_path, capsys):
    """A split with no block of T+1 tokens wrote a coverage file of no block (which the report then refused
    as malformed): one line now, nothing written."""
    from kinterval.data.prepare import prepare

    prepare("synthetic", tmp_path / "syn", tokens=30_000, seed=0, progress=False)
    path = tmp_path / "o.json"
    argv = ["data", "overlap", str(tmp_path / "syn"), "--block-size", "8193", "--json", str(path)]
    assert main(argv) == 2  # val: 8,193 tokens, so 8,192 targets
    assert "holds no evaluation block of 8193+1 tokens" in capsys.readouterr().err and not path.exists()
    assert main([*argv[:3], "--block-size", "8192", "--json", str(path)]) == 0
    assert len(json.loads(path.read_text())["block_coverage"]) == 1


def test_shares_document_counts_and_block_coverage_of_a_small_split():
    """An ``against`` of exactly one window is searched; the token share leaves end-of-text tokens out; a
    document covered exactly half is not "over half", an uncovered one is not touched; block ``k`` of T
    covers the targets kT+1 .. kT+T."""
    tokens = np.array([1, 2, 3, 4, EOT, 5, 6, EOT, 1, 2])  # documents [1 2 3 4], [5 6], [1 2]
    o = ngram_overlap(tokens, np.array([1, 2]), n=2, eot=EOT)
    assert (o.windows, o.found, o.tokens, o.covered) == (5, 2, 8, 4)
    assert o.token_share == 0.5 and o.window_share == pytest.approx(2 / 5)
    d = o.to_dict()
    assert (d["documents"], d["documents_touched"], d["documents_over_half"]) == (3, 2, 1)
    assert d["doc_coverage"] == [0.5, 0.0, 1.0]
    # covered positions 0, 1, 8, 9; blocks of 3 score targets 1-3, 4-6, 7-9
    assert o.block_coverage(3) == pytest.approx([1 / 3, 0, 2 / 3])


def test_split_overlap_reads_the_named_splits_and_records_the_checked_shards(tmp_path):
    """A folder's val against its train: the result of the two token arrays, with val's shard hashes; a
    folder whose tokenizer file differs only by sha256 is another tokenizer."""
    import shutil

    from kinterval.data.loader import TokenShards
    from kinterval.data.overlap import split_overlap
    from kinterval.data.prepare import prepare

    prepare("synthetic", tmp_path / "syn", tokens=30_000, seed=0, progress=False)
    val, train = TokenShards(tmp_path / "syn", "val"), TokenShards(tmp_path / "syn", "train")
    o = split_overlap(tmp_path / "syn", n=4)
    want = ngram_overlap(val.tokens(), train.tokens(), n=4, eot=val.eot)
    assert (o.found, o.covered, o.against_tokens) == (want.found, want.covered, train.n_tokens)
    assert o.found > 0 and o.against_tokens != val.n_tokens
    shards = val.meta["splits"]["val"]["shards"]
    assert o.shards_sha256 == tuple(s["sha256"] for s in shards) and all(o.shards_sha256)
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "syn", other)
    meta = json.loads((other / "meta.json").read_text())
    meta["tokenizer"]["sha256"] = "0" * 64
    (other / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="different tokenizers"):
        split_overlap(tmp_path / "syn", against_data=other, n=4)
    # a shard whose bytes no longer match meta.json: refused, as every evaluation refuses it (the result
    # recorded meta.json's hash beside coverage computed from the other bytes)
    for split in ("val", "train"):
        bad = tmp_path / f"bad_{split}"
        shutil.copytree(tmp_path / "syn", bad)
        shard = bad / json.loads((bad / "meta.json").read_text())["splits"][split]["shards"][0]["file"]
        ids = np.fromfile(shard, dtype=np.uint16)
        ids[:50] = ids[100:150]
        ids.tofile(shard)
        with pytest.raises(ValueError, match="sha256 does not match meta.json"):
            split_overlap(bad, n=4)
