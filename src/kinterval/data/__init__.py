"""kinterval.data: tokenization, corpus preparation (uint16 shards + meta.json) and loading."""

from kinterval.data.import_bin import import_bin
from kinterval.data.loader import (
    SequenceSampler,
    ShardedTokens,
    TokenShards,
    check_tokens,
    count_id,
    data_passes,
    decode_tokens,
    get_block,
    load_batch,
    n_blocks,
    read_meta,
)
from kinterval.data.prepare import prepare, summary_table
from kinterval.data.tokenizer import EOT, GPT2_VOCAB, gpt2_encoding, tokenizer_hash

__all__ = [
    "EOT",
    "GPT2_VOCAB",
    "SequenceSampler",
    "ShardedTokens",
    "TokenShards",
    "check_tokens",
    "count_id",
    "data_passes",
    "decode_tokens",
    "get_block",
    "gpt2_encoding",
    "import_bin",
    "load_batch",
    "n_blocks",
    "prepare",
    "read_meta",
    "summary_table",
    "tokenizer_hash",
]
