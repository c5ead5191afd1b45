"""The scores the validation log and the geometry probe read: ``s = q k^T / sqrt(D)`` under the causal mask,
and the row span ``M - m`` over each row's valid keys; checked against a direct computation."""

import math

import torch

from kinterval.model import GPT, preset
from kinterval.model.scores import attention_scores, row_span


def test_scores_mask_and_row_span_by_hand():
    torch.manual_seed(0)
    model = GPT(preset("tiny", vocab_size=97, block_size=8, n_embd=32, n_head=2))
    attn = model.transformer.h[0].attn
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        q, k, v, s, valid = attention_scores(attn, x)
        qkv = x @ attn.c_attn.weight.T + attn.c_attn.bias  # the projection, written out
    D = 16
    heads = [qkv[..., i * 32 : (i + 1) * 32].view(2, 8, 2, D).transpose(1, 2) for i in range(3)]
    for got, want in zip((q, k, v), heads):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    hq, hk, S = heads[0].tolist(), heads[1].tolist(), s.tolist()
    for b in range(2):
        for h in range(2):
            for i in range(8):
                for j in range(8):
                    assert bool(valid[b, h, i, j]) == (j <= i)  # causal: a query sees itself and the past
                    dot = sum(hq[b][h][i][d] * hk[b][h][j][d] for d in range(D))
                    assert abs(S[b][h][i][j] - dot / math.sqrt(D)) < 1e-5
    span = row_span(s, valid)
    for b, h, i in ((0, 0, 0), (0, 1, 3), (1, 0, 7), (1, 1, 5)):
        row = S[b][h][i][: i + 1]
        assert abs(float(span[b, h, i]) - (max(row) - min(row))) < 1e-6
    assert torch.all(span[..., 0] == 0)  # one key: no spread
