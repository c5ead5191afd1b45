"""kinterval: pretraining Transformers with K-interval quantized attention."""

from kinterval.ops import OperatorSpec, attention_probs, kinterval_attention, resolve_backend

__version__ = "0.1.0"

__all__ = [
    "OperatorSpec",
    "__version__",
    "attention_probs",
    "kinterval_attention",
    "load_run",
    "resolve_backend",
]


def __getattr__(name: str):
    if name == "load_run":  # imported on first use: it pulls in the model and training layers
        from kinterval.train.load import load_run

        return load_run
    raise AttributeError(f"module 'kinterval' has no attribute {name!r}")
