"""Which process groups a run's collectives go through: on GPUs each is one NCCL communicator with
its own device buffers (``ftplan.sharding.communicator_groups`` predicts them per layout).

:func:`GroupRecorder` is a ``TorchDispatchMode``: every ``c10d`` op (``allreduce_``,
``_allgather_base_``, ``_reduce_scatter_base_``, ``broadcast_``, ``barrier``, ...) carries its
``ProcessGroup``; ``_c10d_functional`` ops carry the group's name. Both are what DDP's reducer,
FSDP1/FSDP2 and DeepSpeed call underneath, whatever Python wrapper they go through, so the
recorder sees the groups the engine really uses (gloo on CPU here; the groups are the same under
NCCL, which creates one communicator per group on its first collective).
"""

from __future__ import annotations

__all__ = ["GroupRecorder"]


def _make_class():
    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode

    class _GroupRecorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            #: group name -> ranks in the group
            self.groups: dict[str, int] = {}

        def _note(self, pg) -> None:
            self.groups[str(pg.group_name)] = int(pg.size())

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            from torch.distributed.tensor import DTensor

            if any(t is DTensor for t in types):
                return NotImplemented
            kwargs = kwargs or {}
            ns = func.namespace
            if ns == "c10d":
                for a in (*args, *kwargs.values()):
                    if isinstance(a, torch.ScriptObject):
                        try:
                            self._note(dist.ProcessGroup.unbox(a))
                        except RuntimeError:  # a ReduceOp or another script object
                            pass
            elif ns == "_c10d_functional":
                from torch.distributed.distributed_c10d import _resolve_process_group

                name = kwargs.get("group_name", args[-1] if args and isinstance(args[-1], str) else None)
                if isinstance(name, str):
                    self._note(_resolve_process_group(name))
            return func(*args, **kwargs)

    return _GroupRecorder


def GroupRecorder():  # noqa: N802 - a factory, so that torch is imported only when used
    """A new recorder of the process groups collectives run on (a ``TorchDispatchMode``)."""
    return _make_class()()
