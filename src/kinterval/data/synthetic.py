"""The embedded default corpus: procedurally generated token ids, deterministic from a seed, no download.

Every document (a few hundred tokens, ended by ``EOT``) mixes filler with three kinds of segment that only
attention can solve, each with its retrieval distance mostly well inside a 128-token context:

* copy / induction: ``COPY_OPEN span COPY_CLOSE filler COPY_AGAIN span COPY_CLOSE`` (a uniformly random
  span that recurs), and per-document trigger bigrams: trigger ``A`` is always followed by the same token
  ``B`` inside one document, so every ``A`` after the first predicts ``B`` only by looking back;
* key-value recall: ``KV_OPEN k1 v1 ... kn vn KV_CLOSE filler (QUERY k v filler)*`` where each queried ``v``
  equals the value stored for ``k`` (distinct keys per list, values random);
* nested dependencies: balanced brackets of six types nested up to depth 8 around filler words; a closer must
  match the opener at the current depth.

Filler words follow a Zipf-like unigram law over the content range. Token layout (``LAYOUT``, stored in
meta.json): markers 0-7, openers 8-13, closers 14-19, keys 20-83, values 84-147, triggers 148-179,
content words 180-510, ``EOT`` = 511.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

VOCAB_SIZE = 512
EOT = VOCAB_SIZE - 1
KV_OPEN, KV_CLOSE, QUERY, COPY_OPEN, COPY_CLOSE, COPY_AGAIN = 1, 2, 3, 4, 5, 6
N_BRACKETS = 6
OPEN0, CLOSE0 = 8, 14  # opener i = OPEN0 + i, its closer = CLOSE0 + i
KEY0, N_KEYS = 20, 64
VAL0, N_VALS = 84, 64
TRIG0, N_TRIGS = 148, 32
WORD0, N_WORDS = 180, EOT - 180
MAX_DEPTH = 8
TRIGGER_RATE = 0.05  # share of filler positions that become a trigger bigram
LAYOUT = {
    "markers": {"KV_OPEN": KV_OPEN, "KV_CLOSE": KV_CLOSE, "QUERY": QUERY, "COPY_OPEN": COPY_OPEN,
                "COPY_CLOSE": COPY_CLOSE, "COPY_AGAIN": COPY_AGAIN},
    "openers": [OPEN0, OPEN0 + N_BRACKETS - 1], "closers": [CLOSE0, CLOSE0 + N_BRACKETS - 1],
    "keys": [KEY0, KEY0 + N_KEYS - 1], "values": [VAL0, VAL0 + N_VALS - 1],
    "triggers": [TRIG0, TRIG0 + N_TRIGS - 1], "words": [WORD0, WORD0 + N_WORDS - 1], "eot": EOT,
}  # fmt: skip

_ZIPF = 1.0 / (np.arange(N_WORDS) + 2.7) ** 1.1
_ZIPF /= _ZIPF.sum()


class _Generator:
    """Builds documents from one seeded stream.

    Randomness is drawn from numpy in large pools (uniforms, Zipf words) and consumed from Python lists:
    segments are short, so this is much faster than many small numpy calls.
    """

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self._u: list[float] = []
        self._w: list[int] = []
        self._ui = self._wi = 0

    def u(self) -> float:
        if self._ui == len(self._u):
            self._u, self._ui = self.rng.random(1 << 16).tolist(), 0
        self._ui += 1
        return self._u[self._ui - 1]

    def randint(self, lo: int, hi: int) -> int:
        """Uniform integer in [lo, hi] (min() guards the float rounding of u * n up to n)."""
        return lo + min(int(self.u() * (hi - lo + 1)), hi - lo)

    def distinct(self, lo: int, count: int, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:  # n << count, so rejections are rare
            x = lo + self.randint(0, count - 1)
            if x not in out:
                out.append(x)
        return out

    def words(self, n: int) -> list[int]:
        if self._wi + n > len(self._w):
            self._w, self._wi = (WORD0 + self.rng.choice(N_WORDS, size=1 << 16, p=_ZIPF)).tolist(), 0
        self._wi += n
        return self._w[self._wi - n : self._wi]

    def filler(self, lo: int, hi: int) -> list[int]:
        """Zipf words, some replaced by one of this document's trigger bigrams ``A B``."""
        out: list[int] = []
        for w in self.words(self.randint(lo, hi)):
            if self.u() < TRIGGER_RATE:
                j = self.randint(0, len(self.trig_a) - 1)
                out += (self.trig_a[j], self.trig_b[j])
            else:
                out.append(w)
        return out

    def copy(self) -> list[int]:
        span = [WORD0 + self.randint(0, N_WORDS - 1) for _ in range(self.randint(6, 16))]
        return [COPY_OPEN, *span, COPY_CLOSE, *self.filler(4, 48), COPY_AGAIN, *span, COPY_CLOSE]

    def kv(self) -> list[int]:
        n = self.randint(3, 8)
        keys = self.distinct(KEY0, N_KEYS, n)
        vals = [VAL0 + self.randint(0, N_VALS - 1) for _ in range(n)]
        out = [KV_OPEN]
        for k, v in zip(keys, vals):
            out += (k, v)
        out += [KV_CLOSE, *self.filler(2, 32)]
        for _ in range(self.randint(2, n)):
            j = self.randint(0, n - 1)
            out += [QUERY, keys[j], vals[j], *self.filler(0, 8)]
        return out

    def brackets(self) -> list[int]:
        out: list[int] = []
        stack: list[int] = []
        for _ in range(self.randint(16, 48)):
            move = self.u()
            if not stack or (move < 0.4 and len(stack) < MAX_DEPTH):
                stack.append(self.randint(0, N_BRACKETS - 1))
                out.append(OPEN0 + stack[-1])
            elif move < 0.7:
                out += self.words(1)
            else:
                out.append(CLOSE0 + stack.pop())
        return out + [CLOSE0 + kind for kind in reversed(stack)]

    def document(self) -> np.ndarray:
        # Per-document trigger bigrams: 4 distinct triggers, each with a fixed random successor word.
        self.trig_a = self.distinct(TRIG0, N_TRIGS, 4)
        self.trig_b = [WORD0 + self.randint(0, N_WORDS - 1) for _ in range(4)]
        target = self.randint(200, 499)
        segments = (self.copy, self.kv, self.brackets)
        out: list[int] = []
        while len(out) < target:
            out += self.filler(4, 24)
            out += segments[self.randint(0, 2)]()
        out.append(EOT)
        return np.array(out, dtype=np.uint16)


def documents(seed: int, stream: int = 0) -> Iterator[np.ndarray]:
    """Endless documents (uint16, each ending with EOT) of the stream ``(seed, stream)``."""
    gen = _Generator(np.random.default_rng([seed, stream]))
    while True:
        yield gen.document()


def generate(n_tokens: int, seed: int, stream: int = 0) -> np.ndarray:
    """Exactly ``n_tokens`` ids (last document cut short); a prefix of any longer run with the same seed."""
    parts, total = [], 0
    for doc in documents(seed, stream):
        if total >= n_tokens:
            break
        parts.append(doc)
        total += len(doc)
    return np.concatenate(parts)[:n_tokens] if parts else np.zeros(0, dtype=np.uint16)


def describe(ids) -> str:
    """Readable rendering of synthetic ids (marker names, brackets, k/v/t/w prefixes)."""
    names = {v: k for k, v in LAYOUT["markers"].items()} | {EOT: "EOT"}
    out = []
    for t in np.asarray(ids).tolist():
        if t in names:
            out.append(names[t])
        elif OPEN0 <= t < CLOSE0:
            out.append("([{<«‹"[t - OPEN0])
        elif CLOSE0 <= t < KEY0:
            out.append(")]}>»›"[t - CLOSE0])
        else:
            ranges = (("w", WORD0), ("t", TRIG0), ("v", VAL0), ("k", KEY0), ("?", 0))
            prefix, base = next((p, b) for p, b in ranges if t >= b)
            out.append(f"{prefix}{t - base}")
    return " ".join(out)
