"""vLLM's CPU communicator with its per-token collectives on fastgather's direct operators.

vLLM's tensor-parallel layers call ``all_reduce`` (after every row-parallel matrix product: twice a
layer per token), ``all_gather`` (the logits; column-parallel outputs) and ``reduce_scatter``
(sequence parallelism) on the group's device communicator; these go to ``torch.ops.fastgather.*``
on the group's handle, which run on the caller's thread without torch.distributed's layers.
Everything else (gather, broadcast, send/recv, the all2all managers, vLLM's own set-up of the group)
is vLLM's ``CpuCommunicator``, whose torch.distributed calls land on the same fastgather group.
"""
import os
import time

import torch
from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator
from vllm.logger import init_logger

import fastgather

logger = init_logger("vllm.fastgather")  # under vLLM's logger: its format, its VLLM_LOGGING_LEVEL


class FastgatherCommunicator(CpuCommunicator):

    def __init__(self, cpu_group, device=None, device_group=None, unique_name="", use_all2all=False):
        super().__init__(cpu_group, device, device_group, unique_name, use_all2all=use_all2all)
        # A ValueError here names a device group on another backend (the plugin was not registered
        # in the process that made it).
        self._handle = fastgather.handle(self.device_group)
        logger.info("fastgather: group %s (ranks %s) on fastgather's direct operators, %s", unique_name, self.ranks,
                    fastgather.transport(self.device_group))
        # FG_VLLM_TIMES=1: time spent in this group's per-token collectives, said when vLLM shuts down.
        self._times = None
        if os.environ.get("FG_VLLM_TIMES", "") == "1":
            self._times = {"calls": 0, "seconds": 0.0, "first": None, "last": None}
            for name in ("all_reduce", "all_gather", "reduce_scatter"):
                setattr(self, name, self._timed(getattr(self, name)))

    def _timed(self, call):
        times = self._times

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                end = time.perf_counter()
                times["calls"] += 1
                times["seconds"] += end - start
                times["first"] = start if times["first"] is None else times["first"]
                times["last"] = end
        return timed

    def destroy(self):
        t = self._times
        if t is not None and t["calls"]:
            span = t["last"] - t["first"]
            logger.info("fastgather: group %s rank %d: %d collectives, %.3f s of the %.3f s from the first to the "
                        "last (%.1f%%)", self.unique_name, self.rank_in_group, t["calls"], t["seconds"], span,
                        100.0 * t["seconds"] / span if span > 0 else 0.0)
        super().destroy()

    def all_reduce(self, input_):
        torch.ops.fastgather.all_reduce_(input_, "sum", self._handle)
        return input_

    def all_gather(self, input_, dim=-1):
        if dim < 0:
            dim += input_.dim()
        n = self.world_size
        rows = torch.ops.fastgather.all_gather_into_tensor(input_, n, self._handle)  # (n * d0, ...)
        if dim == 0:
            return rows
        # Each rank's block along dim 0 becomes its block along dim.
        shape = tuple(input_.shape)
        out = rows.reshape((n,) + shape).movedim(0, dim)
        return out.reshape(shape[:dim] + (n * shape[dim],) + shape[dim + 1:])

    def reduce_scatter(self, input_, dim=-1):
        if dim < 0:
            dim += input_.dim()
        n = self.world_size
        if input_.shape[dim] % n:
            raise ValueError(f"fastgather: reduce_scatter: dimension {dim} of {tuple(input_.shape)} does not divide "
                             f"among {n} ranks")
        x = input_.movedim(dim, 0) if dim else input_
        out = torch.ops.fastgather.reduce_scatter_tensor(x, "sum", n, self._handle)
        return out.movedim(0, dim).contiguous() if dim else out
