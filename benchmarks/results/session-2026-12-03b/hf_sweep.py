"""The transformers sweep of the session notes: kinterval-softmax against eager, fp32, q/k weights x10.

Run: python benchmarks/results/session-2026-12-03b/hf_sweep.py (CPU, about 10 s).
"""

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    GptOssConfig,
    T5Config,
    T5ForConditionalGeneration,
    UMT5Config,
    UMT5ForConditionalGeneration,
)

import kinterval.integrations.hf as hf

torch.manual_seed(0)
ids = torch.randint(1, 64, (2, 9))
am = torch.ones(2, 9, dtype=torch.long)
am[1, :3] = 0


def boost(m):
    with torch.no_grad():
        for n, w in m.named_parameters():
            if n.endswith(("q_proj.weight", "k_proj.weight", ".q.weight", ".k.weight")):
                w.mul_(10)


cases = {
    "t5": (
        T5ForConditionalGeneration(
            T5Config(
                vocab_size=64,
                d_model=32,
                d_kv=8,
                d_ff=32,
                num_layers=2,
                num_decoder_layers=2,
                num_heads=4,
                relative_attention_num_buckets=8,
                decoder_start_token_id=0,
                pad_token_id=0,
            )
        ),
        dict(decoder_input_ids=ids[:, :5], attention_mask=am),
    ),
    "umt5": (
        UMT5ForConditionalGeneration(
            UMT5Config(
                vocab_size=64,
                d_model=32,
                d_kv=8,
                d_ff=32,
                num_layers=2,
                num_decoder_layers=2,
                num_heads=4,
                relative_attention_num_buckets=8,
                decoder_start_token_id=0,
                pad_token_id=0,
            )
        ),
        dict(decoder_input_ids=ids[:, :5], attention_mask=am),
    ),
    "gemma2": (
        AutoModelForCausalLM.from_config(
            Gemma2Config(
                vocab_size=64,
                hidden_size=32,
                intermediate_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=8,
                sliding_window=4,
            )
        ),
        dict(attention_mask=am),
    ),
    "gpt-oss": (
        AutoModelForCausalLM.from_config(
            GptOssConfig(
                vocab_size=64,
                hidden_size=32,
                intermediate_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=8,
                num_local_experts=2,
                num_experts_per_tok=1,
                max_position_embeddings=64,
                layer_types=["sliding_attention", "full_attention"],
                sliding_window=4,
            )
        ),
        dict(attention_mask=am),
    ),
}
for name, (m, kw) in cases.items():
    m = m.float().eval()
    boost(m)
    if name == "gpt-oss":
        with torch.no_grad():
            for l in m.model.layers:
                l.self_attn.sinks.normal_(0, 2)
    with torch.no_grad():
        m.set_attn_implementation("eager")
        e = m(ids, **kw).logits
        m.set_attn_implementation("kinterval-softmax")
        with hf.expect_kinterval("kinterval-softmax"):
            g = m(ids, **kw).logits
        keep = am.bool() if g.shape[1] == 9 else torch.ones(g.shape[:2], dtype=torch.bool)
        d = (g - e)[keep].abs().max().item()
        # greedy generation with cache
        m.set_attn_implementation("eager")
        a = m.generate(ids[:1], max_new_tokens=6, do_sample=False)
        m.set_attn_implementation("kinterval-softmax")
        b = m.generate(ids[:1], max_new_tokens=6, do_sample=False)
        print(name, f"max|logit diff| {d:.1e}", "greedy same:", torch.equal(a, b))
