"""FpSan's payload algebra, in numpy (docs/SANITIZER.md, "FpSan emulation"; Triton's implementation, 3.8+).

Every floating-point value is mapped by a bijection `embed` to an integer "payload" of
the same width, and arithmetic is replaced by ring arithmetic on payloads modulo 2^w.
Two kernels that compute the same symbolic function (whatever their tiling, summation
order or loop structure) then produce bitwise identical outputs, because ring addition
and multiplication are exactly associative and commutative. Kernels that differ in what
they compute almost surely produce different bits.

Decisions for what the algebra leaves open (documented in docs/SANITIZER.md as well):
  * comparisons (<, <=, ==, ...) compare payloads as signed integers: the same order that
    min/max use, so `where(a > b, a, b)` equals `maximum(a, b)`. The sign of a payload is
    the sign of the real value (embed keeps the sign bit), so tests against zero are
    faithful; comparisons between two non-zero values are not.
  * abs is the signed integer absolute value of the payload: embed(-x) = -embed(x), so
    this is exactly embed(|x|).
  * -inf is an ordinary payload: exp2(-inf - m) is not zero. Masked probabilities must be
    zeroed with an explicit select (`tl.where(mask, p, 0)`), which Triton's `tl.expect_zero`
    becomes under FpSan; a kernel that relies on exp2(-inf) == 0 alone is reported as not
    structurally equivalent (not as failing).
  * integer <-> float conversions are homomorphic: an integer i becomes the payload i
    (sign-extended or truncated to the float's width) and a payload becomes the integer
    of the same bits. So embed(1.0) = 1 and casts commute with ring arithmetic.
  * log, log2, sqrt, rsqrt, erf, floor, ceil, sin, cos, tanh become op-specific
    invertible tags; frem has no model (a kernel using it gets FpSan "skipped").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Dict

import numpy as np

_UINT: Dict[int, Any] = {16: np.uint16, 32: np.uint32, 64: np.uint64}
_INT = {16: np.int16, 32: np.int32, 64: np.int64}


class FpSanUnsupported(Exception):
    """An operation FpSan has no model for; the FpSan check is then skipped with this reason."""


@dataclass(frozen=True)
class Format:
    """A floating-point format's FpSan constants."""

    name: str
    w: int
    one: int  # bit pattern of 1.0
    S: int
    mag: int
    shift: int
    A: int
    A_inv: int
    om: int
    B_pos: int
    B_neg: int
    B_pos_inv: int
    B_neg_inv: int


def _inverse(x: int, w: int) -> int:
    """Inverse of odd x modulo 2^w."""
    assert x & 1, "only odd numbers are invertible modulo 2^w"
    return pow(x, -1, 1 << w)


@lru_cache(maxsize=None)
def fmt(name: str) -> Format:
    one = {"fp16": 0x3C00, "bf16": 0x3F80, "fp32": 0x3F800000, "fp64": 0x3FF0000000000000}[name]
    w = {"fp16": 16, "bf16": 16, "fp32": 32, "fp64": 64}[name]
    S = 1 << (w - 1)
    mag = S - 1
    shift = (one & -one).bit_length() - 1
    A = 922291 & mag
    om = (one * A) & mag
    om ^= om >> shift
    B_pos = _inverse(om, w) & mag
    B_neg = (B_pos * mag) & mag
    return Format(
        name,
        w,
        one,
        S,
        mag,
        shift,
        A,
        _inverse(A, w - 1),
        om,
        B_pos,
        B_neg,
        _inverse(B_pos, w - 1),
        _inverse(B_neg, w - 1),
    )


def embed(bits: np.ndarray, f: Format) -> np.ndarray:
    """IEEE bit patterns (unsigned ints of width w) -> payloads (unsigned ints of width w)."""
    U = _UINT[f.w]
    u = np.asarray(bits, dtype=U)
    with np.errstate(over="ignore"):
        s = u & U(f.S)
        x = u ^ s
        y = (x * U(f.A)) & U(f.mag)
        z = y ^ (y >> U(f.shift))
        b = np.where(s != 0, U(f.B_neg), U(f.B_pos)).astype(U)
        return ((z * b) & U(f.mag)) ^ s


def unembed(payload: np.ndarray, f: Format) -> np.ndarray:
    """The exact inverse of embed."""
    U = _UINT[f.w]
    v = np.asarray(payload, dtype=U)
    with np.errstate(over="ignore"):
        s = v & U(f.S)
        t = v ^ s
        binv = np.where(s != 0, U(f.B_neg_inv), U(f.B_pos_inv)).astype(U)
        y = (t * binv) & U(f.mag)
        k = f.shift
        while k < f.w:
            y = y ^ (y >> U(k))
            k *= 2
        x = (y * U(f.A_inv)) & U(f.mag)
        return x ^ s


def float_bits(values, name: str) -> np.ndarray:
    """Bit patterns of Python/numpy floats in format `name` (for constants and tests)."""
    a = np.asarray(values)
    if name == "fp16":
        return a.astype(np.float16).view(np.uint16)
    if name == "fp32":
        return a.astype(np.float32).view(np.uint32)
    if name == "fp64":
        return a.astype(np.float64).view(np.uint64)
    if name == "bf16":
        f32 = a.astype(np.float32).view(np.uint32)
        # round to nearest even, as torch does
        rounded = f32 + np.uint32(0x7FFF) + ((f32 >> np.uint32(16)) & np.uint32(1))
        return (rounded >> np.uint32(16)).astype(np.uint16)
    raise ValueError(name)


def payload_of(value: float, name: str) -> int:
    f = fmt(name)
    return int(embed(float_bits(np.array([value]), name), f)[0])


# -- ring operations on payloads (unsigned ints of width w, wrapping) --------------------


def signed(p: np.ndarray, w: int) -> np.ndarray:
    return np.asarray(p, dtype=_UINT[w]).view(_INT[w])


def add(a, b, w):
    with np.errstate(over="ignore"):
        return (np.asarray(a, _UINT[w]) + np.asarray(b, _UINT[w])).astype(_UINT[w])


def sub(a, b, w):
    with np.errstate(over="ignore"):
        return (np.asarray(a, _UINT[w]) - np.asarray(b, _UINT[w])).astype(_UINT[w])


def mul(a, b, w):
    with np.errstate(over="ignore"):
        return (np.asarray(a, _UINT[w]) * np.asarray(b, _UINT[w])).astype(_UINT[w])


def neg(a, w):
    with np.errstate(over="ignore"):
        return (_UINT[w](0) - np.asarray(a, _UINT[w])).astype(_UINT[w])


def modinv(y, w):
    """Inverse of odd y modulo 2^w, elementwise (Newton's iteration doubles the correct bits)."""
    U = _UINT[w]
    y = np.asarray(y, U)
    with np.errstate(over="ignore"):
        x = y.copy()  # correct to 3 bits for odd y
        for _ in range(6):  # 3 -> 6 -> 12 -> 24 -> 48 -> 96 bits
            x = (x * (U(2) - y * x)).astype(U)
    return x


def div(a, b, w):
    """a / b = a * inv(b): inv is the inverse of (b | 1) with its low bit replaced by b's parity."""
    U = _UINT[w]
    b = np.asarray(b, U)
    inv = modinv(b | U(1), w)
    inv = (inv & ~U(1)) | (b & U(1))
    return mul(a, inv, w)


def smax(a, b, w):
    return np.where(signed(a, w) >= signed(b, w), np.asarray(a, _UINT[w]), np.asarray(b, _UINT[w])).astype(_UINT[w])


def smin(a, b, w):
    return np.where(signed(a, w) <= signed(b, w), np.asarray(a, _UINT[w]), np.asarray(b, _UINT[w])).astype(_UINT[w])


def sabs(a, w):
    s = signed(a, w)
    return np.where(s < 0, neg(a, w), np.asarray(a, _UINT[w])).astype(_UINT[w])


EXP2_BASE = 0xA343836D
LOG2E = 1.4426950408889634


def exp2(x, w):
    """C^x mod 2^w, elementwise, by square-and-multiply over the bits of x (unsigned)."""
    U = _UINT[w]
    x = np.asarray(x, U)
    result = np.ones_like(x)
    base = U(EXP2_BASE & ((1 << w) - 1))
    power = np.full_like(x, base)
    with np.errstate(over="ignore"):
        for bit in range(w):
            on = ((x >> U(bit)) & U(1)).astype(bool)
            result = np.where(on, (result * power).astype(U), result)
            power = (power * power).astype(U)
    return result


def exp(x, f: Format):
    """exp(x) = exp2(x * P), P the payload of log2(e) in x's format."""
    return exp2(mul(x, payload_of(LOG2E, f.name), f.w), f.w)


_TAG_SALT = {
    "log": 0x9E3779B97F4A7C15,
    "log2": 0xC2B2AE3D27D4EB4F,
    "sqrt": 0x165667B19E3779F9,
    "rsqrt": 0xD6E8FEB86659FD93,
    "erf": 0xFF51AFD7ED558CCD,
    "floor": 0xC4CEB9FE1A85EC53,
    "ceil": 0x94D049BB133111EB,
    "sin": 0xBF58476D1CE4E5B9,
    "cos": 0x2545F4914F6CDD1D,
    "tanh": 0x27D4EB2F165667C5,
    "exp2_fallback": 0x61C8864680B583EB,
}


def tag(x, op: str, w: int):
    """An op-specific invertible map: (x xor K1) * K2 with K2 odd."""
    salt = _TAG_SALT[op]
    U = _UINT[w]
    mask = (1 << w) - 1
    k1 = U(salt & mask)
    k2 = U(((salt >> 17) | 1) & mask)
    with np.errstate(over="ignore"):
        return ((np.asarray(x, U) ^ k1) * k2).astype(U)


def sext(p, w_from: int, w_to: int):
    """Widening cast: sign-extend the payload. Narrowing: truncate."""
    s = signed(p, w_from)
    if w_to >= w_from:
        return s.astype(_INT[w_to]).view(_UINT[w_to])
    return np.asarray(p, _UINT[w_from]).astype(_UINT[w_to])


def dot(a, b, c, wa: int, wb: int, wc: int):
    """C + sum_k sext(a) * sext(b), in the accumulator's width."""
    a64 = signed(a, wa).astype(np.int64).view(np.uint64)
    b64 = signed(b, wb).astype(np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        prod = np.matmul(a64, b64)  # wraps modulo 2^64
    return add(np.asarray(c, _UINT[wc]), prod.astype(_UINT[wc]), wc)
