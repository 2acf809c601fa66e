"""PyTorch's own distributed tests (torch/testing/_internal/distributed/
distributed_test.py, from the installed torch) on the fastgather backend:
each test spawns WORLD_SIZE ranks that init_process_group(BACKEND) and run it.

    BACKEND=fastgather WORLD_SIZE=2 python distributed_suite.py TestFastgatherBackend.test_all_gather ...

torch's own runner (test/distributed/test_distributed_spawn.py) is not in the
wheel; this is its class, with fastgather imported so that spawned ranks
have the backend registered. (Named so that pytest does not collect it:
it sets the environment torch's tests read.)"""
import os
import sys
import tempfile

# Under CI=... torch's run_tests() writes XML reports through a package we do not install.
os.environ.pop("CI", None)
os.environ.setdefault("BACKEND", "fastgather")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="fg-dist-test-"))

import torch.distributed as dist  # noqa: E402

import fastgather  # noqa: E402,F401  (registers the backend, here and in each spawned rank)
from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class TestFastgatherBackend(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    assert dist.is_available()
    run_tests()
