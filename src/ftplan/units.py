"""Units and dtype sizes. Sizes are exact: 4-bit types weigh ``Fraction(1, 2)`` byte."""

from __future__ import annotations

from fractions import Fraction

__all__ = ["GIB", "GB", "MIB", "DTYPE_BYTES", "dtype_bytes", "to_gib", "to_gb", "human_bytes"]

GIB = 2**30
MIB = 2**20
GB = 10**9

#: bytes per element, exact.
DTYPE_BYTES: dict[str, Fraction] = {
    "fp64": Fraction(8),
    "fp32": Fraction(4),
    "tf32": Fraction(4),
    "bf16": Fraction(2),
    "fp16": Fraction(2),
    "fp8": Fraction(1),
    "int8": Fraction(1),
    "uint8": Fraction(1),
    "nf4": Fraction(1, 2),
    "fp4": Fraction(1, 2),
    "nvfp4": Fraction(1, 2),
    "int64": Fraction(8),
    "int32": Fraction(4),
    "bool": Fraction(1),
}


def dtype_bytes(dtype: str) -> Fraction:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        from .errors import ConfigError

        raise ConfigError(f"unknown dtype {dtype!r}", f"use one of {', '.join(DTYPE_BYTES)}") from None


def to_gib(n_bytes: float) -> float:
    return float(n_bytes) / GIB


def to_gb(n_bytes: float) -> float:
    return float(n_bytes) / GB


def human_bytes(n: float | None) -> str:
    """``1.50 GiB``, ``12.00 MiB``, ``3 B``; ``-`` for unknown."""
    if n is None:
        return "-"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
