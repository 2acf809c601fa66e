"""PyTorch's own distributed tests (torch/testing/_internal/distributed/
distributed_test.py, from the installed torch) on the fastgather backend:
each test starts WORLD_SIZE ranks that init_process_group(BACKEND) and run it.

    BACKEND=fastgather WORLD_SIZE=2 python distributed_suite.py TestFastgatherBackend.test_all_gather ...

torch's own runner (test/distributed/test_distributed_spawn.py) is not in the
wheel; this is its class, with fastgather imported so that the ranks have
the backend registered. (Named so that pytest does not collect it:
it sets the environment torch's tests read.)

Ranks are forked, not spawned as torch's runner does: a spawned rank starts a
fresh interpreter that imports torch and this suite again, seconds of CPU per
rank and test on a 2-core machine (most of the suite's time), where a forked
one starts from this process, which has imported them and made no process
group. Ranks that start as fresh interpreters are tests/python/
test_torch_backend.py's (workers.py)."""
import os
import sys
import tempfile

# Under CI=... torch's run_tests() writes XML reports through a package we do not install.
os.environ.pop("CI", None)
os.environ.setdefault("BACKEND", "fastgather")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="fg-dist-test-"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import fastgather  # noqa: E402,F401  (registers the backend, here and so in each forked rank)
from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


if os.environ.get("FG_AS_GLOO") == "1":
    # torch's tests as torch runs them for gloo (BACKEND=gloo, so that its gloo-gated tests run),
    # with every group torch would make on gloo made on fastgather instead: every process group
    # is made by distributed_c10d._new_process_group_helper, which this wraps to ask for
    # fastgather where gloo was asked for (the world included). The groups then say
    # "fastgather" (tests that compare the name with "gloo" fail); torch's own code that treats
    # a group named gloo as its ProcessGroupGloo never meets one.
    from torch.distributed import distributed_c10d as _c10d

    _helper = _c10d._new_process_group_helper

    def _gloo_made_on_fastgather(group_size, group_rank, global_ranks_in_group, backend, *args, **kwargs):
        if str(backend).lower() in ("gloo", "cpu:gloo"):
            backend = _c10d.Backend("fastgather")
        return _helper(group_size, group_rank, global_ranks_in_group, backend, *args, **kwargs)

    _c10d._new_process_group_helper = _gloo_made_on_fastgather


class TestFastgatherBackend(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._start_processes(torch.multiprocessing.get_context("fork").Process)


if __name__ == "__main__":
    assert dist.is_available()
    run_tests()
