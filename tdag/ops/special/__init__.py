"""torch.special's functions as compositions over tdag.ops, evaluating the series torch's
ATen/native/Math.h evaluates (Cephes' tables, copied in ``tables``): Bessel functions
(bessel), the gamma family and Hurwitz zeta (gamma), the normal distribution's tails (normal),
orthogonal polynomials by their recurrences (polynomials)."""
