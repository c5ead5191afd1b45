"""The paper's equations in the code: the functions of ``kinterval.ops.formulas`` against their definitions,
and every "eq. (n)" mention of the repository against the map ``formulas.EQUATIONS``."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from kinterval.ops import OperatorSpec, formulas
from kinterval.ops.formulas import EQUATIONS

ROOT = Path(__file__).resolve().parents[2]
PAPER = ROOT / ".." / "shared" / "paper" / "pretraining-quantized-softmax.tex"

# "eq. (3)", "Eq. 5", "eqs. (1)–(4)", "eqs. 1, 2", "equation (2)"
MENTION = re.compile(r"\b(?:[Ee]qs?\.|[Ee]quations?)\s*(\(?\d+\)?(?:\s*(?:[-–,]|and)\s*\(?\d+\)?)*)")
WHERE = re.compile(r"\)?\s+of\s+(§\s*\d+|App\.\s*[A-Z])")
GROUPS = {(1, 2, 3, 4): ("closed form", "closed-form", "closed_form")}  # ranges that name the whole backward
WINDOW = 160  # characters either side searched when the mention's own line names no equation


def _keywords() -> list[tuple[str, int]]:
    return [(kw.lower(), n) for n, eq in EQUATIONS.items() for kw in (eq.label, eq.function, *eq.keywords)]


def check_mentions(text: str) -> list[str]:
    """Problems with the equation mentions in ``text``: a single mention "eq. (n)" must have a keyword of
    equation n as its nearest equation keyword (on its own line, else within WINDOW characters); a range or
    list must be one of GROUPS with a group keyword nearby; "eq. (n) of <section>" must name n's section."""
    low = text.lower()
    keys = [(m.start(), m.end(), n) for kw, n in _keywords() for m in re.finditer(re.escape(kw), low)]
    problems = []
    for mt in MENTION.finditer(text):
        a, b = mt.span()
        where = f"{text[a:b]!r} at char {a} ({text[max(0, a - 50) : b + 50]!r})"
        nums = [int(x) for x in re.findall(r"\d+", mt.group(1))]
        if re.search(r"[-–]", mt.group(1)):
            nums = list(range(nums[0], nums[-1] + 1))
        if any(n not in EQUATIONS for n in nums):
            problems.append(f"{where}: the paper has equations 1-{len(EQUATIONS)} only")
            continue
        if len(nums) > 1:
            group_kw = GROUPS.get(tuple(nums))
            near = low[max(0, a - WINDOW) : b + WINDOW]
            if group_kw is None or not any(k in near for k in group_kw):
                problems.append(f"{where}: a group of equations must be one of {sorted(GROUPS)} named nearby")
            continue
        n = nums[0]
        line_lo, line_hi = text.rfind("\n", 0, a) + 1, text.find("\n", b) % (len(text) + 1)
        in_line = [k for k in keys if k[0] >= line_lo and k[1] <= line_hi]
        near = in_line or [k for k in keys if k[1] >= a - WINDOW and k[0] <= b + WINDOW]
        if not near:
            problems.append(f"{where}: no keyword of any equation nearby (expected one of eq. ({n})'s)")
            continue
        # the nearest keyword; on a tie the one before the mention ("weight_ste (eq. 3), prob_ste")
        nearest = min(near, key=lambda k: (max(a - k[1], k[0] - b, 0), k[0] > a))
        if nearest[2] != n:
            found = text[nearest[0] : nearest[1]]
            problems.append(f"{where}: nearest equation keyword {found!r} belongs to eq. ({nearest[2]})")
        sec = WHERE.match(text, b)
        if sec and re.sub(r"\s+", " ", sec.group(1)) != EQUATIONS[n].where:
            problems.append(f"{where}: eq. ({n}) is in {EQUATIONS[n].where}, not {sec.group(1)}")
    return problems


def _sources() -> dict[str, str]:
    files = [
        *ROOT.glob("src/**/*.py"),
        *ROOT.glob("docs/*.md"),
        ROOT / "README.md",
        *ROOT.glob("tests/ops/*.py"),
    ]
    return {
        str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
        for p in files
        if p.is_file() and p.resolve() != Path(__file__).resolve()
    }


def test_every_equation_mention_in_the_repository_matches_the_paper():
    problems = [f"{name}: {p}" for name, text in _sources().items() for p in check_mentions(text)]
    assert not problems, "\n".join(problems)
    n_mentions = sum(len(MENTION.findall(t)) for t in _sources().values())
    assert n_mentions >= 20  # the scan reads the files that cite the paper


def test_changing_any_one_equation_number_is_caught():
    """Mutate each single mention of the repository to every other number: the checker must object."""
    n_checked = 0
    for name, text in _sources().items():
        for mt in MENTION.finditer(text):
            nums = re.findall(r"\d+", mt.group(1))
            if len(nums) != 1:
                continue
            for wrong in set(EQUATIONS) - {int(nums[0])}:
                digits = mt.start(1) + mt.group(1).index(nums[0])
                mutated = text[:digits] + str(wrong) + text[digits + len(nums[0]) :]
                assert check_mentions(mutated), (name, mt.group(0), wrong)
                n_checked += 1
    assert n_checked >= 80


@pytest.mark.parametrize(
    "text, ok",
    [
        ("Weight-STE, eq. (3): the Jacobian at the hard point", True),
        ("Weight-STE, eq. (1): the Jacobian at the hard point", False),  # the old, swapped number
        ("Prob-STE, eq. (4)", True),
        ("Prob-STE, eq. (2)", False),
        ("the calibration derivatives dw/dM (eq. 1)", True),
        ("the calibration derivatives dw/dM (eq. 3)", False),
        ("score_grad: dL/ds, eq. (2)", True),
        ("the hard Jacobian, eq. (5) of App. B", True),
        ("the hard Jacobian, eq. (5) of §3", False),
        ("the closed form implements eqs. (1)–(4)", True),
        ("the closed form implements eqs. (1)–(5)", False),
        ("eq. (6) of the paper", False),
        ("see eq. (2) somewhere", False),  # no keyword at all
    ],
)
def test_checker_on_known_strings(text, ok):
    assert (check_mentions(text) == []) == ok, check_mentions(text)


def _paper_equations(tex: str) -> list[str]:
    """The labels of the paper's numbered equations, in order (equation: one number; align: one per line)."""
    labels = []
    for env, body in re.findall(r"\\begin\{(equation|align)\}(.*?)\\end\{\1\}", tex, re.S):
        for line in body.split("\\\\") if env == "align" else [body]:
            if "\\nonumber" in line or "\\notag" in line:
                continue
            m = re.search(r"\\label\{([^}]*)\}", line)
            labels.append(m.group(1) if m else "")
    return labels


def test_equation_map_matches_the_paper():
    if not PAPER.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the paper beside the clone ({PAPER})")
        pytest.skip("the paper is not beside the clone (../shared/paper)")
    labels = _paper_equations(PAPER.read_text(encoding="utf-8"))
    assert labels == [EQUATIONS[n].label for n in sorted(EQUATIONS)]
    assert sorted(EQUATIONS) == list(range(1, len(labels) + 1))


def test_docs_table_names_real_functions_and_tests():
    doc = (ROOT / "docs" / "operators.md").read_text(encoding="utf-8")
    rows = [r for r in doc.splitlines() if r.startswith("| ") and "::test_" in r]
    assert len(rows) >= len(EQUATIONS)
    for n, eq in EQUATIONS.items():
        assert any(f"eq. ({n}) `{eq.label}`" in r and f"`{eq.function}`" in r for r in rows), n
    for row in rows:
        func = re.findall(r"`(\w+)`", row.split("|")[2])[0]
        assert callable(getattr(formulas, func, None)), func
        path, test = re.search(r"`(tests/\S+\.py)::(\w+)`", row).groups()
        assert re.search(rf"^def {test}\(", (ROOT / path).read_text(encoding="utf-8"), re.M), (path, test)


# ------------------------------------------------------------------------------- the functions themselves
def _row_grid(calib: str, K: int, s: torch.Tensor, M: torch.Tensor, m: torch.Tensor):
    valid = torch.ones_like(s, dtype=torch.bool)
    return formulas.grid(s, valid, OperatorSpec.parse(f"{calib}-weight-k{K}"), M, m)


@pytest.mark.parametrize("K", (1, 3, 4, 16))
def test_calibration_grad_is_the_derivative_of_lerp_weight(K):
    """Eq. (1): calibration_grad equals autograd's d w^L / dM and d w^L / dm with the scores held fixed."""
    gen = torch.Generator().manual_seed(K)
    s = torch.randn(6, 9, generator=gen, dtype=torch.float64) * 5
    M = s.amax(-1, keepdim=True).requires_grad_()
    m = s.amin(-1, keepdim=True).requires_grad_()
    g = _row_grid("minmax", K, s, M, m)
    wL = formulas.lerp_weight(g)
    dM, dm = formulas.calibration_grad(g, K)
    for j in range(s.shape[-1]):
        aM, am = torch.autograd.grad(wL[:, j].sum(), (M, m), retain_graph=True)
        torch.testing.assert_close(dM[:, j : j + 1], aM, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(dm[:, j : j + 1], am, rtol=1e-12, atol=1e-14)
    # the zero-sum identity of §3: Delta + dw/dM + dw/dm = 0 on every key
    torch.testing.assert_close(formulas.lerp_slope(g) + dM + dm, torch.zeros_like(dM), rtol=0, atol=1e-14)


@pytest.mark.parametrize("arithmetic", ("strict", "historical"))
def test_surrogates_forward_hard_backward_lerp(arithmetic):
    """Eqs. (3), (4): both forwards are P^N; d<g, P>/dw^L is gamma at (P^N, W^N) for Weight-STE and at
    (P^L, W^L) for Prob-STE."""
    gen = torch.Generator().manual_seed(1)
    wL = torch.rand(4, 7, generator=gen, dtype=torch.float64).requires_grad_()
    wN = torch.rand(4, 7, generator=gen, dtype=torch.float64)
    up = torch.randn(4, 7, generator=gen, dtype=torch.float64)
    PN = formulas.normalize(wN)
    for ste, point in ((formulas.weight_ste, wN), (formulas.prob_ste, wL.detach())):
        P = ste(wL, wN, arithmetic)
        if arithmetic == "strict":
            assert torch.equal(P, PN), ste.__name__
        torch.testing.assert_close(P, PN, rtol=1e-14, atol=1e-15)
        (grad,) = torch.autograd.grad((P * up).sum(), wL)
        torch.testing.assert_close(grad, formulas.gamma(up, point), rtol=1e-12, atol=1e-14)


def test_nearest_weight_rounds_to_the_nearest_grid_point():
    """Nearest on a MinMax K = 2 grid over [-4, 0]: z = -3 (a midpoint) rounds up to -2, z = -1.2 to -2."""
    s = torch.tensor([[0.0, -3.0, -4.0, -1.2, -0.9]], dtype=torch.float64)
    g = _row_grid("minmax", 2, s, s.amax(-1, keepdim=True), s.amin(-1, keepdim=True))
    expected = torch.exp(torch.tensor([[0.0, -2.0, -4.0, -2.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(formulas.nearest_weight(g), expected, rtol=1e-15, atol=0)
    # hard_weights (the map of eq. (5)) picks the same index ell = r + [t >= 1/2]
    w, ell = formulas.hard_weights(s[0], 2)
    assert ell.tolist() == [2.0, 1.0, 0.0, 1.0, 2.0]
    torch.testing.assert_close(w, expected[0], rtol=1e-15, atol=0)


def test_historical_arithmetic_is_the_papers_expression_bit_for_bit():
    """App. C.2 (ii): historical Weight-STE normalizes w^H = w^L + (w^N - w^L); historical Prob-STE evaluates
    P^L + (P^H - P^L) with P^H normalized from that w^H; the historical Weight-STE backward evaluates the
    normalization Jacobian at w^H. In float32 these expressions differ from the direct P^N by rounding, so
    each is written out here in the paper's order and compared bit for bit."""
    gen = torch.Generator().manual_seed(8)
    wL = torch.rand(64, 9, generator=gen) * 3
    wN = torch.rand(64, 9, generator=gen) ** 6  # many w^N far below w^L: w^L + (w^N - w^L) != w^N
    wH = wL + (wN - wL)
    PH = wH / wH.sum(-1, keepdim=True)
    PL = wL / wL.sum(-1, keepdim=True)
    PN = wN / wN.sum(-1, keepdim=True)
    assert not torch.equal(wH, wN) and not torch.equal(PH, PN)  # the rows tell the two arithmetics apart
    assert torch.equal(formulas.weight_ste(wL, wN, "historical"), PH)
    assert torch.equal(formulas.prob_ste(wL, wN, "historical"), PL + (PH - PL))
    assert not torch.equal(PL + (PH - PL), PN)
    hist = OperatorSpec.parse("minmax-weight-k4", arithmetic="historical")
    assert torch.equal(formulas.jacobian_point(hist, wL, wN), wH)
    assert torch.equal(formulas.jacobian_point(OperatorSpec.parse("minmax-weight-k4"), wL, wN), wN)
    assert torch.equal(
        formulas.jacobian_point(OperatorSpec.parse("minmax-prob-k4", arithmetic="historical"), wL, wN), wL
    )
