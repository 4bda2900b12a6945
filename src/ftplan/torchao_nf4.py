"""torchao's NF4 weight storage (torchtune's QLoRA: ``FrozenNF4Linear``, ``LoRALinear(quantize_base=True)``).

torchtune (0.3.1 ``modules/low_precision/nf4_linear.py``) quantizes each frozen base linear with
``torchao.dtypes.nf4tensor.to_nf4(weight)``: ``block_size=64``, ``scaler_block_size=256``
(torchao 0.18: ``torchao/quantization/quantize_/workflows/nf4/nf4_tensor.py``, ``to_nf4`` /
``NF4Tensor.from_tensor`` / ``double_quantize_scalers``). An ``NF4Tensor`` of ``n`` elements holds:

* ``quantized_data``: uint8, two 4-bit codes per byte: ``n / 2`` bytes;
* ``quantized_scalers``: int8, one per block of 64: ``n / 64`` bytes;
* ``quantization_factor``: one per 256 scalers, in the weight's dtype: ``n / 16384`` values;
* ``scaler_mean``: one value in the weight's dtype; ``nf4``: the 16-entry code in the weight's dtype.

Against bitsandbytes' nf4 with double quantization (``sharding.quant_state_bytes``: uint8 absmax
per 64, an fp32 absmax per 256 of them, a 256-entry fp32 code and offset, the 16-entry fp32 code)
the difference is the dtype of the per-256 factors and the code tables: ~n / 8192 bytes less in
bf16, 0.01 % of the 4-bit data. Held exact against torchao's ``NF4Tensor`` in
``tests/test_torchtune_loss.py`` and ``tests/test_torchao_nf4_qlora.py`` (storage, FSDP2 shards
and all-gather inputs, ``linear_nf4``'s saved tensors and dequantize peak). Planned as
``Job.quant.quant_type == "torchao-nf4"`` (``memory``, ``sharding``, ``job._torchao_nf4_problems``). torchao refuses tensors whose size is not a multiple of 64, or
whose number of blocks is not a multiple of 256 (``NF4Tensor.from_tensor`` /
``double_quantize_scalers`` assertions).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from fractions import Fraction

__all__ = ["NF4_BLOCK", "NF4_SCALER_BLOCK", "nf4_dequant_peak_bytes", "nf4_element_bytes", "nf4_problems",
           "nf4_table_bytes", "nf4_tensor_bytes"]

#: ``to_nf4`` defaults, which torchtune uses
NF4_BLOCK = 64
NF4_SCALER_BLOCK = 256


def nf4_tensor_bytes(numel: int, dtype_bytes: int = 2, block_size: int = NF4_BLOCK,
                     scaler_block_size: int = NF4_SCALER_BLOCK) -> int:
    """Bytes of torchao's ``NF4Tensor`` of a ``numel``-element weight stored from ``dtype_bytes``
    (bf16: 2): packed codes, int8 block scalers, per-scaler-block factors, the scaler mean and the
    16-entry code (module doc). ``ValueError`` where torchao's asserts refuse the size."""
    if numel <= 0 or numel % block_size:
        raise ValueError(f"torchao NF4: {numel} elements is not a multiple of the block size {block_size}")
    blocks = numel // block_size
    if blocks % scaler_block_size:
        raise ValueError(f"torchao NF4: {blocks} blocks is not a multiple of the scaler block size {scaler_block_size}")
    return numel // 2 + blocks + (blocks // scaler_block_size) * dtype_bytes + dtype_bytes + 16 * dtype_bytes


def nf4_table_bytes(dtype_bytes: int = 2) -> int:
    """The per-tensor part of an ``NF4Tensor``: ``scaler_mean`` (one value) and the 16-entry code,
    in the weight's dtype. FSDP2 does not shard or gather them: every rank keeps its own (the
    sharded tensors share the full tensor's, ``construct_nf4_args``)."""
    return 17 * dtype_bytes


def nf4_element_bytes(dtype_bytes: int = 2, block_size: int = NF4_BLOCK,
                      scaler_block_size: int = NF4_SCALER_BLOCK) -> Fraction:
    """Bytes per weight element of the sharded / gathered part of an ``NF4Tensor``: the codes
    (1/2), the int8 block scalers (1/64) and the per-scaler-block factors (dtype / 16384) -- what
    ``NF4Tensor.fsdp_pre_all_gather`` hands FSDP2 (``quantized_scalers``, ``quantization_factor``,
    ``quantized_data``) and what ``nf4_split`` / ``new_zeros`` cut into dim-0 shards. With
    :func:`nf4_table_bytes`: ``nf4_tensor_bytes(n) == n * nf4_element_bytes() + nf4_table_bytes()``."""
    return Fraction(1, 2) + Fraction(1, block_size) + Fraction(dtype_bytes, block_size * scaler_block_size)


def nf4_dequant_peak_bytes(numel: int, dtype_bytes: int = 2, block_size: int = NF4_BLOCK) -> int:
    """Peak bytes ``NF4Tensor.get_original_weight`` allocates to dequantize a ``numel``-element
    weight (torchao 0.18; the same code in every torchao release torchtune used): what
    ``linear_nf4`` adds at each call, in the forward (``F.linear(input, weight.to(input.dtype))``)
    and again in the backward (``grad_output @ weight.to(grad_output.dtype)``); autograd saves only
    the ``NF4Tensor`` itself.

    At the final ``torch.stack`` these are alive together: the two int64 code-index tensors
    (``(quantized_data >> 4).to(torch.long)``, ``& 0b1111``: n/2 elements each, 8 n bytes), the two
    looked-up halves (``nf4[idx]``, c n), the dequantized block scalers (c n / 64), the two scaled
    halves (c n) and the stacked weight (c n): 8 n + 3 c n + c n / 64. The full weight alone (c n)
    stays for the matmul after the function returns. Measured on CPU with a storage tracker
    (``tests/test_torchao_nf4_qlora.py``): exact."""
    if numel % block_size:
        raise ValueError(f"torchao NF4: {numel} elements is not a multiple of the block size {block_size}")
    return 8 * numel + 3 * dtype_bytes * numel + dtype_bytes * (numel // block_size)


def nf4_problems(linears: Iterable[tuple[str, int, int]], shard: int = 1,
                 block_size: int = NF4_BLOCK, scaler_block_size: int = NF4_SCALER_BLOCK) -> Iterator[str]:
    """Why torchao would refuse to quantize (``to_nf4``) or FSDP2-shard (``nf4_split`` /
    ``nf4_new_zeros`` over ``shard`` ranks, dim 0) each ``(module, out_features, in_features)``
    weight; nothing when it accepts them all. FSDP2 pads dim 0 to a multiple of the ranks, which
    an ``NF4Tensor`` cannot: its rows, and its per-16384-element factors, must split evenly."""
    seen = set()
    per_factor = block_size * scaler_block_size
    for module, rows, cols in linears:
        if (module, rows, cols) in seen:
            continue
        seen.add((module, rows, cols))
        n = rows * cols
        if n % per_factor:
            yield (f"{module} ({rows} x {cols}) is not a multiple of {per_factor} elements, which torchao's "
                   f"to_nf4 (block {block_size}, scaler block {scaler_block_size}) refuses")
        elif shard > 1 and (rows % shard or (n // per_factor) % shard):
            yield (f"{module} ({rows} x {cols}) does not split into {shard} FSDP2 shards of whole rows and "
                   f"whole {per_factor}-element factor blocks, which torchao's NF4Tensor needs (it cannot be padded)")
