from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from kinterval.data import (
    SequenceSampler,
    ShardedTokens,
    TokenShards,
    check_tokens,
    count_id,
    data_passes,
    decode_tokens,
    get_block,
    load_batch,
    loader,
    n_blocks,
    prepare,
)

# the tests share module-scoped state: one pytest-xdist worker runs them in order
pytestmark = pytest.mark.xdist_group("data_loader")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("syn")
    prepare("synthetic", out, tokens=30_000, seed=1, shard_tokens=12_000, progress=False)
    return out


def test_n_blocks_formula_and_paper_counts():
    assert n_blocks(1_000_000, 1024) == 976  # FineWebEdu validation in the paper
    assert n_blocks(243 * 1024 + 1, 1024) == 243 and n_blocks(243 * 1024, 1024) == 242
    assert [n_blocks(n, 4) for n in range(0, 11)] == [max(0, (n - 1) // 4) for n in range(0, 11)]
    with pytest.raises(ValueError):
        n_blocks(10, 0)


def test_get_block_is_shifted_non_overlapping_slice():
    data = np.arange(1000, 1000 + 4 * 8 + 1, dtype=np.uint16)
    for k in range(n_blocks(len(data), 8)):
        x, y = get_block(data, k, 8)
        assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (8,)
        assert (
            x.tolist() == data[8 * k : 8 * k + 8].tolist()
            and y.tolist() == data[8 * k + 1 : 8 * k + 9].tolist()
        )
    with pytest.raises(IndexError):
        get_block(data, 4, 8)
    with pytest.raises(IndexError):
        get_block(data[:-1], 3, 8)  # the last block needs its target token


@pytest.mark.parametrize(
    "tokens",
    [
        np.arange(33, dtype=np.float32) + 0.7,  # float ids used to be truncated silently
        np.arange(66, dtype=np.int64).reshape(2, 33),
        list(range(33)),
    ],
    ids=["float", "2-D", "list"],
)
def test_blocks_and_batches_need_a_1d_integer_array(tokens):
    with pytest.raises(ValueError, match="tokens must be a 1-D numpy array of integer token ids, got"):
        get_block(tokens, 0, 8)
    with pytest.raises(ValueError, match="tokens must be a 1-D numpy array of integer token ids, got"):
        load_batch(tokens, np.array([0]), 8)


def test_sampler_permutes_each_epoch_deterministically():
    s = SequenceSampler(n_tokens=1001, T=10, seed=3)
    assert s.n_windows == 100
    e0, e1 = s.offsets(0, 100), s.offsets(100, 100)
    assert e0.dtype == np.int64
    assert sorted(e0.tolist()) == sorted(e1.tolist()) == list(range(0, 1000, 10))
    assert not np.array_equal(e0, e1)
    assert np.array_equal(e0, np.random.default_rng([3, 0]).permutation(100) * 10)
    assert np.array_equal(SequenceSampler(1001, 10, 3).offsets(0, 200), np.concatenate([e0, e1]))
    assert not np.array_equal(SequenceSampler(1001, 10, 4).offsets(0, 100), e0)
    assert (e0 + 10 + 1 <= 1001).all()


def test_data_passes_count_the_samplers_windows():
    """One pass is every window of the sampler once: 100 windows of 10 (+1) tokens in 1001 tokens; a budget
    of 2.5 passes is the sampler's epochs 0, 1 and half of 2."""
    assert data_passes(1000, 1001, 10) == 1.0 and data_passes(2500, 1001, 10) == 2.5
    assert data_passes(1000, 1000, 10) == pytest.approx(1000 / 990)  # 99 windows: the last token is a target
    s = SequenceSampler(n_tokens=1001, T=10, seed=3)
    assert {s.epoch(i) for i in range(int(data_passes(2500, 1001, 10) * s.n_windows))} == {0, 1, 2}
    with pytest.raises(ValueError, match="hold no training window"):
        data_passes(10, 10, 10)


def test_sampler_independent_of_chunking():
    s = SequenceSampler(n_tokens=5000, T=64, seed=0)
    assert np.array_equal(s.offsets(0, 10), np.concatenate([s.offsets(0, 4), s.offsets(4, 6)]))
    whole = SequenceSampler(5000, 64, 0).offsets(50, 300)  # crosses epoch boundaries (78 windows)
    pieces = np.concatenate([s.offsets(50 + i, 7) for i in range(0, 294, 7)] + [s.offsets(344, 6)])
    assert np.array_equal(whole, pieces)
    assert s.offsets(7, 0).shape == (0,)


def test_ranks_shares_reassemble_the_single_process_order():
    """The trainer's per-rank formula: 3 ranks (each its own sampler, as in its own process) of 8 sequences
    per step, concatenated in rank order, give the single-process order of 24 sequences per step, across
    epoch boundaries (78 windows); rank r's share is the r-th contiguous run of 8."""
    from kinterval.train.trainer import rank_offsets

    world, per_rank = 3, 8
    single = SequenceSampler(5000, 64, 0)
    ranks = [SequenceSampler(5000, 64, 0) for _ in range(world)]
    for step in range(6):
        want = single.offsets(step * world * per_rank, world * per_rank)
        shares = [rank_offsets(ranks[r], step, world * per_rank, r, per_rank) for r in range(world)]
        assert np.array_equal(np.concatenate(shares), want), step


def test_load_batch_matches_slices():
    data = np.random.default_rng(0).integers(0, 500, 2000).astype(np.uint16)
    offsets = np.array([0, 17, 2000 - 33])
    x, y = load_batch(data, offsets, 32)
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (3, 32)
    for row, o in enumerate(offsets):
        assert (
            x[row].tolist() == data[o : o + 32].tolist() and y[row].tolist() == data[o + 1 : o + 33].tolist()
        )
    with pytest.raises(ValueError, match="out of range"):
        load_batch(data, np.array([2000 - 32]), 32)


def test_token_shards_memmap_and_concatenation(prepared):
    val = TokenShards(prepared, "val")
    assert isinstance(val.tokens(), np.memmap) and val.tokens().dtype == np.uint16
    train = TokenShards(prepared, "train", verify=True)
    assert len(train.meta["splits"]["train"]["shards"]) == 3
    whole = train.tokens()
    assert whole.shape == (30_000,) and isinstance(whole, ShardedTokens)
    parts = [np.fromfile(prepared / f"train_{k:04d}.bin", dtype="<u2") for k in range(3)]
    assert np.array_equal(whole, np.concatenate(parts))
    assert train.split == "train" and train.vocab_size == 512 and train.eot == 511 and len(train) == 30_000
    train.check_vocab(512)
    sampler = SequenceSampler(train.n_tokens, 128, seed=0)
    x, y = load_batch(whole, sampler.offsets(0, 4), 128)
    assert x.shape == (4, 128) and torch.equal(x[:, 1:], y[:, :-1])
    assert decode_tokens(whole[:3], train.meta).count(" ") == 2


def _trained_on(data: dict) -> dict:
    """A state.json recording ``data`` as the training data (as the trainer's identity does)."""
    return {"step": 1, "identity": {"seed": 0, "data.identity": data}}


def test_check_matches_refuses_data_of_another_tokenizer(prepared):
    """Only data with a vocabulary larger than the model's used to be refused: a GPT-2 BPE model (vocab
    50257) was evaluated on the synthetic corpus (vocab 512) without complaint."""
    val = TokenShards(prepared, "val")
    gpt2 = {"source": "fineweb-edu", "vocab_size": 50257, "split": "train", "n_tokens": 10**9,
            "shards_sha256": ["ab" * 32]}  # fmt: skip
    with pytest.raises(
        ValueError, match=r"meta\.json: vocab_size 512, but .* \(fineweb-edu\) with vocab_size 50257"
    ):
        val.check_matches(_trained_on(gpt2))
    same = {
        "source": "bin:elsewhere",
        "vocab_size": 512,
        "split": "train",
        "n_tokens": 5,
        "shards_sha256": [],
    }
    for other in ({"eot": 7}, {"tokenizer": {"name": "gpt2", "sha256": None}}, {"tokenizer": "gpt2"}):
        with pytest.raises(ValueError, match="but the checkpoint was trained on data"):
            val.check_matches(_trained_on(same | other))  # compared where the state records them


def test_check_matches_accepts_another_corpus_of_the_same_tokenizer(prepared, tmp_path):
    """Source, split, token counts and shard hashes differ between held-out corpora of one tokenizer."""
    other = tmp_path / "other"
    prepare("synthetic", other, tokens=20_000, seed=5, progress=False)
    trained = {"source": "text:elsewhere", "vocab_size": 512, "split": "train", "n_tokens": 123,
               "shards_sha256": ["cd" * 32], "eot": 511,
               "tokenizer": {"name": "synthetic", "sha256": None}}  # fmt: skip
    for split in ("val", "test"):
        TokenShards(other, split).check_matches(_trained_on(trained))
    # states that record no training data (hand-built, or older) are not checked
    val = TokenShards(prepared, "val")
    for state in ({"config": {"operator": {"name": "softmax"}}}, {"identity": None}, {"identity": {}},
                  {"identity": {"data.identity": None}}):  # fmt: skip
        val.check_matches(state)


def test_locate_names_the_shard_of_a_split_position_and_load_batch_uses_it(prepared):
    """A bad id mid-split is named by its shard file and its token there (a split of several shards is one
    array to the sampler)."""
    shards = TokenShards(prepared, "train")
    sizes = [int(s["n_tokens"]) for s in shards.meta["splits"]["train"]["shards"]]
    assert len(sizes) >= 2
    assert shards.locate(0) == f"{shards.paths[0]} (token 0 of that file)"
    assert shards.locate(sizes[0] + 5) == f"{shards.paths[1]} (token 5 of that file)"
    for outside in (sum(sizes), sum(sizes) + 7, -1):
        with pytest.raises(
            ValueError, match=rf"token {outside} is outside the train split of {sum(sizes)} tokens"
        ):
            shards.locate(outside)
    tokens = np.array(shards.tokens())
    tokens[sizes[0] + 5] = 9999  # past the synthetic vocabulary of 512
    with pytest.raises(
        ValueError, match=rf"9999 >= vocab_size 512 at {re.escape(str(shards.paths[1]))} \(token 5 "
    ):
        load_batch(tokens, np.array([0, sizes[0]]), 32, 512, shards.locate)
    with pytest.raises(ValueError, match=rf"at token {sizes[0] + 5:,} of the split"):
        load_batch(tokens, np.array([sizes[0]]), 32, 512)


def test_sharded_tokens_index_as_their_concatenation():
    """A split of several shards is a view over their memmaps, not a copy in memory (2 bytes a token in
    every process: 6 GB for a 3B-token train split): every index form the loaders use gives the ids of the
    concatenation, across shard boundaries too."""
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 60_000, n).astype(np.uint16) for n in (7, 1, 20, 5)]
    whole, view = np.concatenate(parts), ShardedTokens(parts)
    assert len(view) == view.size == 33 and view.shape == (33,) and view.dtype == np.uint16 and view.ndim == 1
    for a, b in [(0, 33), (3, 9), (7, 8), (6, 28), (27, 33), (10, 10), (12, 4), (-5, None), (None, -30)]:
        assert np.array_equal(view[a:b], whole[a:b]), (a, b)
    assert np.array_equal(view[1:30:4], whole[1:30:4]) and np.array_equal(view[::-3], whole[::-3])
    for i in (0, 6, 7, 8, 27, 32, -1, -33):
        got = view[i]
        assert got == whole[i] and isinstance(got, np.uint16), i
    index = rng.integers(-33, 33, (4, 9))
    assert np.array_equal(view[index], whole[index])
    assert int(view.min()) == whole.min() and int(view.max()) == whole.max()
    assert (
        np.min(view) == whole.min() and np.max(view) == whole.max() and np.amax(view, axis=0) == whole.max()
    )
    assert view.max(keepdims=True).tolist() == [whole.max()]
    assert view.tolist() == whole.tolist() and np.array_equal(np.asarray(view, np.int64), whole)
    # numpy functions and operators see the whole split (never an object comparison's silent False)
    assert np.array_equal(view == whole[3], whole == whole[3]) and np.sum(view == whole[3]) >= 1
    assert np.array_equal(view + 1, whole + 1) and np.array_equal(np.cumsum(view), np.cumsum(whole))
    assert np.shares_memory(view[8:20], parts[2])  # inside one shard: that shard's ids, not a copy
    for bad in (33, -34, np.array([0, 33])):
        with pytest.raises(IndexError, match="out of range for 33 tokens"):
            view[bad]
    with pytest.raises(IndexError, match="integers, slices and integer arrays"):
        view[np.array([1.0])]
    check_tokens(view, 60_000)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        check_tokens(view, int(whole.max()))
    offsets = np.array([0, 5, 21])
    x, y = load_batch(view, offsets, 10)
    assert torch.equal(x, load_batch(whole, offsets, 10)[0]) and torch.equal(
        y, load_batch(whole, offsets, 10)[1]
    )
    assert all(torch.equal(a, b) for a, b in zip(get_block(view, 2, 10), get_block(whole, 2, 10)))
    with pytest.raises(ValueError, match="non-empty 1-D arrays of one dtype"):
        ShardedTokens([parts[0], parts[1].astype(np.int32)])


def _rss_anon_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    pytest.skip("no RssAnon in /proc/self/status")


def test_a_split_of_several_shards_is_not_read_into_memory(prepared, tmp_path):
    """Opening and sampling a 3-shard split of 60M tokens (120 MB) holds a few pages of it in the process's
    own memory, not the split (its memmaps' pages are the page cache's, shared between ranks)."""
    if not Path("/proc/self/status").is_file():
        pytest.skip("needs Linux /proc to read the process's anonymous memory")
    big = tmp_path / "big"
    shutil.copytree(prepared, big)
    meta = json.loads((big / "meta.json").read_text())
    split = meta["splits"]["train"]
    for shard in split["shards"]:
        ids = (np.arange(20_000_000, dtype=np.uint32) % 511).astype(np.uint16)
        ids.tofile(big / shard["file"])
        shard.update(n_tokens=ids.size, bytes=ids.nbytes, sha256=None)
    split["n_tokens"] = 60_000_000
    (big / "meta.json").write_text(json.dumps(meta))
    del ids
    before = _rss_anon_kib()
    train = TokenShards(big, "train")
    tokens = train.tokens()
    x, _ = load_batch(tokens, SequenceSampler(len(tokens), 1024, 0).offsets(0, 64), 1024, 512, train.locate)
    grown = _rss_anon_kib() - before
    assert x.shape == (64, 1024) and len(tokens) == 60_000_000
    assert grown < 40_000, f"{grown} KiB more anonymous memory: the split was read into memory"


def test_a_tuple_index_is_one_index_as_on_a_1d_array():
    view, whole = _view([7, 1, 20])
    with pytest.raises(IndexError, match="too many indices"):
        view[(0, 1)]  # not ids 0 and 1 (numpy: too many indices)
    got = view[(9,)]
    assert got == whole[9] and np.shape(got) == () and isinstance(got, np.uint16)
    assert np.array_equal(view[(slice(2, 12),)], whole[2:12])
    got = view[np.array(9)]  # a 0-d integer array: one id, as numpy gives
    assert got == whole[9] and isinstance(got, np.uint16)
    with pytest.raises(IndexError, match="integers, slices and integer arrays"):
        view[True]


def _view(sizes, seed=0):
    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, 512, n).astype(np.uint16) for n in sizes]
    return ShardedTokens(parts), np.concatenate(parts)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.uint64])
def test_every_integer_index_dtype_reads_the_concatenation(dtype):
    """Index arrays of any integer dtype, on a split longer than the dtype holds (an int8 index plus the
    split's length, or a uint64 one minus a shard's start, must not overflow or turn into floats)."""
    view, whole = _view([100, 1, 150, 70_000])
    info = np.iinfo(dtype)
    lo, hi = max(info.min, -len(whole)), min(info.max, len(whole) - 1)
    index = np.random.default_rng(1).integers(lo, hi + 1, (3, 50)).astype(dtype)
    assert np.array_equal(view[index], whole[index])
    assert view[dtype(5)] == whole[dtype(5)]
    if info.max >= len(whole):
        with pytest.raises(IndexError, match="out of range"):
            view[np.array([len(whole)], dtype)]


def test_whole_split_passes_read_in_chunks(monkeypatch):
    """check_tokens and count_id read a split in chunks (a view of several shards is never copied whole):
    an id is found in any chunk, and not past ``stop``."""
    monkeypatch.setattr(loader, "CHUNK_TOKENS", 5)
    view, whole = _view([7, 1, 20, 5])
    for start, stop in [(0, None), (1, 32), (3, 17), (6, 6), (0, 100)]:
        want = int(np.count_nonzero(whole[start:stop] == whole[3]))
        assert (
            count_id(view, int(whole[3]), start, stop) == count_id(whole, int(whole[3]), start, stop) == want
        )
    bad = whole.copy()
    bad[23] = 600
    for tokens in (bad, ShardedTokens([bad[:7], bad[7:8], bad[8:28], bad[28:]])):
        check_tokens(tokens, 512, stop=23)  # the bad id is the 24th
        with pytest.raises(ValueError, match="id 600 is outside the model's vocabulary"):
            check_tokens(tokens, 512, stop=24)
        with pytest.raises(ValueError, match="id 600 is outside"):
            check_tokens(tokens, 512)


def test_sharded_tokens_slices_ending_at_a_shard_boundary_are_views_and_guards_hold():
    """A slice that ends (or starts) at a shard boundary is still a view of that one shard; an integer of
    numpy's types is one id; an empty index array gives no ids; the view refuses to become an array without
    a copy and takes no empty or 2-D part."""
    parts = [np.arange(n, dtype=np.uint16) + 100 * k for k, n in enumerate((7, 1, 20, 5))]
    whole, view = np.concatenate(parts), ShardedTokens(parts)
    for a, b, part in [(0, 7, 0), (3, 7, 0), (7, 8, 1), (8, 28, 2), (10, 28, 2), (28, 33, 3)]:
        got = view[a:b]
        assert np.array_equal(got, whole[a:b]) and np.shares_memory(got, parts[part]), (a, b)
    for i in (np.int64(8), np.uint16(8), np.int32(-1)):
        got = view[i]
        assert got == whole[i] and isinstance(got, np.uint16) and np.ndim(got) == 0, i
    assert view[np.array([], dtype=np.int64)].shape == (0,)
    with pytest.raises(ValueError, match="without a copy"):
        view.__array__(copy=False)  # what numpy 2's np.asarray(view, copy=False) asks (numpy 1 has no copy=)
    if np.lib.NumpyVersion(np.__version__) >= "2.0.0":
        with pytest.raises(ValueError, match="without a copy"):
            np.asarray(view, copy=False)
    for bad in ([], [parts[0], parts[0][:0]], [parts[0], np.zeros((2, 2), np.uint16)]):
        with pytest.raises(ValueError, match="non-empty 1-D arrays of one dtype"):
            ShardedTokens(bad)
