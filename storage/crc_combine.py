"""CRC-32C of a concatenation from the CRC-32Cs of its parts, without reading the bytes.

``crc32c_combine(crc(A), crc(B), len(B)) == crc(A + B)``. A pre-encoded frame body's
CRC-32C is taken once, when it is staged (``storage.staged_frames``); the frame header's
checksum covers header bytes [8, 48) *then* the body, and those header bytes (offset,
time, transaction) are known only at publish: combining the header's CRC with the body's
gives the frame's checksum without reading the body again.

The math (the standard one for any reflected CRC): with the register preset and the
final xor both ``0xFFFFFFFF``, ``crc(A + B) = shift(crc(A), len(B)) ^ crc(B)``, where
``shift(c, n)`` multiplies ``c`` by ``x^(8n)`` modulo the CRC polynomial (Castagnoli,
reflected ``0x82F63B78``): the presets and final xors of the two halves cancel out. The
multiplication is carry-less, in the reflected bit order (bit 31 is x^0). ``x^(8n)`` is
built from the powers ``x^(2^k)`` kept in ``_POWERS``: at most 64 products of 32 steps,
about 0.1 ms for a body of a few MiB.
"""

from __future__ import annotations

_POLY = 0x82F63B78  # Castagnoli, reflected
_X0 = 0x80000000  # the polynomial 1 (x^0) in reflected order


def _multiply(a: int, b: int) -> int:
    """``a * b`` modulo the polynomial (both reflected: bit 31 is x^0)."""
    product = 0
    mask = _X0
    while mask:
        if a & mask:
            product ^= b
        mask >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return product


def _powers() -> list[int]:
    """``_POWERS[k] == x^(2^k)`` modulo the polynomial, for k in 0..63."""
    powers = [_X0 >> 1]  # x^1
    for _ in range(63):
        powers.append(_multiply(powers[-1], powers[-1]))
    return powers


_POWERS = _powers()


def _x_to_the(exponent: int) -> int:
    """``x^exponent`` modulo the polynomial."""
    assert exponent >= 0
    result = _X0
    k = 0
    while exponent:
        if exponent & 1:
            result = _multiply(result, _POWERS[k])
        exponent >>= 1
        k += 1
    return result


def crc32c_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """The CRC-32C of ``A + B`` given ``crc32c(A)``, ``crc32c(B)`` and ``len(B)``."""
    assert 0 <= crc_a < 2**32 and 0 <= crc_b < 2**32 and length_b >= 0
    if length_b == 0:
        return crc_a
    return _multiply(_x_to_the(8 * length_b), crc_a) ^ crc_b
