"""A script in the shape of the original experiment, written for Ascend NPUs
(torch_npu, HCCL): test_npu_script.py runs it, unedited, on CPUs with
`python -m fastgather.npu_script npu_original.py`. It checks its own results
and prints one line per rank and size."""
import datetime
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch_npu

HIDDEN = 256


def get_hcom(comm_group, rank):
    if torch.__version__ > "2.0.1":
        return comm_group._get_backend(torch.device("npu")).get_hccl_comm_name(rank)
    return comm_group.get_hccl_comm_name(rank)


def worker(local_rank, tp, dp, server_index, master_ip, port):
    world = tp * dp
    rank = server_index * (world // int(os.environ["SERVER_NUM"])) + local_rank
    torch.npu.set_device(local_rank)
    dist.init_process_group(backend="hccl", init_method=f"tcp://{master_ip}:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    mine = None
    for k in range(tp):
        ranks = list(range(k, world, tp))
        g = dist.new_group(ranks, backend="hccl")
        if rank in ranks:
            mine = (g, ranks)
    group, ranks = mine
    hcom = get_hcom(group, rank)
    with torch.device("npu"):
        for m in [8, 32]:
            x = torch.full((m, HIDDEN), float(rank), dtype=torch.float32)
            outs = [torch.empty(m, HIDDEN, device=f"npu:{local_rank}") for _ in ranks]
            dist.all_gather(outs, x, group=group)
            torch.npu.synchronize()
            assert [o[0, 0].item() for o in outs] == [float(r) for r in ranks], outs
            x1 = torch.full((m, HIDDEN), float(rank + 1)).half().npu()
            x2 = torch.ones(HIDDEN, 16, dtype=torch.float16, device="npu")
            out, gathered = torch_npu.npu_all_gather_base_mm(x1, x2, hcom, len(ranks), bias=None, gather_index=0,
                                                             gather_output=True, comm_turn=0)
            torch.npu.synchronize()
            want = torch.cat([torch.full((m, 16), float(HIDDEN * (r + 1))) for r in ranks])
            assert out.device.type == "cpu" and torch.equal(out.float(), want), out
            assert gathered.shape == (m * len(ranks), HIDDEN)
            print(f"rank {rank}: m={m} all_gather and npu_all_gather_base_mm ok on {out.device}", flush=True)
    torch.npu.empty_cache()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    tp, dp = int(os.environ.get("TP", 1)), int(os.environ.get("DP", 2))
    servers, index = int(os.environ.get("SERVER_NUM", 1)), int(os.environ.get("SERVER_INDEX", 0))
    mp.spawn(worker, args=(tp, dp, index, os.environ.get("MASTER_IP", "127.0.0.1"), os.environ["PORT"]),
             nprocs=tp * dp // servers)
