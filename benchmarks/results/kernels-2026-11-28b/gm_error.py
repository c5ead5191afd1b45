"""Error of dw/dM (eq. 1) and of G_M = sum_j gamma_j dw_j/dM in fp32 against float64.

Three forms: the kernel's twelve-operation form ("old"), the seven-operation form of calibration_grad's SHORT
branch ("new") and the rejected six-operation form ("six", u (e^-h + t (1 - e^-h)) - t/K, which cancels). fp32
arithmetic emulated in numpy (fma: exact product in float64, one rounding); the grid (x, r, t, h) is the
kernel's fp32 grid, the truth eq. (1) in float64 on that grid. 20 random rows of T = 1024 scores (normal,
uniform, cubed normal) per (K, span). G_M's error is relative to sum_j |gamma_j dw_j/dM|. Lab notebook:
NOTES.md (this folder)."""

import numpy as np

f32, f64 = np.float32, np.float64
T = 1024
SPANS = (1, 2, 5, 10, 20, 30, 40, 400)


def rn(x):
    return np.asarray(x, f64).astype(f32)


def fma(a, b, c):
    return rn(f64(a) * f64(b) + f64(c))


def forms(s, K):
    """dw/dM of every key of one row (old, new, six, float64 truth) and the row's z."""
    M, m = s.max(), s.min()
    kf, ik = f32(K), rn(1 / K)
    h = rn(f64(M - m) / K)
    ih = rn(1 / f64(h))
    z = rn(s - M)
    x = rn(f64(rn(z - rn(m - M))) / f64(h))  # x = RN(d / h), as the kernels' correction step gives
    x[np.argmax(s)], x[np.argmin(s)] = kf, 0
    r = np.minimum(np.maximum(np.floor(x), 0), kf - 1).astype(f32)
    t = np.clip(rn(x - r), 0, 1).astype(f32)
    E1 = rn(np.exp2(f64(rn(r + (1 - kf))) * f64(rn(f64(h) * np.log2(np.e)))))
    emh = rn(np.exp(-f64(h)))
    dfac = rn((1 - f64(emh)) * f64(ih)) if h >= 0.25 else rn(-np.expm1(-f64(h)) / f64(h))
    cD = rn(E1 * dfac)
    Y = fma(rn(t * E1), fma(-rn(r + 1), ik, 1), rn(rn(rn(1 - t) * rn(E1 * emh)) * fma(-r, ik, 1)))
    old = -fma(cD, rn(x * ik), Y)
    u = fma(-r, ik, 1)
    y = fma(fma(-t, emh, emh), u, rn(t * rn(u - ik)))
    new = rn(-(f64(E1) * f64(fma(rn(dfac * ik), x, y))))
    six = rn(-(f64(E1) * f64(fma(fma(dfac, x, -t), ik, rn(u * fma(t, rn(1 - emh), emh))))))
    E1d = np.exp2((f64(r) + 1 - K) * f64(h) * np.log2(np.e))
    E0d = E1d * np.exp(-f64(h))
    Yd = (1 - f64(t)) * E0d * (1 - f64(r) / K) + f64(t) * E1d * (1 - (f64(r) + 1) / K)
    truth = -Yd - (E1d - E0d) / f64(h) * f64(x) / K
    return old, new, six, truth, z


def main():
    rng = np.random.default_rng(0)
    print("| K | span | G_M error old | new | six | max per-key abs error old | new |")
    print("|---|---|---|---|---|---|---|")
    for K in (3, 4, 16, 32):
        for span in SPANS:
            worst = np.zeros(5)
            for trial in range(20):
                s = [rng.standard_normal(T), rng.uniform(-1, 1, T), rng.standard_normal(T) ** 3][trial % 3]
                s = rn((s - s.min()) / (s.max() - s.min()) * span + rng.normal() * 3)
                old, new, six, truth, z = forms(s, K)
                w = np.exp(f64(z))
                g = rng.standard_normal(T)
                gam = g - (w * g).sum() / w.sum()
                ref, size = (gam * truth).sum(), np.abs(gam * truth).sum()
                errs = [abs((gam * f64(f)).sum() - ref) / size for f in (old, new, six)]
                errs += [np.abs(f64(f) - truth).max() for f in (old, new)]
                worst = np.maximum(worst, errs)
            print(f"| {K} | {span} | " + " | ".join(f"{e:.1e}" for e in worst) + " |")


if __name__ == "__main__":
    main()
