from __future__ import annotations

import numpy as np
import pytest

from kinterval.data import synthetic as syn


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
