# Loaded at start-up by processes that fastgather.npu_script's script spawns
# (its folder is on their PYTHONPATH): the same shim in them as in the parent.
import os

if os.environ.get("FG_NPU_SCRIPT"):
    from fastgather import npu_script

    npu_script.install()
    npu_script.patch_runpy()
