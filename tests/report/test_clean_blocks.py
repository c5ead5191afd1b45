"""``kinterval report --clean-blocks FILE``: endpoint ΔNLL on the validation blocks that share no n-gram with
the training split, and on the others, from a ``kinterval data overlap --block-size T --json`` file; planted
per-block effects that differ between the two kinds of block."""

from __future__ import annotations

import json

import numpy as np
import pytest
from synthetic_results import write_results

from kinterval.cli import main
from kinterval.report.build import build_report

N_BLOCKS = 96
SHARDS = ("ab" * 32,)
COVER = np.where(np.arange(N_BLOCKS) % 4 == 0, 0.5, 0.0)  # every fourth block is covered
COVER[1] = 0.01  # a block with one covered target in a hundred is covered too


def effect(r, frac):
    """On clean blocks +0.02 (lerp-k4: +0.05); on covered blocks 0.1 more, only for lerp-k4."""
    base = 0.05 if r["operator"] == "lerp-k4" else 0.02
    extra = 0.1 if r["operator"] == "lerp-k4" else 0.0
    return 0.0 if r["operator"] == "softmax" else (base + extra * (COVER > 0)) * frac


def coverage_file(path, cover=COVER, shards=SHARDS, block_size=64):
    record = {"n": 13, "block_size": block_size, "shards_sha256": list(shards), "block_coverage": list(cover)}
    path.write_text(json.dumps(record))
    return path


@pytest.fixture
def folder(tmp_path):
    write_results(tmp_path / "ci", "ci", effect, n_blocks=N_BLOCKS, noise=0.002, shards=SHARDS)
    return tmp_path / "ci"


def test_clean_and_covered_blocks_recover_their_planted_effects(folder, tmp_path):
    build_report(folder, tmp_path / "rep", clean_blocks=[coverage_file(tmp_path / "cover.json")])
    rows = {
        r["key"]["operator"]: r
        for r in json.loads((tmp_path / "rep" / "report.json").read_text())["clean_blocks"]
    }
    n_covered = int((COVER > 0).sum())
    lerp, mm = rows["lerp-k4"], rows["minmax-weight-k4"]
    assert (lerp["n_clean"], lerp["n_covered"], lerp["n"], lerp["seeds"]) == (
        N_BLOCKS - n_covered,
        n_covered,
        13,
        [7, 42],
    )
    assert lerp["clean"]["mean"] == pytest.approx(0.05, abs=2e-3)
    assert lerp["covered"]["mean"] == pytest.approx(0.15, abs=2e-3)
    assert lerp["all"]["mean"] == pytest.approx(0.05 + 0.1 * n_covered / N_BLOCKS, abs=2e-3)
    assert mm["clean"]["mean"] == pytest.approx(0.02, abs=2e-3) == mm["covered"]["mean"]
    index = (tmp_path / "rep" / "index.md").read_text()
    assert "### Endpoint ΔNLL vs same-seed softmax on the validation blocks with no target" in index
    assert (tmp_path / "rep" / "clean_blocks.md").is_file() and (
        tmp_path / "rep" / "clean_blocks.tex"
    ).is_file()


def test_without_a_file_there_is_no_table(folder, tmp_path):
    build_report(folder, tmp_path / "rep")
    assert "clean_blocks" not in json.loads((tmp_path / "rep" / "report.json").read_text())
    assert not (tmp_path / "rep" / "clean_blocks.md").exists()


def test_a_file_of_another_split_or_a_malformed_one_is_refused(folder, tmp_path, capsys):
    other = coverage_file(tmp_path / "other.json", shards=("cd" * 32,))
    assert main(["report", str(folder), "--out", str(tmp_path / "rep"), "--clean-blocks", str(other)]) == 2
    assert (
        "no evaluation of that split (96 blocks of 64 tokens, shards cdcdcdcdcdcd)" in capsys.readouterr().err
    )
    short = coverage_file(tmp_path / "short.json", cover=COVER[:10])  # another block count
    assert main(["report", str(folder), "--out", str(tmp_path / "rep"), "--clean-blocks", str(short)]) == 2
    for bad in (
        '{"n": 13}',
        "[1, 2]",
        "not json",
        '{"n": 13, "block_size": 64, "shards_sha256": [], "block_coverage": [2.0]}',
    ):
        (tmp_path / "bad.json").write_text(bad)
        assert (
            main(
                [
                    "report",
                    str(folder),
                    "--out",
                    str(tmp_path / "rep"),
                    "--clean-blocks",
                    str(tmp_path / "bad.json"),
                ]
            )
            == 2
        )
        assert "bad.json: not a" in capsys.readouterr().err
    assert not (tmp_path / "rep").exists()  # refused before anything is written
    ok = coverage_file(tmp_path / "cover.json")
    assert main(["report", str(folder), "--out", str(tmp_path / "rep"), "--clean-blocks", str(ok)]) == 0


def test_the_overlap_command_writes_what_the_report_reads(tmp_path, capsys):
    """``kinterval data overlap --block-size T --json``: each block's share of covered targets (positions
    kT+1..kT+T, those `kinterval eval` scores) and the split's shard hashes, as an evaluation records them."""
    from kinterval.data.loader import TokenShards, n_blocks
    from kinterval.data.overlap import split_overlap
    from kinterval.data.prepare import prepare
    from kinterval.report.analysis import read_coverage

    prepare("synthetic", tmp_path / "syn", tokens=30_000, seed=0, progress=False)
    path = tmp_path / "o.json"
    assert (
        main(
            ["data", "overlap", str(tmp_path / "syn"), "--n", "6", "--block-size", "32", "--json", str(path)]
        )
        == 0
    )
    assert "blocks of 32 tokens (as `kinterval eval` scores them) with no target" in capsys.readouterr().out
    cov = read_coverage(path)
    val = TokenShards(tmp_path / "syn", "val")
    assert cov["shards_sha256"] == tuple(s["sha256"] for s in val.meta["splits"]["val"]["shards"])
    assert cov["block_coverage"].size == n_blocks(val.n_tokens, 32)
    token = split_overlap(tmp_path / "syn", n=6).token_covered
    want = [token[k * 32 + 1 : k * 32 + 33].mean() for k in range(n_blocks(val.n_tokens, 32))]
    assert cov["block_coverage"] == pytest.approx(want, abs=1e-6)
    assert 0 < (cov["block_coverage"] > 0).sum() < cov["block_coverage"].size  # some clean blocks, some not
    assert main(["data", "overlap", str(tmp_path / "syn"), "--block-size", "0"]) == 2


@pytest.mark.parametrize(
    "change",
    [
        {"block_coverage": ["x"] + [0.0] * (N_BLOCKS - 1)},  # a string numpy cannot read: was a traceback
        {"block_coverage": ["0.5"] + [0.0] * (N_BLOCKS - 1)},  # a numeric string: was read as a number
        {"block_coverage": [[0.1], [0.2, 0.3]]},  # ragged lists: was a numpy traceback
        {"block_coverage": {"a": 1}},
        {"block_coverage": [True] + [False] * (N_BLOCKS - 1)},
        {"n": "abc"},
        {"n": None},
        {"n": 13.7},  # was silently shown as 13
        {"n": -4},  # was shown as a -4-gram
        {"block_size": "64"},
        {"shards_sha256": None},  # was a TypeError traceback
        {"shards_sha256": 5},
        {"shards_sha256": SHARDS[0]},  # a string, not a list: was split into characters
    ],
)
def test_a_coverage_file_of_wrong_types_is_one_line_error(folder, tmp_path, capsys, change):
    record = {"n": 13, "block_size": 64, "shards_sha256": list(SHARDS), "block_coverage": list(COVER)}
    (tmp_path / "bad.json").write_text(json.dumps({**record, **change}))
    bad = str(tmp_path / "bad.json")
    assert main(["report", str(folder), "--out", str(tmp_path / "rep"), "--clean-blocks", bad]) == 2
    assert "bad.json: not a block coverage file" in capsys.readouterr().err
    assert not (tmp_path / "rep").exists()


def test_two_files_of_one_split_and_n_are_refused(folder, tmp_path, capsys):
    """The same file twice (or a copy) gave every condition two rows the table could not tell apart."""
    one = coverage_file(tmp_path / "one.json")
    two = coverage_file(tmp_path / "two.json")
    for files in ((one, one), (one, two)):
        argv = ["report", str(folder), "--out", str(tmp_path / "rep")]
        assert main([*argv, *(x for f in files for x in ("--clean-blocks", str(f)))]) == 2
        assert "both give the 13-gram coverage of one split at block size 64" in capsys.readouterr().err
    assert not (tmp_path / "rep").exists()
    other_n = tmp_path / "n8.json"
    other_n.write_text(json.dumps({**json.loads(one.read_text()), "n": 8}))
    build_report(folder, tmp_path / "rep", clean_blocks=[one, other_n])  # another n: its own rows
    rows = json.loads((tmp_path / "rep" / "report.json").read_text())["clean_blocks"]
    assert sorted({r["n"] for r in rows}) == [8, 13]


def test_an_evaluation_capped_with_max_blocks_takes_the_coverage_of_its_first_blocks(tmp_path):
    """The same shards and block size give the same blocks, and `eval --max-blocks N` reads the first N: the
    file of the whole split applies to them (it was refused as 'no evaluation of that split')."""
    n = N_BLOCKS // 2
    cover = COVER[:n]

    def capped(r, frac):
        base = 0.05 if r["operator"] == "lerp-k4" else 0.02
        extra = 0.1 if r["operator"] == "lerp-k4" else 0.0
        return 0.0 if r["operator"] == "softmax" else (base + extra * (cover > 0)) * frac

    write_results(tmp_path / "ci", "ci", capped, n_blocks=n, noise=0.002, shards=SHARDS)
    build_report(tmp_path / "ci", tmp_path / "rep", clean_blocks=[coverage_file(tmp_path / "cover.json")])
    rows = json.loads((tmp_path / "rep" / "report.json").read_text())["clean_blocks"]
    lerp = next(r for r in rows if r["key"]["operator"] == "lerp-k4")
    assert (lerp["n_clean"], lerp["n_covered"]) == (n - int((cover > 0).sum()), int((cover > 0).sum()))
    assert lerp["clean"]["mean"] == pytest.approx(0.05, abs=2e-3)
    assert lerp["covered"]["mean"] == pytest.approx(0.15, abs=2e-3)


def test_one_clean_block_gives_no_clean_estimate_and_the_covered_ones_are_exact():
    """In memory: 16 blocks of which one is clean (fewer than two: no clean estimate, not a one-block
    interval); the covered estimate pools the seeds' mean ΔNLL over the 15 covered blocks."""
    from kinterval.report import analysis as A
    from kinterval.report.results import Point

    n = 16
    cover = np.full(n, 0.3)
    cover[5] = 0.0
    rng = np.random.default_rng(18)
    pts, d = [], {}
    for seed in (7, 42):
        base, d[seed] = rng.normal(4.0, 0.2, n), rng.normal(0.05, 0.01, n)
        for op, nll in (("softmax", base), ("lerp-k4", base + d[seed])):
            where = ("d", "val", 64, n)
            pts.append(
                Point("s", f"{op}-s{seed}", "g", op, seed, 1000, 10, 1000, "val", where, nll, shards=SHARDS)
            )
    cov = {"n": 13, "block_size": 64, "shards_sha256": SHARDS, "block_coverage": cover, "path": "c.json"}
    (row,) = A.clean_blocks(pts, [cov])
    assert (row.key.operator, row.seeds, row.n_clean, row.n_covered) == ("lerp-k4", (7, 42), 1, 15)
    assert row.clean is None
    assert row.covered.per_seed == pytest.approx(tuple(np.delete(d[s], 5).mean() for s in (7, 42)), rel=1e-9)
    assert row.all.per_seed == pytest.approx(tuple(d[s].mean() for s in (7, 42)), rel=1e-9)
