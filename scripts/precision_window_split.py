"""CPU estimate for a design that is not in the kernels: the replay's window term sum_j wd_j x_j on tensor
cores, with x in bf16 (exact) and the fp32 weights wd split into bf16 hi + lo, against today's fp32 FMA.
(Session 21 built it, branch s21-tc: correct on the H200 but 9-17% slower on the fp8 step; not landed.)

Random rows of L = 16 entries: x bf16 from N(0, 1), wd with magnitudes over ~4 decades. Errors are
relative to sum_j |x_j wd_j| and measured against fp64; the products of two bf16 values are exact in
fp32, the sums are taken in fp32 in order (the tensor core's own accumulation may differ in its last
bits). Session 20: hi + lo median 8.6e-07, max 7.3e-06; hi alone up to 3.8e-03, above half a bf16 ulp
(2^-9 = 2.0e-03), so a single bf16 weight is not enough.

    python3 scripts/precision_window_split.py
"""

import torch


def main() -> None:
    torch.manual_seed(0)
    rows, L = 200_000, 16
    x = torch.randn(rows, L).bfloat16().float()
    wd = torch.randn(rows, L) * torch.exp(2.0 * torch.randn(rows, L))
    exact = (x.double() * wd.double()).sum(1)
    scale = (x.double() * wd.double()).abs().sum(1)

    def ordered_sum(a, b):
        acc = torch.zeros(rows)
        for j in range(L):
            acc = acc + a[:, j] * b[:, j]
        return acc

    even, odd = torch.zeros(rows), torch.zeros(rows)  # today's loop: two interleaved fp32 accumulators
    for j in range(L):
        if j % 2 == 0:
            even = even + x[:, j] * wd[:, j]
        else:
            odd = odd + x[:, j] * wd[:, j]
    hi = wd.bfloat16().float()
    lo = (wd - hi).bfloat16().float()
    hi_sum = ordered_sum(x, hi)
    forms = {"fp32 FMA (today)": even + odd, "bf16 hi + lo": hi_sum + ordered_sum(x, lo), "bf16 hi only": hi_sum}
    for name, value in forms.items():
        err = (value.double() - exact).abs() / scale
        print(f"{name:17s} error / sum|x wd|: median {err.median():.1e}, 99.9% {err.quantile(0.999):.1e}, "
              f"max {err.max():.1e}")
    print(f"half a bf16 ulp: {2.0 ** -9:.1e}")


if __name__ == "__main__":
    main()
