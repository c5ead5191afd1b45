from __future__ import annotations

import numpy as np
import pytest

from kinterval.data import synthetic as syn

# the tests share module-scoped state: one pytest-xdist worker runs them in order
pytestmark = pytest.mark.xdist_group("data_synthetic")


@pytest.fixture(scope="module")
def docs() -> list[list[int]]:
    ids = syn.generate(200_000, seed=3).tolist()
    out, cur = [], []
    for t in ids:
        cur.append(t)
        if t == syn.EOT:
            out.append(cur)
            cur = []
    return out  # complete documents only (the cut-short tail is dropped)


def test_deterministic_from_seed():
    a = syn.generate(30_000, seed=7)
    assert a.dtype == np.uint16 and len(a) == 30_000
    assert a.tobytes() == syn.generate(30_000, seed=7).tobytes()
    assert a.tobytes() != syn.generate(30_000, seed=8).tobytes()
    assert a.tobytes() != syn.generate(30_000, seed=7, stream=1).tobytes()
    # A shorter run is a prefix of a longer one with the same seed.
    assert np.array_equal(syn.generate(12_345, seed=7), a[:12_345])


def test_vocab_bounded_and_all_parts_present():
    a = syn.generate(100_000, seed=0)
    assert int(a.max()) < syn.VOCAB_SIZE and syn.EOT == syn.VOCAB_SIZE - 1
    counts = np.bincount(a, minlength=syn.VOCAB_SIZE)
    for name, tok in syn.LAYOUT["markers"].items():
        assert counts[tok] > 0, name
    for lo, hi in (syn.LAYOUT[k] for k in ("openers", "closers", "keys", "values", "triggers")):
        assert counts[lo : hi + 1].sum() > 0
    # Filler is Zipf-like: the most frequent word is far more common than the median word.
    words = counts[syn.WORD0 : syn.EOT]
    assert words[0] > 20 * np.median(words)


def test_document_lengths(docs):
    lengths = [len(d) for d in docs]
    assert len(docs) > 300
    assert 200 <= np.median(lengths) <= 700 and min(lengths) > 200


def test_key_value_queries_return_stored_values(docs):
    n_queries, near = 0, 0
    for doc in docs:
        store, pos = {}, {}
        for i, t in enumerate(doc):
            if t == syn.KV_OPEN:
                j = i + 1
                store = {}
                while doc[j] != syn.KV_CLOSE:
                    store[doc[j]] = doc[j + 1]
                    pos[doc[j]] = j
                    j += 2
                assert all(syn.KEY0 <= k < syn.VAL0 for k in store)
            elif t == syn.QUERY:
                key, value = doc[i + 1], doc[i + 2]
                assert store[key] == value
                n_queries += 1
                near += i - pos[key] < 128
    assert n_queries > 500
    assert near / n_queries > 0.95  # retrieval fits a T=128 context


def test_brackets_balanced_and_matching(docs):
    depth_max, closers = 0, 0
    for doc in docs:
        stack = []
        for t in doc:
            if syn.OPEN0 <= t < syn.CLOSE0:
                stack.append(t - syn.OPEN0)
                depth_max = max(depth_max, len(stack))
            elif syn.CLOSE0 <= t < syn.KEY0:
                assert stack and stack.pop() == t - syn.CLOSE0
                closers += 1
        assert not stack
    assert closers > 1000 and 4 <= depth_max <= syn.MAX_DEPTH


def test_copied_spans_recur(docs):
    n = 0
    for doc in docs:
        starts = [i for i, t in enumerate(doc) if t == syn.COPY_OPEN]
        for s in starts:
            end = doc.index(syn.COPY_CLOSE, s)
            again = doc.index(syn.COPY_AGAIN, end)
            span = doc[s + 1 : end]
            assert 6 <= len(span) <= 16
            assert doc[again + 1 : again + 1 + len(span)] == span
            assert doc[again + 1 + len(span)] == syn.COPY_CLOSE
            assert again - s < 128
            n += 1
    assert n > 300


def test_trigger_bigrams_are_fixed_within_a_document(docs):
    repeats = 0
    successors_across_docs = set()
    for doc in docs:
        seen = {}
        for i, t in enumerate(doc[:-1]):
            if syn.TRIG0 <= t < syn.WORD0:
                assert seen.setdefault(t, doc[i + 1]) == doc[i + 1]
                repeats += 1
        successors_across_docs |= set(seen.items())
    assert repeats > 2000
    assert len(successors_across_docs) > 100  # pairs change between documents: only in-context lookup works


@pytest.mark.parametrize("n", [0, 1, 499, 500_000])
def test_generate_gives_exactly_n_tokens_of_whole_documents(n):
    ids = syn.generate(n, seed=1)
    assert ids.dtype == np.uint16 and ids.shape == (n,)
    # every document but the cut-short last one is complete: the stream joins whole documents
    docs = syn.documents(1)
    joined = np.concatenate([next(docs) for _ in range(n // 200 + 1)])
    assert np.array_equal(ids, joined[:n])


def test_describe_names_tokens():
    text = syn.describe(
        [syn.KV_OPEN, syn.KEY0 + 3, syn.VAL0 + 5, syn.KV_CLOSE, syn.OPEN0, syn.CLOSE0, syn.EOT]
    )
    assert text == "KV_OPEN k3 v5 KV_CLOSE ( ) EOT"


def test_every_documented_range_is_reached(docs):
    """docs/data.md's ranges are the ones drawn, ends included: copy spans of 6-16 words, 3-8 keys per
    list, 2-n queries, every stored key queryable (the last one too), four trigger bigrams per document, and
    every key, value and trigger id in use. The other tests check only that nothing falls outside a range,
    which a generator that never draws an end (or a quarter of the triggers) passes."""
    spans, lists, asked, triggers = set(), [], set(), []
    for doc in docs:
        triggers.append({t for t in doc if syn.TRIG0 <= t < syn.WORD0})
        for i, t in enumerate(doc):
            if t == syn.COPY_OPEN:
                spans.add(doc.index(syn.COPY_CLOSE, i) - i - 1)
            elif t == syn.KV_OPEN:
                keys = doc[i + 1 : doc.index(syn.KV_CLOSE, i) : 2]
                lists.append([keys, 0])
            elif t == syn.QUERY:
                keys = lists[-1][0]
                lists[-1][1] += 1
                asked.add((len(keys), keys.index(doc[i + 1])))
    assert spans == set(range(6, 17))
    assert {len(keys) for keys, _ in lists} == set(range(3, 9))
    assert all(2 <= q <= len(keys) for keys, q in lists)
    assert min(q for _, q in lists) == 2 and any(q == len(keys) for keys, q in lists)
    assert asked == {(n, j) for n in range(3, 9) for j in range(n)}
    assert max(map(len, triggers)) == 4 and sum(len(t) == 4 for t in triggers) > len(docs) / 2
    counts = np.bincount(np.concatenate([np.asarray(d) for d in docs]), minlength=syn.VOCAB_SIZE)
    assert (counts[syn.KEY0 : syn.WORD0] > 0).all()  # keys, values and triggers
    # ~5 % of filler positions become a trigger (filler is about half of the tokens): ~2.5 % of all tokens
    assert 0.015 < counts[syn.TRIG0 : syn.WORD0].sum() / counts.sum() < 0.04


def test_streams_of_neighbouring_seeds_are_different_corpora():
    """The val and test splits are the streams (seed, 1) and (seed, 2) (docs/data.md): they must not be the
    train stream of another seed (a stream seeded with seed + stream would make seed 0's val split seed 1's
    train split)."""
    first = {
        (seed, stream): next(syn.documents(seed, stream))[:64].tolist()
        for seed in (0, 1)
        for stream in (0, 1)
    }
    assert len({tuple(d) for d in first.values()}) == 4


def test_layout_is_the_documented_one_and_describe_names_each_range():
    """The token layout stored in meta.json (module docstring, docs/data.md): markers 1-6, openers 8-13,
    closers 14-19, keys 20-83, values 84-147, triggers 148-179, words 180-510, EOT 511; ``describe`` names
    each range by its prefix."""
    assert syn.LAYOUT["markers"] == {"KV_OPEN": 1, "KV_CLOSE": 2, "QUERY": 3, "COPY_OPEN": 4, "COPY_CLOSE": 5,
                                     "COPY_AGAIN": 6}  # fmt: skip
    ranges = {k: syn.LAYOUT[k] for k in ("openers", "closers", "keys", "values", "triggers", "words")}
    assert ranges == {"openers": [8, 13], "closers": [14, 19], "keys": [20, 83], "values": [84, 147],
                      "triggers": [148, 179], "words": [180, 510]}  # fmt: skip
    assert syn.LAYOUT["eot"] == syn.EOT == 511
    ids = [20, 83, 84, 147, 148, 179, 180, 510, 13, 19]
    assert syn.describe(ids) == "k0 k63 v0 v63 t0 t31 w0 w330 ‹ ›"
