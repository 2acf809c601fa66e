"""Run a script written for torch_npu and HCCL on CPUs, on fastgather, without editing it:

    python -m fastgather.npu_script original.py [its arguments]

What the script finds:
- ``import torch_npu`` works; ``torch_npu.npu_all_gather_base_mm`` is fastgather.all_gather_base_mm;
- ``torch.npu``: set_device, synchronize, empty_cache, current_device, device_count,
  is_available (CPU work is complete when it returns, so there is nothing to wait for);
- the backend ``"hccl"`` is fastgather (init_process_group and new_group), and the
  backend's ``get_hccl_comm_name(rank)`` gives the name the fused op takes;
- the device ``"npu"`` (``"npu:N"``, ``torch.device("npu")``, ``with torch.device("npu")``,
  f-strings that start with ``npu``) is the CPU: the script's string constants that name it
  are read as ``"cpu"`` when the script is compiled, and ``tensor.npu()`` returns the tensor.

Child processes started with multiprocessing's spawn (or forkserver) get the same: the
script's path is run the same way in them (FG_NPU_SCRIPT and PYTHONPATH carry it).
Nothing here touches the file on disk.
"""
import ast
import os
import runpy
import sys
import types

import torch
import torch.distributed as dist

import fastgather

ENV = "FG_NPU_SCRIPT"
SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_npu_site")


def _npu_namespace():
    npu = types.ModuleType("torch.npu")
    npu.__doc__ = "torch.npu on CPUs (fastgather.npu_script)"
    npu.set_device = lambda device=None: None
    npu.synchronize = lambda device=None: None
    npu.empty_cache = lambda: None
    npu.is_available = lambda: True
    npu.current_device = lambda: 0
    npu.device_count = lambda: int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    npu._fastgather = True
    return npu


def install():
    """Makes torch_npu, torch.npu and the "hccl" backend exist in this process (idempotent)."""
    if getattr(getattr(torch, "npu", None), "_fastgather", False):
        return
    npu = _npu_namespace()
    torch.npu = npu
    sys.modules["torch.npu"] = npu
    torch_npu = types.ModuleType("torch_npu")
    torch_npu.__doc__ = "torch_npu on CPUs: fastgather's fused op (fastgather.npu_script)"
    torch_npu.__version__ = "fastgather"
    torch_npu.npu = npu
    torch_npu.npu_all_gather_base_mm = fastgather.all_gather_base_mm
    sys.modules["torch_npu"] = torch_npu
    torch.Tensor.npu = lambda self, *args, **kwargs: self
    if "HCCL" not in dist.Backend._plugins:
        dist.Backend.register_backend("hccl", fastgather._create_backend, extended_api=True, devices=["cpu"])


class _NpuIsCpu(ast.NodeTransformer):
    """String constants naming the npu device become "cpu"."""

    @staticmethod
    def _names_npu(s):
        return isinstance(s, str) and (s == "npu" or s.startswith("npu:"))

    def visit_Constant(self, node):
        if self._names_npu(node.value):
            return ast.copy_location(ast.Constant("cpu"), node)
        return node

    def visit_JoinedStr(self, node):  # f"npu:{rank}"
        first = node.values[0] if node.values else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.startswith("npu:"):
            return ast.copy_location(ast.Constant("cpu"), node)
        return self.generic_visit(node)


def compile_script(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    tree = ast.fix_missing_locations(_NpuIsCpu().visit(tree))
    return compile(tree, path, "exec")


def run_path(path, init_globals=None, run_name=None):
    """runpy.run_path for the script under this shim (other paths: runpy's own)."""
    if os.path.abspath(path) != os.environ.get(ENV):
        return _runpy_run_path(path, init_globals, run_name)
    module = types.ModuleType(run_name or "<run_path>")
    module.__dict__.update(init_globals or {})
    module.__file__ = path
    module.__builtins__ = __builtins__
    if run_name:
        sys.modules[run_name] = module
    exec(compile_script(path), module.__dict__)
    return module.__dict__


_runpy_run_path = runpy.run_path


def patch_runpy():
    """multiprocessing's spawn runs the parent's __main__ in the child with runpy.run_path."""
    runpy.run_path = run_path


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    path = os.path.abspath(argv[0])
    if not os.path.isfile(path):
        print(f"fastgather.npu_script: no such script: {argv[0]}", file=sys.stderr)
        return 2
    os.environ[ENV] = path
    os.environ["PYTHONPATH"] = os.pathsep.join([SITE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    install()
    patch_runpy()
    sys.argv = [path] + argv[1:]
    sys.path.insert(0, os.path.dirname(path))
    main_module = types.ModuleType("__main__")
    main_module.__file__ = path
    main_module.__builtins__ = __builtins__
    sys.modules["__main__"] = main_module
    exec(compile_script(path), main_module.__dict__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
