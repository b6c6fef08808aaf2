"""The README's worked example of the error model, computed: one bfloat16 RMSNorm row.

    python examples/worked_example.py

n = 4096, x ~ N(0, 1), w ~ 1 + 0.1 N(0, 1) (both drawn as float32, rounded to
bfloat16), eps = 1e-6.  Prints the relative part of the bound term by term,
then the element where torch's own eager F.rms_norm (bf16 in, bf16 out) comes
closest to its bound: the exact value, the bound, torch's value and its error,
in ulps and in model units.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from normcert import oracle
from normcert.oracle import assessment, error_model
from normcert.oracle.formats import fmt

N, EPS = 4096, 1e-6


def main() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, N, generator=g).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(N, generator=g)).to(torch.bfloat16)
    args = {"x": x, "weight": w, "eps": EPS}

    uo, uc = fmt(torch.bfloat16).u, fmt(torch.float32).u
    gam = (N + 1) * uc / (1 - (N + 1) * uc)
    terms = {"2 u_o": 2 * uo, "gam(n+1)/2": gam / 2, f"{error_model.FN_ULPS + 2} u_c": (error_model.FN_ULPS + 2) * uc,
             "ORACLE": error_model.ORACLE}
    print("relative part of the bound: " + " + ".join(f"{v:.4g} ({k})" for k, v in terms.items())
          + f" = {sum(terms.values()):.7f}")

    (exact,) = oracle.forward("rms_norm", **args)
    (bound,) = oracle.OPS["rms_norm"].forward_bound(args, (exact,))
    y = F.rms_norm(x, (N,), w, EPS)
    a = assessment.assess("y", y, exact, bound, torch.bfloat16)
    got = y.double().numpy()
    units = abs(got - exact) / bound
    i = int(units.argmax())
    ulp = fmt(torch.bfloat16).ulp(exact[0, i])
    print(f"element {i}: exact {exact[0, i]:.8g}, bound {bound[0, i]:.4g} ({bound[0, i] / ulp:.3g} ulp of bfloat16); "
          f"torch F.rms_norm gives {got[0, i]:.8g}, error {abs(got[0, i] - exact[0, i]):.4g}")
    print(f"over the row: torch's worst error is {a.max_ulps:.3g} ulp = {a.max_units:.3g} of the bound "
          f"({'certified' if a.ok else 'REJECTED'})")


if __name__ == "__main__":
    main()
