"""fastgather for PyTorch.

``import fastgather`` registers the torch.distributed backend ``"fastgather"``:

    dist.init_process_group("gloo", init_method="tcp://...", rank=r, world_size=n)
    group = dist.new_group(ranks, backend="fastgather")
    dist.all_gather(outputs, x, group=group)                  # list form
    dist.all_gather_into_tensor(out, x, group=group)          # one tensor
    out, gathered = fastgather.all_gather_base_mm(x1, x2, fastgather.get_comm_name(group, r), len(ranks))
    x = fastgather.empty(group, (16, 3072), torch.float16)    # read in place by the group's gathers

fastgather serves all_gather, all_gather_into_tensor (_all_gather_base),
broadcast and barrier for CPU tensors of every dtype torch has on CPU; any
other op raises RuntimeError naming it. Ops complete before they return, so
the work of ``async_op=True`` is already complete.
"""
import torch  # noqa: F401  (loads torch's libraries before the extension)
import torch.distributed as dist

from . import _C

__all__ = ["all_gather_base_mm", "empty", "get_comm_name", "transport", "BACKEND"]

BACKEND = "fastgather"


def _create_process_group(store, rank, size, timeout):
    return _C.create_process_group(store, rank, size, timeout)


# Importing twice (or after another import registered it) is harmless.
if BACKEND.upper() not in getattr(dist.Backend, "_plugins", {}):
    dist.Backend.register_backend(BACKEND, _create_process_group)


def get_comm_name(group, rank=None):
    """The name all_gather_base_mm takes as ``hcom`` (the role of get_hccl_comm_name)."""
    del rank  # one name per group in this process, whatever the rank
    return _C.comm_name(group)


def transport(group):
    """How the group's bytes move ("shared memory", or shared memory and UCX between hosts)."""
    return _C.transport(group)


def empty(group, shape, dtype=torch.float32):
    """An uninitialised CPU tensor in the fastgather group's symmetric heap.

    The group's all-gathers read such an input in place (one copy per byte
    instead of two); anything else uses it as an ordinary tensor. It may be
    overwritten as soon as a collective on it returns, and it may outlive the
    group. Raises RuntimeError when the heap (FG_SYMMETRIC_BYTES per rank) is full.
    """
    shape = tuple(shape)
    n = 1
    for d in shape:
        n *= d
    itemsize = torch.empty((), dtype=dtype).element_size()
    return _C.empty_bytes(group, n * itemsize).view(dtype).reshape(shape)


def all_gather_base_mm(x1, x2, hcom, world_size, bias=None, gather_index=0, gather_output=True, comm_turn=0):
    """torch_npu.npu_all_gather_base_mm on CPU: returns (output, gather_out).

    output = allgather(x1) @ x2 + bias, of shape (m * world_size, n), in x1's dtype
    (float16, bfloat16 or float32; fp32 accumulation); gather_out = allgather(x1),
    (m * world_size, k), or an empty tensor when gather_output is False. ``hcom``
    is what get_comm_name returns; a fastgather group object is accepted too.
    """
    if not isinstance(hcom, str):
        hcom = get_comm_name(hcom)
    return _C.all_gather_base_mm(x1, x2, hcom, world_size, bias, gather_index, gather_output, comm_turn)
