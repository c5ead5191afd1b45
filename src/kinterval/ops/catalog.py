"""Enumeration of the operator family: every name and mode, for sweeps, tables and tests."""

from __future__ import annotations

from collections.abc import Iterator

from kinterval.ops.spec import BASELINES, RANGE_GRADS, OperatorSpec

FAMILY_FORMS = (
    "lerp-k{K}",
    "fwm-lerp-k{K}",
    "resolved-lerp-k{K}",
    "minmax-weight-k{K}",
    "minmax-prob-k{K}",
    "fwm-weight-k{K}",
    "fwm-prob-k{K}",
    "resolved-weight-k{K}",
    "resolved-prob-k{K}",
)


def all_specs(
    Ks=(4,), range_grads=RANGE_GRADS, arithmetics=("strict", "historical")
) -> Iterator[OperatorSpec]:
    """Baselines once each, then every K-interval form x K x range_grad x (arithmetic for the surrogates)."""
    for name in BASELINES:
        yield OperatorSpec.parse(name)
    for form in FAMILY_FORMS:
        for K in Ks:
            for rg in range_grads:
                for ar in arithmetics if "lerp" not in form else ("strict",):
                    yield OperatorSpec.parse(form.format(K=K), range_grad=rg, arithmetic=ar)
