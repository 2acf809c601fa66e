"""fastgather for PyTorch 2.x.

``import fastgather`` registers the torch.distributed backend ``"fastgather"``
for CPU tensors:

    dist.init_process_group("fastgather")                     # env:// (torchrun), or init_method=...
    dist.init_process_group("cpu:fastgather")                 # the same, naming the device
    group = dist.new_group(ranks, backend="fastgather")       # beside a gloo world
    dist.all_gather(outputs, x, group=group)                  # list form
    dist.all_gather_into_tensor(out, x, group=group)          # one tensor
    work = dist.all_gather_into_tensor(out, x, group=group, async_op=True)  # moves while Python computes
    out, gathered = fastgather.all_gather_base_mm(x1, x2, fastgather.get_comm_name(group), len(ranks))
    y = fastgather.mm_reduce_scatter_base(x1, x2, fastgather.get_comm_name(group), len(ranks))
    x = fastgather.empty(group, (16, 3072), torch.float16)    # read in place by the group's gathers

fastgather serves all_gather (uneven tensors too),
all_gather_into_tensor, all_gather_coalesced, all_gather_into_tensor_coalesced
(and so the functional collectives' all_gather_tensor), broadcast and barrier
for CPU tensors of every dtype; all_reduce, reduce_scatter and
reduce_scatter_tensor with ReduceOp.SUM (float32, float16,
bfloat16, float64, int32, int64, complex; every rank gets the same bits);
any other op raises NotImplementedError (a RuntimeError) naming it. Errors:
wrong arguments are ValueError or TypeError; a lost peer, a timeout or an
abort is torch.distributed.DistBackendError.

The fused ops are the torch operators ``torch.ops.fastgather.all_gather_base_mm``
and ``torch.ops.fastgather.mm_reduce_scatter_base`` (with fake kernels, so
torch.compile traces them); ``all_gather_base_mm`` and ``mm_reduce_scatter_base``
below are they with torch_npu's signatures and argument checks.
"""
import torch
import torch.distributed as dist

from ._built_with import TORCH_VERSION as _BUILT_WITH

# The extension's C++ calls torch's by name: it loads only beside the torch release it was built
# against (an undefined symbol otherwise, or worse). Said plainly, before loading it.
if torch.__version__.split("+")[0] != _BUILT_WITH.split("+")[0]:
    raise ImportError(f"fastgather was built against torch {_BUILT_WITH}, but this Python imports torch "
                      f"{torch.__version__} (from {torch.__file__}); rebuild fastgather against it: "
                      f"pip install --no-build-isolation --force-reinstall fastgather (from its source)")

from . import _C  # noqa: E402

__all__ = ["all_gather_base_mm", "mm_reduce_scatter_base", "empty", "get_comm_name", "handle", "transport", "backend_of",
           "set_settings", "settings", "serve_deepspeed", "BACKEND"]

BACKEND = "fastgather"


def _create_backend(dist_opts, backend_opts):
    del backend_opts  # fastgather has no options of its own beyond the environment's
    return _C.create_backend(dist_opts.store, dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout)


# Importing twice (or after another import registered it) is harmless.
if BACKEND.upper() not in getattr(dist.Backend, "_plugins", {}):
    dist.Backend.register_backend(BACKEND, _create_backend, extended_api=True, devices=["cpu"])


def backend_of(group):
    """The fastgather backend serving ``group``'s CPU tensors (what ``group._get_backend(cpu)`` returns).

    Raises TypeError for anything that is not a process group, ValueError for a
    group whose CPU backend is another one."""
    if isinstance(group, _C.ProcessGroupFastgather):
        return group
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"fastgather: expected a torch.distributed ProcessGroup (from new_group(ranks, "
                        f"backend=\"fastgather\")), got {type(group).__name__}")
    try:
        backend = group._get_backend(torch.device("cpu"))
    except RuntimeError as e:
        raise ValueError(f"fastgather: the group has no CPU backend ({e}); create it with "
                         f"new_group(ranks, backend=\"fastgather\")") from None
    if not isinstance(backend, _C.ProcessGroupFastgather):
        raise ValueError(f"fastgather: the group's CPU backend is {group._get_backend_name()!r}, not fastgather; "
                         f"create it with new_group(ranks, backend=\"fastgather\")")
    return backend


def get_comm_name(group, rank=None):
    """The name all_gather_base_mm takes as ``hcom`` (the role of get_hccl_comm_name)."""
    del rank  # one name per group in this process, whatever the rank
    return backend_of(group).get_comm_name()


def handle(group):
    """The group's handle for the direct operators: an int, the same for the group's life, never
    another group's in this process.

    The direct operators are torch's functional collectives without torch.distributed's layers (no
    Work, no hand-off; each blocks on the caller's thread until done, in order with the group's
    other calls), for inference engines' per-token collectives; each takes the handle last::

        h = fastgather.handle(group)
        y = torch.ops.fastgather.all_reduce(x, "sum", h)            # also all_reduce_(x, "sum", h)
        g = torch.ops.fastgather.all_gather_into_tensor(x, n, h)    # rows of every rank; _out(..., out=)
        r = torch.ops.fastgather.reduce_scatter_tensor(x, "sum", n, h)
        b = torch.ops.fastgather.broadcast(x, src, h)               # also broadcast_(x, src, h)

    ``n`` is the group's size (checked); reductions: sum, avg, product, min, max, band, bor, bxor.
    The out-of-place forms trace under torch.compile(fullgraph=True)."""
    return backend_of(group).handle()


def serve_deepspeed():
    """DeepSpeed's ``inference_all_reduce`` on fastgather's direct operator, for groups on fastgather.

    DeepSpeed's tensor-parallel inference (AutoTP's row-parallel layers and LM head) sums each
    layer's partial output with ``deepspeed.comm.inference_all_reduce``: its own shared-memory op
    where it was built (SUM only; fp32 alone without AVX-512), else ``torch.distributed.all_reduce``.
    After this call a SUM on a group served by fastgather (the world, after
    ``deepspeed.init_distributed(dist_backend="fastgather")``) is ``torch.ops.fastgather.all_reduce_``
    on the caller's thread, every dtype; other reductions and other groups go where they went.
    Idempotent; raises ImportError without deepspeed."""
    import importlib
    ds_torch = importlib.import_module("deepspeed.comm.torch")  # (deepspeed.comm's attribute "torch" is torch)
    from deepspeed.comm.reduce_op import ReduceOp as DsReduceOp

    backend_cls = ds_torch.TorchBackend
    if getattr(backend_cls, "_fastgather", False):
        return
    original = backend_cls.inference_all_reduce
    handles = {}  # group -> handle, or None where the group is not fastgather's

    def inference_all_reduce(self, tensor, op=DsReduceOp.SUM, group=None):
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        h = handles.get(pg, -1)
        if h == -1:
            try:
                h = handle(pg)
            except ValueError:  # a group on another backend
                h = None
            handles[pg] = h
        if h is None or op not in (DsReduceOp.SUM, dist.ReduceOp.SUM):
            return original(self, tensor, op, group)
        torch.ops.fastgather.all_reduce_(tensor, "sum", h)
        return tensor

    backend_cls.inference_all_reduce = inference_all_reduce
    backend_cls._fastgather = True


def set_settings(**settings):
    """Settings for the fastgather groups created from now on in this process.

    Each keyword overrides the environment's value (the FG_* variables of
    ``fg-bench --help-env``): ``ring_bytes``, ``pipeline_bytes``,
    ``symmetric_bytes``, ``stream_out_bytes``, ``single_copy_min_bytes``,
    ``hier_min_bytes``, ``net_piece_bytes``, ``spin_us``, ``yield_us``,
    ``report_ms`` (ints), ``copy_in`` ("learned", "cached", "streaming"),
    ``single_copy`` ("auto", "off", "always"), ``fused_gemm`` ("auto",
    "openblas", "avx2"). With no keyword, groups read the environment alone again.
    Every rank of a group must create it with the same settings. Unknown names
    and wrong types raise TypeError, values out of range ValueError."""
    _C.set_settings(**settings)


def settings(group=None):
    """The settings ``group`` follows, or those the next group will follow, as
    "FG_RING_BYTES=... FG_PIPELINE_BYTES=... ..." (what FG_LOG_SETTINGS prints)."""
    return _C.new_settings() if group is None else _C.settings_of(backend_of(group))


def transport(group):
    """How the group's bytes move ("shared memory", or shared memory and UCX between hosts)."""
    return backend_of(group).transport()


def empty(group, shape, dtype=torch.float32):
    """An uninitialised CPU tensor in the fastgather group's symmetric heap.

    The group's all-gathers read such an input in place (one copy per byte
    instead of two); anything else uses it as an ordinary tensor. It may be
    overwritten as soon as a collective on it returns, and it may outlive the
    group. Raises RuntimeError when the heap (FG_SYMMETRIC_BYTES per rank) is full.
    """
    backend = backend_of(group)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"fastgather: empty: dtype must be a torch.dtype, got {type(dtype).__name__}")
    if isinstance(shape, int):
        shape = (shape,)
    try:
        shape = tuple(shape)
    except TypeError:
        raise TypeError(f"fastgather: empty: shape must be a sequence of ints, got {type(shape).__name__}") from None
    n = 1
    for d in shape:
        if not isinstance(d, int) or isinstance(d, bool):
            raise TypeError(f"fastgather: empty: shape must hold ints, got {d!r}")
        if d < 0:
            raise ValueError(f"fastgather: empty: negative dimension in {shape}")
        n *= d
    itemsize = torch.empty((), dtype=dtype).element_size()
    if n * itemsize >= 1 << 62:
        raise ValueError(f"fastgather: empty: {shape} of {dtype} is {n * itemsize} bytes")
    return _C.empty_bytes(backend, n * itemsize).view(dtype).reshape(shape)


def _check_args(x1, x2, world_size, bias, gather_index, gather_output, comm_turn):
    for name, t in (("x1", x1), ("x2", x2)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"fastgather: all_gather_base_mm: {name} must be a tensor, got {type(t).__name__}")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"fastgather: all_gather_base_mm: bias must be a tensor or None, got {type(bias).__name__}")
    for name, v in (("world_size", world_size), ("gather_index", gather_index), ("comm_turn", comm_turn)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"fastgather: all_gather_base_mm: {name} must be an int, got {type(v).__name__}")
    if not isinstance(gather_output, bool):
        raise TypeError(f"fastgather: all_gather_base_mm: gather_output must be a bool, got {type(gather_output).__name__}")
    if world_size < 1:
        raise ValueError(f"fastgather: all_gather_base_mm: world_size={world_size}")
    if x1.dim() != 2 or x2.dim() != 2:
        raise ValueError(f"fastgather: all_gather_base_mm: x1 and x2 must be 2-D, got {tuple(x1.shape)} and {tuple(x2.shape)}")
    if x1.shape[1] != x2.shape[0]:
        raise ValueError(f"fastgather: all_gather_base_mm: x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} disagree on k")


def all_gather_base_mm(x1, x2, hcom, world_size, bias=None, gather_index=0, gather_output=True, comm_turn=0):
    """torch_npu.npu_all_gather_base_mm on CPU: returns (output, gather_out).

    output = allgather(x1) @ x2 + bias, of shape (m * world_size, n), in x1's dtype
    (float16, bfloat16 or float32; fp32 accumulation); gather_out = allgather(x1),
    (m * world_size, k), or an empty tensor when gather_output is False. ``hcom``
    is what get_comm_name returns; a fastgather group object is accepted too.
    """
    if not isinstance(hcom, str):
        hcom = get_comm_name(hcom)
    _check_args(x1, x2, world_size, bias, gather_index, gather_output, comm_turn)
    return torch.ops.fastgather.all_gather_base_mm(x1, x2, hcom, world_size, bias, gather_index, gather_output,
                                                   comm_turn)


@torch.library.register_fake("fastgather::all_gather_base_mm")
def _all_gather_base_mm_fake(x1, x2, hcom, world_size, bias=None, gather_index=0, gather_output=True, comm_turn=0):
    m, k = x1.shape
    out = x1.new_empty((m * world_size, x2.shape[1]))
    gathered = x1.new_empty((m * world_size, k)) if gather_output else x1.new_empty((0,))
    return out, gathered


def mm_reduce_scatter_base(x1, x2, hcom, world_size, reduce_op="sum", bias=None, comm_turn=0):
    """torch_npu.npu_mm_reduce_scatter_base on CPU.

    Every rank's ``x1 @ x2`` (x1 (m, k), x2 (k, n); m a multiple of world_size),
    summed over the group and scattered along rows: returns this rank's
    (m / world_size, n) rows, + bias (n, added once). float16, bfloat16 or
    float32; the products travel and are summed in float32, in rank order
    (across servers: each server's ranks, then the servers in order; the same
    bits on every run), rounded once. Each peer's rows are multiplied straight
    into shared memory while the peers multiply theirs.
    """
    if not isinstance(hcom, str):
        hcom = get_comm_name(hcom)
    for name, t in (("x1", x1), ("x2", x2)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"fastgather: mm_reduce_scatter_base: {name} must be a tensor, got {type(t).__name__}")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"fastgather: mm_reduce_scatter_base: bias must be a tensor or None, got {type(bias).__name__}")
    for name, v in (("world_size", world_size), ("comm_turn", comm_turn)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"fastgather: mm_reduce_scatter_base: {name} must be an int, got {type(v).__name__}")
    if not isinstance(reduce_op, str):
        raise TypeError(f"fastgather: mm_reduce_scatter_base: reduce_op must be a str, got {type(reduce_op).__name__}")
    if world_size < 1:
        raise ValueError(f"fastgather: mm_reduce_scatter_base: world_size={world_size}")
    return torch.ops.fastgather.mm_reduce_scatter_base(x1, x2, hcom, world_size, reduce_op, bias, comm_turn)


@torch.library.register_fake("fastgather::mm_reduce_scatter_base")
def _mm_reduce_scatter_base_fake(x1, x2, hcom, world_size, reduce_op="sum", bias=None, comm_turn=0):
    return x1.new_empty((x1.shape[0] // world_size, x2.shape[1]))


# The direct operators' shapes, for torch.compile and fake tensors (the kernels: csrc/direct_ops.cpp).
@torch.library.register_fake("fastgather::all_reduce")
def _all_reduce_fake(input, reduce_op, group):
    return torch.empty_like(input, memory_format=torch.contiguous_format)


@torch.library.register_fake("fastgather::all_gather_into_tensor")
def _all_gather_into_tensor_fake(input, group_size, group):
    shape = list(input.shape) or [1]
    shape[0] *= group_size
    return input.new_empty(shape)


@torch.library.register_fake("fastgather::reduce_scatter_tensor")
def _reduce_scatter_tensor_fake(input, reduce_op, group_size, group):
    return input.new_empty([input.shape[0] // group_size] + list(input.shape[1:]))


@torch.library.register_fake("fastgather::broadcast")
def _broadcast_fake(input, src, group):
    return torch.empty_like(input, memory_format=torch.contiguous_format)


# The in-place and out= forms write their tensor and return nothing (torch.compile functionalizes
# a custom operator that mutates an argument only if no output aliases it).
@torch.library.register_fake("fastgather::all_reduce_")
def _all_reduce_inplace_fake(input, reduce_op, group):
    return None


@torch.library.register_fake("fastgather::all_gather_into_tensor_out")
def _all_gather_into_tensor_out_fake(input, group_size, group, *, out):
    return None


@torch.library.register_fake("fastgather::broadcast_")
def _broadcast_inplace_fake(input, src, group):
    return None


# A collective must run on every rank even where its result goes unused: never dropped from a graph.
for _op in ("all_reduce", "all_reduce_", "all_gather_into_tensor", "all_gather_into_tensor_out",
            "reduce_scatter_tensor", "broadcast", "broadcast_"):
    torch.fx.node.has_side_effect(getattr(torch.ops.fastgather, _op).default)
