"""Operator names and their parsing: the three design axes of the paper (Table 1) plus the baselines.

An operator is identified by its canonical name (``str(spec)``), e.g. ``lerp-k4``, ``fwm-prob-k16`` or
``softmax``; the overrides ``tau``, ``range_grad`` and ``arithmetic`` are fields of the spec.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import asdict, dataclass

CALIBRATIONS = ("minmax", "fwm", "resolved")
RECONSTRUCTIONS = ("lerp", "nearest")
SURROGATES = ("weight", "prob")  # Weight-STE, Prob-STE (only with Nearest reconstruction)
RANGE_GRADS = ("full", "detach", "max_only", "min_only", "p1")
ARITHMETICS = ("strict", "historical")  # App. C.2 (iii) strict forward vs the historical expressions
BASELINES = ("softmax", "bf16-exp", "fp8-exp")

DEFAULT_TAU = 6.0
MAX_K = 2**24  # r is held in float32: integers are exact up to 2^24
MAX_TAU = 1e3  # nats; beyond, fp32 rounding of the grid -tau + r h reaches 1e-4 of a weight
# tau/K, the grid step, at least 2^-100: a normal float32 (a subnormal step gave NaN gradients), and coarse
# enough that resolved's grid index (z + tau) / h overflows float32 only for z < -2.6e8, whose weight e^z is
# 0 anyway (a step near 2^-126 overflowed it at z = -5 and dropped keys of weight 5e-3)
MIN_STEP = 2.0**-100

VALID_FORMS = (
    "softmax | bf16-exp | fp8-exp | lerp-k{K} | fwm-lerp-k{K} | resolved-lerp-k{K} | "
    "{minmax|fwm|resolved}-{weight|prob}-k{K}   (K an integer in [1, 2^24]; overrides, each at most once: "
    "tau=<float in (0, 1000] with tau/K >= 2^-100> for fwm/resolved, "
    "range_grad in {full, detach, max_only, min_only, p1} for K-interval operators, "
    "arithmetic in {strict, historical} for the weight/prob surrogates)"
)

_LERP_RE = re.compile(r"^(?:(minmax|fwm|resolved)-)?lerp-k(-?[0-9]+)$")  # ASCII digits: int() also reads "４"
_STE_RE = re.compile(r"^(minmax|fwm|resolved)-(weight|prob)-k(-?[0-9]+)$")


@dataclass(frozen=True)
class OperatorSpec:
    """One attention operator of the family.

    ``kind`` is ``"kinterval"`` or one of the baselines; for K-interval operators ``calibration``,
    ``reconstruction``, ``surrogate`` (None for LERP) and ``K`` give the design axes.
    """

    kind: str
    calibration: str | None = None
    reconstruction: str | None = None
    surrogate: str | None = None
    K: int | None = None
    tau: float = DEFAULT_TAU
    range_grad: str = "full"
    arithmetic: str = "strict"

    def __post_init__(self) -> None:  # a spec built directly, not parsed, is checked too: its full_name must
        # parse back (an override that does not apply, e.g. softmax with range_grad=p1, would not)
        self._validate(explicit={"tau", "range_grad", "arithmetic"})

    # ------------------------------------------------------------------ parsing
    @classmethod
    def parse(cls, name: str | OperatorSpec, **overrides) -> OperatorSpec:
        """Parse a name such as ``fwm-prob-k4`` (case-insensitive) with optional overrides, given as keywords
        or in the name (``fwm-prob-k4[tau=5]``, as :attr:`full_name` writes it; a keyword wins)."""
        if isinstance(name, OperatorSpec):
            base = name
        elif isinstance(name, str) and "[" in name:
            base = cls.from_full_name(name)
        else:
            if not isinstance(name, str):
                raise ValueError(
                    f"operator name must be a string, got {type(name).__name__}; valid forms: {VALID_FORMS}"
                )
            base = cls._parse_name(name.strip().lower())
        unknown = set(overrides) - {"tau", "range_grad", "arithmetic"}
        if unknown:
            raise ValueError(f"unknown override(s) {sorted(unknown)}; valid forms: {VALID_FORMS}")
        fields = asdict(base)
        # word overrides are case-insensitive, as in the name ("P1" is the paper's spelling of p1)
        words = {k: v.lower() for k, v in overrides.items() if isinstance(v, str) and k != "tau"}
        fields.update(overrides, **words)
        spec = cls(**fields)
        spec._validate(explicit=set(overrides))
        return spec

    @classmethod
    def _parse_name(cls, name: str) -> OperatorSpec:
        if name in BASELINES:
            return cls(kind=name)
        m = _LERP_RE.match(name)
        if m:
            return cls(
                kind="kinterval", calibration=m.group(1) or "minmax", reconstruction="lerp", K=int(m.group(2))
            )
        m = _STE_RE.match(name)
        if m:
            return cls(
                kind="kinterval",
                calibration=m.group(1),
                reconstruction="nearest",
                surrogate=m.group(2),
                K=int(m.group(3)),
            )
        raise ValueError(f"unknown operator name {name!r}; valid forms: {VALID_FORMS}")

    def _validate(self, explicit: set[str]) -> None:
        def bad(msg: str) -> ValueError:
            return ValueError(f"{msg} (operator {self}); valid forms: {VALID_FORMS}")

        if self.kind not in ("kinterval", *BASELINES):
            raise bad(f"kind must be 'kinterval' or one of {BASELINES}, got {self.kind!r}")
        if self.kind != "kinterval":  # a baseline has no design axes: its name could not give them back
            axes = {n: getattr(self, n) for n in ("calibration", "reconstruction", "surrogate", "K")}
            given = {n: v for n, v in axes.items() if v is not None}
            if given:
                raise bad(f"{self.kind} takes no calibration, reconstruction, surrogate or K, got {given}")
        if self.kind == "kinterval":
            if self.calibration not in CALIBRATIONS or self.reconstruction not in RECONSTRUCTIONS:
                raise bad(
                    f"calibration must be one of {CALIBRATIONS} and reconstruction one of {RECONSTRUCTIONS}, "
                    f"got {self.calibration!r} and {self.reconstruction!r}"
                )
            lerp = self.reconstruction == "lerp"
            if (self.surrogate is not None) if lerp else (self.surrogate not in SURROGATES):
                raise bad(
                    f"surrogate must be None for lerp, one of {SURROGATES} for nearest, "
                    f"got {self.surrogate!r}"
                )
            if isinstance(self.K, bool) or not isinstance(self.K, numbers.Integral):  # numpy ints are fine
                raise bad(f"K must be an integer in [1, {MAX_K}], got {self.K!r}")
            object.__setattr__(self, "K", int(self.K))
        # Overrides that make no sense for this operator are errors when set to a non-default value
        # (whatever the value: checked before the ranges below).
        if "tau" in explicit and self.tau != DEFAULT_TAU and self.calibration not in ("fwm", "resolved"):
            raise bad("tau applies only to fwm and resolved calibration")
        if "range_grad" in explicit and self.range_grad != "full" and self.kind != "kinterval":
            raise bad("range_grad applies only to K-interval operators (baselines keep the max on the tape)")
        if "arithmetic" in explicit and self.arithmetic != "strict" and self.surrogate is None:
            raise bad("arithmetic applies only to the weight/prob surrogates (Nearest reconstruction)")
        if self.range_grad not in RANGE_GRADS:
            raise bad(f"range_grad must be one of {RANGE_GRADS}, got {self.range_grad!r}")
        if self.arithmetic not in ARITHMETICS:
            raise bad(f"arithmetic must be one of {ARITHMETICS}, got {self.arithmetic!r}")
        if isinstance(self.tau, bool) or not isinstance(self.tau, numbers.Real):  # numpy floats are fine
            raise bad(f"tau must be a number, got {self.tau!r}")
        if not math.isfinite(self.tau) or not 0 < self.tau <= MAX_TAU:
            raise bad(f"tau must be a finite number in (0, {MAX_TAU:g}], got {self.tau!r}")
        if self.kind == "kinterval" and (self.K is None or not 1 <= self.K <= MAX_K):
            raise bad(f"K must be an integer in [1, {MAX_K}], got {self.K!r}")
        if self.calibration in ("fwm", "resolved") and self.tau / self.K < MIN_STEP:
            raise bad(
                f"the grid step tau/K must be at least 2^-100 (a finer grid overflows its float32 index), "
                f"got tau={self.tau!r}, K={self.K} (tau/K = {self.tau / self.K:.3g})"
            )
        object.__setattr__(self, "tau", float(self.tau))

    # ------------------------------------------------------------------ naming
    def __str__(self) -> str:
        if self.kind != "kinterval":
            return self.kind
        if self.reconstruction == "lerp":
            prefix = "" if self.calibration == "minmax" else f"{self.calibration}-"
            return f"{prefix}lerp-k{self.K}"
        return f"{self.calibration}-{self.surrogate}-k{self.K}"

    @property
    def name(self) -> str:
        return str(self)

    @property
    def full_name(self) -> str:
        """Canonical name plus every non-default override, e.g. ``fwm-prob-k4[tau=5,range_grad=detach]``."""
        extra = []
        if self.calibration in ("fwm", "resolved") and self.tau != DEFAULT_TAU:
            extra.append(f"tau={_tau_text(self.tau)}")
        if self.range_grad != "full":
            extra.append(f"range_grad={self.range_grad}")
        if self.arithmetic != "strict":
            extra.append(f"arithmetic={self.arithmetic}")
        return f"{self}[{','.join(extra)}]" if extra else str(self)

    @classmethod
    def from_full_name(cls, full: str) -> OperatorSpec:
        """Inverse of :attr:`full_name`."""
        if not isinstance(full, str):
            got = type(full).__name__
            raise ValueError(f"operator name must be a string, got {got}; valid forms: {VALID_FORMS}")
        m = re.fullmatch(r"([^\[\]]+)(?:\[([^\]]*)\])?", full.strip())
        if not m:
            raise ValueError(f"cannot parse operator {full!r}; valid forms: {VALID_FORMS}")
        overrides: dict = {}
        items = [] if m.group(2) is None else m.group(2).lower().split(",")  # case-insensitive, as the name
        if any(not item.strip() for item in items):  # "lerp-k4[]", "lerp-k4[range_grad=detach,]"
            raise ValueError(
                f"operator {full!r}: empty override in [...] (write the name alone, or "
                f"name[key=value,...]); valid forms: {VALID_FORMS}"
            )
        for item in items:
            key, _, value = item.partition("=")
            if key.strip() in overrides:
                raise ValueError(
                    f"operator {full!r}: override {key.strip()!r} given twice; valid forms: {VALID_FORMS}"
                )
            overrides[key.strip()] = value.strip()
        if "tau" in overrides:
            try:
                if "_" in overrides["tau"]:  # Python's float("5_0") is 50: a typo must not be read as a tau
                    raise ValueError
                overrides["tau"] = float(overrides["tau"])
            except ValueError:
                tau = overrides["tau"]
                raise ValueError(
                    f"operator {full!r}: tau must be a number, got {tau!r}; valid forms: {VALID_FORMS}"
                ) from None
        return cls.parse(m.group(1), **overrides)

    def to_dict(self) -> dict:
        return {"name": str(self), "full_name": self.full_name, **asdict(self)}

    @property
    def is_kinterval(self) -> bool:
        return self.kind == "kinterval"


def _tau_text(tau: float) -> str:
    """``tau`` as ``:g`` writes it (``5``, ``6.25``) when that reads back exactly, else the shortest exact
    ``repr`` (``6.000001``): ``:g`` keeps 6 digits, and a full name must give back the operator it names."""
    short = f"{tau:g}"
    return short if float(short) == tau else repr(tau)


def as_spec(spec: OperatorSpec | str) -> OperatorSpec:
    """An :class:`OperatorSpec` as given, or parsed from its full name (overrides included)."""
    if isinstance(spec, OperatorSpec):
        return spec
    if isinstance(spec, str):
        return OperatorSpec.from_full_name(spec)
    raise ValueError(f"spec must be an OperatorSpec or an operator name, got {type(spec).__name__}")
