"""kinterval: pretraining Transformers with K-interval quantized attention."""

from kinterval.ops import OperatorSpec, attention_probs, kinterval_attention

__version__ = "0.1.0"

__all__ = ["OperatorSpec", "attention_probs", "kinterval_attention", "__version__"]
