"""kinterval: pretraining Transformers with K-interval quantized attention."""

__version__ = "0.1.0"

__all__ = [
    "OperatorSpec",
    "__version__",
    "attention_probs",
    "kinterval_attention",
    "load_run",
    "resolve_backend",
]

# Imported on first use (``kinterval.OperatorSpec``, ``from kinterval import load_run``): ``import kinterval``
# alone, as the command line's start does, does not load torch.
_LAZY = {
    "OperatorSpec": "kinterval.ops",
    "attention_probs": "kinterval.ops",
    "kinterval_attention": "kinterval.ops",
    "resolve_backend": "kinterval.ops",
    "load_run": "kinterval.train.load",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kinterval' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
