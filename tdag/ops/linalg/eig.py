"""The general (non-symmetric) eigenproblem of real matrices, as LAPACK's geev computes it,
unrolled over the static n: O(n^3) flops per matrix, O(n^2) nodes (the QR steps' rotations),
53,000 at the cap n = MAX_EIG = 12 (eigh's Jacobi has 60,000 at its cap, n = 64). A is
scaled to max |a_ij| = 1 first (as geev's balancing scales), so no square overflows.

1. Householder reduction to upper Hessenberg form, real (gehrd + orghr): n - 2 reflectors,
   each an O(n^2) two-sided update, accumulated into Q.
2. Shifted QR iterations on the Hessenberg matrix in complex arithmetic (zlahqr), deflating
   one eigenvalue per phase on a statically shrinking leading block: phase k works on the
   (k+1) x (k+1) block, then leaves its last sub-diagonal entry (driven to ~0) behind. Each
   iteration is one QR step of (H - mu I) by k Givens rotations on rows, then k on columns
   (RQ + mu I) and on the Schur vectors Z: O(n k) per iteration, O(n^3) in all. mu is
   Wilkinson's shift (the eigenvalue of the trailing 2 x 2 nearer its last entry); a real
   matrix's complex pairs need its complex shift, hence complex arithmetic.
   ``ITERATIONS`` (10) per phase, the sixth of them an exceptional shift (zlahqr's rule,
   mu = h_kk + 0.75 |Re h_k,k-1|) that breaks the cycles Wilkinson's shift stalls in (the
   cyclic permutation: every shift 0, every step the identity). A converged phase stays
   converged under the further steps (their shift is its eigenvalue; the exceptional shift
   is too, once h_k,k-1 ~ 0). Why 10: on 500 random float32 8 x 8 matrices, 6 steps left
   29 eigenvalue sets off by more than 1e-5 of the largest, 8 left one (4e-2), 10 none
   (nor on 200 at n = 12). tests/ops/test_eig_composition.py: eigenvalues within 1e-5 of
   the largest |eigenvalue| of torch's on random, complex-pair, symmetric, triangular,
   diagonal, zero, repeated-eigenvalue (3e-5), graded and cyclic matrices, n = 1 .. 12.
3. Eigenvectors of the triangular Schur factor T (ztrevc), all eigenvalues at once, unrolled
   over rows: x_j = -(T[j, j+1:] x[j+1:]) / (T_jj - lambda), a divisor below
   eps |lambda| replaced by it (trevc's perturbation: repeated eigenvalues give independent
   vectors where they exist, near-parallel ones where the matrix is defective), each column
   rescaled as it grows; back-transformed by Z, each vector normalised to unit 2-norm with its
   largest-magnitude entry real and positive (geev's convention, up to sign: dgeev leaves a
   real eigenvector's sign as it comes).

What the fixed count does not reach: a defective matrix (a Jordan block) has eigenvalues
only to eps^(1/m) for an m-fold one, as in LAPACK, and eigenvectors as ill-conditioned as
its; tight clusters of eigenvalues, and matrices whose Hessenberg QR converges more slowly
than any of those above, may need more than ten steps per phase: the leftover sub-diagonal
is then dropped, an error of its size. The eigenvalues come out in the Schur form's order,
not LAPACK's (torch says the order is implementation defined). An eigenvalue whose
imaginary part is within rounding (16 n eps of max |a_ij|) is made real, and so is its
eigenvector, as geev's real arithmetic gives them; a complex pair closer than that to the
real axis comes out as two equal real values (an error below that bound).
"""
from __future__ import annotations

from tdag.errors import ShapeError
from tdag.ir.symbols import is_static
from tdag.ops import core
from tdag.ops.arrays import argmax, concat, matmul, stack
from tdag.ops.complex import complex as make_complex
from tdag.ops.complex import conj, imag, real, view_as_complex
from tdag.ops.linalg.common import batch_eye, eye, positions
from tdag.ops.linalg.qr import reflector
from tdag.ops.masking import checked_zero
from tdag.ops.tensor import Tensor

MAX_EIG = 12  # 53,000 nodes there (eigh's 64 x 64 Jacobi: 60,000); 87,000 at n = 16
ITERATIONS = 10  # QR steps per deflated eigenvalue
EXCEPTIONAL_STEP = 5  # the step of each phase that takes zlahqr's exceptional shift
EPS = {"f32": 2.0 ** -24, "f64": 2.0 ** -53}
TINY = 2.0 ** -60  # squares to a normal float32; below rounding of a scaled matrix's entries


def eig(a: Tensor) -> tuple[Tensor, Tensor]:
    """(eigenvalues, right eigenvectors as columns) of the real square matrices of a
    (..., n, n), complex, as torch.linalg.eig (order and phase: see the module).

    >>> import tdag, torch
    >>> from tdag import ops
    >>> rotation = lambda a: ops.view_as_real(eig(a)[0])  # the eigenvalues +-i
    >>> p = tdag.trace(rotation, tdag.TensorSpec((2, 2)))
    >>> values = torch.view_as_complex(tdag.run(p, torch.tensor([[0.0, -1.0], [1.0, 0.0]])))
    >>> sorted((round(v.real, 5) + 0.0, round(v.imag, 5)) for v in values.tolist())
    [(0.0, -1.0), (0.0, 1.0)]
    """
    eig_size(a)
    a, scale = _scaled(a)
    h, q = hessenberg(a)
    t, z = schur(h, q)
    real_value = _real(_diagonal(t))
    vectors = normalise(_complex_matmul(z, triangular_vectors(t)))
    all_real = core.eq(core.amin(core.cast(_real(vectors), "i64"), -2), 1)
    real_vector = core.logical_and(real_value, all_real)
    return _values(t, scale, real_value), _made_real(vectors, core.unsqueeze(real_vector, -2))


def eigvals(a: Tensor) -> Tensor:
    """The eigenvalues alone: the Schur form's diagonal, no vectors accumulated."""
    eig_size(a)
    a, scale = _scaled(a)
    h, _ = hessenberg(a)
    t, _ = schur(h, None)
    return _values(t, scale, _real(_diagonal(t)))


def _real(x: Tensor) -> Tensor:
    """Which entries of x (eigenvalues of the scaled matrix, or unit eigenvectors' entries)
    are real: an imaginary part within 16 n eps of 1 is rounding (real eigenvalues of random
    float32 8 x 8 matrices: at most 1.6e-6; complex ones' at least 1.7e-2), where geev's
    real Schur form gives 0. A real eigenvalue's vector is made real only where all its
    entries are: a close pair's vectors are complex however real its values round."""
    n = int(x.shape[-1])
    return core.le(core.abs(imag(x)), 16 * n * EPS[x.dtype.real.value])


def _values(t: Tensor, scale: Tensor, real_value: Tensor) -> Tensor:
    values = _made_real(_diagonal(t), real_value)
    return core.mul(values, core.cast(scale, t.dtype))


def _made_real(x: Tensor, mask: Tensor) -> Tensor:
    """x with its imaginary part 0 where ``mask`` holds: a real eigenvalue's, and its
    eigenvector's (unit norm, largest entry real), as LAPACK returns them."""
    return make_complex(real(x), core.where(mask, 0.0, imag(x)))


def _scaled(a: Tensor) -> tuple[Tensor, Tensor]:
    """(a / s, s (..., 1)), s = max |a_ij| (1 for a zero matrix): no square in the
    rotations overflows or underflows, and TINY is below every entry's rounding. An inf or
    NaN entry raises at run time, as torch.linalg.eig refuses it."""
    if all(int(d) > 0 for d in a.shape if is_static(d)):
        bad = core.cast(core.isnan(core.sub(a, a)), "i64")  # inf - inf is NaN too
        ok = core.eq(core.amax(core.reshape(bad, (-1,)), 0), 0)
        a = core.add(a, core.cast(checked_zero(ok, "linalg_eig_finite"), a.dtype))
    scale = core.amax(core.abs(a), (-2, -1), keepdim=True)
    scale = core.where(core.eq(scale, 0.0), 1.0, scale)
    return core.div(a, scale), core.squeeze(scale, -1)


def eig_size(a: Tensor) -> int:
    """n of a static square (..., n, n) with n <= MAX_EIG: the QR steps unroll over n^2."""
    if a.ndim < 2 or not all(is_static(d) for d in a.shape[-2:]) \
            or a.shape[-2] != a.shape[-1] or int(a.shape[-1]) > MAX_EIG:
        raise ShapeError(f"linalg.eig: needs static square matrices of at most {MAX_EIG} rows "
                         f"and columns (the QR iterations unroll over n^2), got {a.type}")
    return int(a.shape[-1])


# -- 1. Hessenberg -----------------------------------------------------------------------------

def hessenberg(a: Tensor) -> tuple[Tensor, Tensor]:
    """(H, Q) with A = Q H Q^T, H upper Hessenberg: reflector j zeroes column j below j + 1
    (dlarfg's scaling, none where that part is already zero)."""
    n = int(a.shape[-1])
    rows = positions(n, a)
    h, q = a, batch_eye(a, n)
    for j in range(n - 2):
        v, tau = reflector(core.select(h, -1, j), j + 1)
        tv = core.mul(v, core.unsqueeze(tau, -1))
        h = core.sub(h, core.mul(core.unsqueeze(tv, -1), matmul(core.unsqueeze(v, -2), h)))
        h = core.sub(h, core.mul(matmul(h, core.unsqueeze(v, -1)), core.unsqueeze(tv, -2)))
        q = core.sub(q, core.mul(matmul(q, core.unsqueeze(v, -1)), core.unsqueeze(tv, -2)))
    return core.where(core.le(core.unsqueeze(rows, 1), core.add(rows, 1)), h, 0.0), q


# -- 2. the Schur form by shifted QR ---------------------------------------------------------
# Complex matrices here are real tensors of (real, imaginary) pairs, (..., r, c, 2): a Givens
# rotation of two rows is then one real (4 x 4) product of their pairs side by side, where
# complex arithmetic on separate parts would take some thirty nodes per rotation.

def schur(h: Tensor, q: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """(T upper triangular, Z unitary), complex, with Z T Z^H = Q H Q^T (Z starts as Q and
    takes every rotation); Z is None where q is (the eigenvalues alone)."""
    n = int(h.shape[-1])
    t = _as_pairs(h)
    z = None if q is None else _as_pairs(q)
    for k in range(n - 1, 0, -1):
        for step in range(ITERATIONS):
            mu = _shift(t, k, step == EXCEPTIONAL_STEP)
            t, z = _qr_step(t, z, k, mu)
    rows = positions(n, h)
    upper = core.unsqueeze(core.ge(rows, core.unsqueeze(rows, 1)), -1)
    t = view_as_complex(core.where(upper, t, 0.0))
    return t, None if z is None else view_as_complex(z)


def _as_pairs(x: Tensor) -> Tensor:
    """A real x (..., r, c) as complex pairs (..., r, c, 2)."""
    return stack([x, core.mul(x, 0.0)], -1)


def _shift(t: Tensor, k: int, exceptional: bool) -> Tensor:
    """Wilkinson's shift from the trailing 2 x 2 [[a, b], [c, d]] of the active block: the
    eigenvalue d - bc / (delta + sqrt(delta^2 + bc)), delta = (a - d) / 2, the root's sign
    chosen to make the denominator large; zlahqr's exceptional shift d + 0.75 |Re c|. A pair
    (..., 2)."""
    corner = core.slice(core.slice(t, -3, k - 1, k + 1), -2, k - 1, k + 1)
    (a, b), (c, d) = [[core.select(core.select(corner, -3, i), -2, j) for j in (0, 1)]
                      for i in (0, 1)]
    if exceptional:
        real_part = core.abs(core.slice(c, -1, 0, 1))
        return core.add(d, core.mul(real_part, t.builder.const([0.75, 0.0], t.dtype)))
    delta = core.mul(core.sub(a, d), 0.5)
    bc = _cmul(b, c)
    root = _csqrt(core.add(_cmul(delta, delta), bc))
    aligned = core.ge(core.sum(core.mul(delta, root), -1, keepdim=True), 0.0)
    den = core.where(aligned, core.add(delta, root), core.sub(delta, root))
    size = core.sum(core.square(den), -1, keepdim=True)
    zero = core.eq(size, 0.0)
    quotient = core.div(_cmul(bc, _conj(den)), core.where(zero, 1.0, size))
    return core.sub(d, core.where(zero, 0.0, quotient))


def _qr_step(t: Tensor, z: Tensor | None, k: int, mu: Tensor) -> tuple[Tensor, Tensor | None]:
    """One shifted QR step on the leading (k+1) x (k+1) block: (T - mu I) = G^H R by
    rotations of rows 0..k (on all n columns: T's rows right of the block too), then
    R G^H + mu I on columns 0..k; Z takes the same column rotations."""
    n, m = int(t.shape[-2]), k + 1
    diag = t.builder.const([[[float(i == j)] for j in range(n)] for i in range(m)], t.dtype)
    mu_diag = core.mul(diag, core.unsqueeze(core.unsqueeze(mu, -2), -2))
    shifted = core.sub(core.slice(t, -3, 0, m), mu_diag)
    carry, rows, rotations = core.select(shifted, -3, 0), [], []
    for i in range(k):
        both = concat([carry, core.select(shifted, -3, i + 1)], -1)
        rotation = _givens(core.select(both, -2, i))
        out, carry = _rotate(both, rotation)
        rows.append(out)
        rotations.append(_conjugate(rotation))
    block = stack(rows + [carry], -3)
    if z is not None:
        block = concat([block, z], -3)
    block = _rotate_columns(block, rotations)
    t_block = core.add(core.slice(block, -3, 0, m), mu_diag)
    t = concat([t_block, core.slice(t, -3, m)], -3) if m < n else t_block
    return t, None if z is None else core.slice(block, -3, m)


def _givens(u: Tensor) -> Tensor:
    """The rotation G = [[a, b], [-conj(b), conj(a)]], a = conj(x) / r, b = conj(y) / r,
    r = sqrt(|x|^2 + |y|^2), that takes the pair (x, y) to (r, 0), as the real (..., 4, 4)
    matrix that maps two rows' pairs side by side, (x, y) as u = (xr, xi, yr, yi), to
    theirs: G = sum_q (u_q / r) B_q. ``TINY`` added to xr makes it the identity where x and
    y are both 0 (A is scaled to max |a_ij| = 1, so it is far below rounding elsewhere)."""
    u = core.add(u, u.builder.const([TINY, 0.0, 0.0, 0.0], u.dtype))
    u = core.mul(u, core.pow(core.sum(core.square(u), -1, keepdim=True), -0.5))
    basis = u.builder.const(_BASIS, u.dtype)
    return core.sum(core.mul(core.reshape(u, tuple(u.shape) + (1, 1)), basis), -3)


# G's entries as the coefficients u = (xr, xi, yr, yi) / r give them: rows are the inputs
# (carry re, im, below re, im), columns the outputs (new row re, im, new carry re, im)
_G = [[(0, 1), (1, -1), (2, -1), (3, -1)],
      [(1, 1), (0, 1), (3, 1), (2, -1)],
      [(2, 1), (3, -1), (0, 1), (1, 1)],
      [(3, 1), (2, 1), (1, -1), (0, 1)]]
_BASIS = [[[float(sign) if q == index else 0.0 for index, sign in row] for row in _G]
          for q in range(4)]


def _rotate(both: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """G on two complex vectors side by side, (..., r, 4): (a x + b y, c x + d y)."""
    both = matmul(both, g)
    return core.slice(both, -1, 0, 2), core.slice(both, -1, 2, 4)


def _conjugate(g: Tensor) -> Tensor:
    """The columns' rotation: right-multiplying by G^H is G's conjugate on the pairs,
    D G D with D = diag(1, -1, 1, -1)."""
    signs = [1.0, -1.0, 1.0, -1.0]
    return core.mul(g, g.builder.const([[a * b for b in signs] for a in signs], g.dtype))


def _rotate_columns(x: Tensor, rotations: list[Tensor]) -> Tensor:
    """x G_0^H G_1^H ... on x (..., r, n, 2): rotation i mixes columns i and i + 1 (the
    carry is column i as the rotations before it left it)."""
    k = len(rotations)
    carry, columns = core.select(x, -2, 0), []
    for i, g in enumerate(rotations):
        out, carry = _rotate(concat([carry, core.select(x, -2, i + 1)], -1), g)
        columns.append(out)
    rotated = stack(columns + [carry], -2)
    return concat([rotated, core.slice(x, -2, k + 1)], -2) if k + 1 < int(x.shape[-2]) \
        else rotated


def _cmul(p: Tensor, q: Tensor) -> Tensor:
    """The product of pairs (..., 2)."""
    pr, pi, qr, qi = (core.select(v, -1, j) for v in (p, q) for j in (0, 1))
    return stack([core.sub(core.mul(pr, qr), core.mul(pi, qi)),
                  core.add(core.mul(pr, qi), core.mul(pi, qr))], -1)


def _conj(p: Tensor) -> Tensor:
    return core.mul(p, p.builder.const([1.0, -1.0], p.dtype))


def _csqrt(p: Tensor) -> Tensor:
    """The principal root of a pair: the larger part from sqrt((|p| + |Re p|) / 2), the
    other as Im p / (2 that part), so neither cancels."""
    re, im = core.select(p, -1, 0), core.select(p, -1, 1)
    size = core.sqrt(core.add(core.square(re), core.square(im)))
    big = core.sqrt(core.mul(core.add(size, core.abs(re)), 0.5))
    other = core.div(im, core.mul(core.where(core.eq(big, 0.0), 1.0, big), 2.0))
    sign = core.where(core.ge(im, 0.0), 1.0, -1.0)
    positive = core.ge(re, 0.0)
    return stack([core.where(positive, big, core.abs(other)),
                  core.where(positive, other, core.mul(sign, big))], -1)


# -- 3. eigenvectors --------------------------------------------------------------------------

def triangular_vectors(t: Tensor) -> Tensor:
    """X with T X = X diag(T), column k the eigenvector of T_kk: x_k = 1, x_j = 0 below k,
    rows above by back-substitution (ztrevc), each column rescaled to entries <= 1 as it
    grows (the system is homogeneous, so scale is free)."""
    n = int(t.shape[-1])
    values = _diagonal(t)
    rows = positions(n, t)
    strict = core.where(core.gt(rows, core.unsqueeze(rows, 1)), t, 0.0)
    small = core.mul(core.sqrt(_modulus2(values)), EPS[t.dtype.real.value])
    smin = core.maximum(small, EPS[t.dtype.real.value] ** 2)  # trevc's smin, > 0
    x = core.cast(core.broadcast_to(eye(n, values), tuple(t.shape)), t.dtype)
    for j in range(n - 2, -1, -1):
        sums = core.sum(core.mul(core.unsqueeze(core.select(strict, -2, j), -1), x), -2)
        den = core.sub(core.unsqueeze(core.select(core.select(t, -2, j), -1, j), -1), values)
        den = core.where(core.lt(_modulus2(den), core.square(smin)), core.cast(smin, t.dtype),
                         den)
        value = core.where(core.gt(rows, j), core.neg(core.div(sums, den)), 0.0)
        grow = core.maximum(core.sqrt(_modulus2(value)), 1.0)
        one_hot = core.cast(core.unsqueeze(core.eq(rows, j), -1), t.dtype)
        x = core.div(core.add(x, core.mul(one_hot, core.unsqueeze(value, -2))),
                     core.cast(core.unsqueeze(grow, -2), t.dtype))
    return x


def normalise(v: Tensor) -> Tensor:
    """Columns of unit 2-norm, each turned so that its largest-magnitude entry (the first
    of equals) is real and positive: geev's convention."""
    n = int(v.shape[-1])
    power = _modulus2(v)
    norm = core.sqrt(core.sum(power, -2))
    first = core.eq(core.unsqueeze(positions(n, v), -1),
                    core.unsqueeze(argmax(power, -2), -2))
    pick = core.sum(core.where(first, v, 0.0), -2)
    size = core.sqrt(_modulus2(pick))
    phase = core.div(conj(pick), core.cast(core.mul(core.where(core.eq(size, 0.0), 1.0, size),
                                                    core.where(core.eq(norm, 0.0), 1.0,
                                                               norm)), v.dtype))
    return core.mul(v, core.unsqueeze(phase, -2))


# -- complex helpers on the (real, imaginary) parts -----------------------------------------

def _modulus2(x: Tensor) -> Tensor:
    """|x|^2, real."""
    re, im = real(x), imag(x)
    return core.add(core.mul(re, re), core.mul(im, im))


def _diagonal(t: Tensor) -> Tensor:
    n = int(t.shape[-1])
    return core.sum(core.where(core.cast(eye(n, real(t)), "bool"), t, 0.0), -1)


def _complex_matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b from four real products (ONNX has no complex MatMul)."""
    ar, ai, br, bi = real(a), imag(a), real(b), imag(b)
    return make_complex(core.sub(matmul(ar, br), matmul(ai, bi)),
                        core.add(matmul(ar, bi), matmul(ai, br)))
