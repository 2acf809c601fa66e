"""fastgather for vLLM: one setting, ``FG_VLLM=1``, makes vLLM's CPU parallel groups use fastgather.

``pip install`` of fastgather in a vLLM CPU environment installs this module as a
``vllm.general_plugins`` entry point; vLLM calls ``register()`` in each of its processes (the
engine's and every worker's, spawned or forked). Without the setting it does nothing and imports
nothing: vLLM runs as it would without fastgather installed. With ``FG_VLLM=1``:

- ``CpuPlatform.dist_backend`` becomes ``"fastgather"``: vLLM's world and every device group
  (tensor, pipeline, data, expert parallel) are fastgather groups (its CPU-side groups stay gloo);
- vLLM's CPU communicator becomes ``fastgather_vllm.communicator.FastgatherCommunicator``, which
  sends the per-token all_reduce, all_gather and reduce_scatter to the direct operators
  (``torch.ops.fastgather.*``: no ``torch.distributed`` layer, no Work), and everything else through
  torch.distributed on the fastgather group.

Errors are raised where vLLM calls the plugin, so a setup that cannot work stops vLLM with the reason
instead of running on gloo unnoticed: a value other than 0 or 1, a platform other than the CPU, a
fastgather that cannot be imported in this process (not installed in the worker's environment, or
built against another torch).
"""
import os

SETTING = "FG_VLLM"


def enabled():
    """Whether ``FG_VLLM`` asks for fastgather; ValueError for a value that is neither 0 nor 1."""
    value = os.environ.get(SETTING, "").strip()
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    raise ValueError(f"fastgather: {SETTING}={value!r}: set {SETTING}=1 to run vLLM's CPU parallel groups on "
                     f"fastgather, or unset it (or 0) for vLLM's own choice")


def register():
    """vLLM's entry point (``vllm.general_plugins``); harmless to call more than once."""
    if not enabled():
        return
    from vllm.platforms import current_platform

    platform = type(current_platform)
    if getattr(platform, "_fastgather", False):
        return
    if not current_platform.is_cpu():
        raise RuntimeError(f"fastgather: {SETTING}=1 but vLLM runs on {platform.__name__} "
                           f"(device {current_platform.device_name!r}): fastgather serves vLLM's CPU platform "
                           f"only; unset {SETTING}")
    try:
        import fastgather  # noqa: F401  (registers the torch.distributed backend "fastgather")
    except Exception as e:  # ImportError, or OSError/RuntimeError from an extension built for another torch
        import torch
        raise RuntimeError(f"fastgather: {SETTING}=1 but fastgather cannot be imported in this vLLM process "
                           f"(torch {torch.__version__}): {type(e).__name__}: {e}. Install fastgather in this "
                           f"environment, built against its torch (pip install --no-build-isolation fastgather), "
                           f"or unset {SETTING}") from e
    platform.dist_backend = fastgather.BACKEND
    platform.get_device_communicator_cls = classmethod(
        lambda cls: "fastgather_vllm.communicator.FastgatherCommunicator")
    platform._fastgather = True
