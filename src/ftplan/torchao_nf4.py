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
``tests/test_torchtune_loss.py``. torchao refuses tensors whose size is not a multiple of 64, or
whose number of blocks is not a multiple of 256 (``NF4Tensor.from_tensor`` /
``double_quantize_scalers`` assertions).
"""

from __future__ import annotations

__all__ = ["NF4_BLOCK", "NF4_SCALER_BLOCK", "nf4_tensor_bytes"]

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
