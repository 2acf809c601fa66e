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
import types

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
    # with every group torch would make on gloo made on fastgather instead: torch makes gloo
    # groups through the name ProcessGroupGloo in distributed_c10d, which this replaces by a class
    # whose construction returns a fastgather backend (and that a fastgather backend is an
    # instance of, as torch checks). What only gloo has (its options, its device objects) is
    # gloo's own.
    from torch.distributed import distributed_c10d as _c10d
    from fastgather import _C as _fg

    _Gloo = _c10d.ProcessGroupGloo

    class _AsGloo(type):
        def __instancecheck__(cls, obj):
            return isinstance(obj, (_Gloo, _fg.ProcessGroupFastgather))

        def __getattr__(cls, name):
            return getattr(_Gloo, name)

    class FastgatherAsGloo(metaclass=_AsGloo):
        def __new__(cls, store, rank, size, timeout=None, *args, **kwargs):
            backend = _fg.create_backend(store, rank, size, timeout)
            backend.options = types.SimpleNamespace(timeout=timeout)  # torch writes the group's ranks and name here
            return backend

    _c10d.ProcessGroupGloo = FastgatherAsGloo


class TestFastgatherBackend(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._start_processes(torch.multiprocessing.get_context("fork").Process)


if __name__ == "__main__":
    assert dist.is_available()
    run_tests()
