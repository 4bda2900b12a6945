"""Memory-model constants (CUDA context, allocator reserve, ...) from ``data/memory_constants.json``.

Loaded on first use and validated: every constant needs ``value``, ``source`` and ``status``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from ..errors import CatalogError

__all__ = ["MemoryConstants", "memory_constants"]

_REQUIRED = (
    "cuda_context_bytes",
    "cublas_workspace_bytes",
    "nccl_communicator_bytes",
    "allocator_reserve_fraction",
    "allocator_reserve_min_bytes",
    "ddp_bucket_cap_bytes",
    "zero_bucket_bytes",
    "bnb_8bit_block_size",
    "bnb_8bit_min_size",
    "trl_offload_stash_tensors",
    "trl_offload_min_bytes",
    "trl_logprob_token_chunk",
    "trl_logprob_vocab_chunk",
    "deepspeed_auto_reduce_bucket_h2",
    "deepspeed_auto_prefetch_bucket_h2",
    "deepspeed_auto_persistence_h",
    "deepspeed_max_live_parameters",
    "fsdp2_schedule_torch",
)


@dataclass(frozen=True)
class MemoryConstants:
    cuda_context_bytes: int
    cuda_context_bytes_amd: int
    cublas_workspace_bytes: int
    #: device memory of one NCCL communicator a rank joins (outside the caching allocator), for a
    #: group of more than two ranks and of two
    nccl_communicator_bytes: int
    nccl_communicator_two_rank_bytes: int
    allocator_reserve_fraction: float
    allocator_reserve_min_bytes: int
    ddp_bucket_cap_bytes: int
    zero_bucket_bytes: int
    bnb_8bit_block_size: int
    bnb_8bit_min_size: int
    trl_offload_stash_tensors: int
    trl_offload_min_bytes: int
    trl_logprob_token_chunk: int
    trl_logprob_vocab_chunk: int
    #: DeepSpeed ZeRO buckets as HF Trainer fills ``auto`` (what ftplan's ds_config.json asks for)
    deepspeed_auto_reduce_bucket_h2: float = 1.0
    deepspeed_auto_prefetch_bucket_h2: float = 0.9
    deepspeed_auto_persistence_h: float = 10.0
    deepspeed_max_live_parameters: int = 1_000_000_000
    #: the torch version whose FSDP2 buffer lifetimes the transient follows (2.15 frees two earlier)
    fsdp2_schedule_torch: float = 2.13

    def context_bytes(self, vendor: str | None) -> int:
        return self.cuda_context_bytes_amd if (vendor or "").lower() == "amd" else self.cuda_context_bytes

    def communicator_bytes(self, ranks: int) -> int:
        """Device bytes of one NCCL/RCCL communicator over ``ranks`` ranks (0 for one rank)."""
        if ranks <= 1:
            return 0
        return self.nccl_communicator_two_rank_bytes if ranks == 2 else self.nccl_communicator_bytes


#: how a constant's value was obtained (see memory_constants.json "_doc")
_STATUSES = ("literature", "calibrated", "checked")


def parse_constants(data: dict, where: str) -> MemoryConstants:
    values = {}
    for key in _REQUIRED:
        entry = data.get(key)
        if not isinstance(entry, dict) or "value" not in entry:
            raise CatalogError(f"{where}: constant {key!r} is missing or has no 'value'")
        if not entry.get("source"):
            raise CatalogError(f"{where}: constant {key!r} has no 'source'")
        if entry.get("status") not in _STATUSES:
            raise CatalogError(f"{where}: constant {key!r} has status {entry.get('status')!r}; use one of "
                               + ", ".join(_STATUSES))
        v = entry["value"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise CatalogError(f"{where}: constant {key!r} must be a non-negative number, got {v!r}")
        values[key] = v
    amd = data["cuda_context_bytes"].get("by_vendor", {}).get("amd", values["cuda_context_bytes"])
    two = data["nccl_communicator_bytes"].get("two_rank", values["nccl_communicator_bytes"])
    if isinstance(two, bool) or not isinstance(two, int) or two < 0:
        raise CatalogError(f"{where}: constant 'nccl_communicator_bytes': 'two_rank' must be a non-negative "
                           f"integer, got {two!r}")
    return MemoryConstants(cuda_context_bytes_amd=int(amd), nccl_communicator_two_rank_bytes=two, **values)


@lru_cache(maxsize=1)
def memory_constants() -> MemoryConstants:
    path = resources.files("ftplan.catalog") / "data" / "memory_constants.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CatalogError(f"cannot read bundled memory_constants.json: {e}") from None
    return parse_constants(data, "memory_constants.json")
