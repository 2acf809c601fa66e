"""fastgather as a torch.distributed backend, with real rank processes
(workers.py), beside gloo. Run with an interpreter that imports torch 2.x
(scripts/run.sh's .venv) and fastgather (installed, or PYTHONPATH pointing at
the build's python/ folder)."""
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fg_segments():
    return {n for n in os.listdir("/dev/shm") if n.startswith("fg-")}


def run_ranks(world, name, *args, timeout=240, killed=()):
    port = free_port()
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "workers.py"), name, str(r), str(world), str(port)]
                              + [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            out += f"\n(hung: killed after {timeout} s)"
        outs.append((p.returncode, out))
    failed = [f"rank {r} exited {rc}:\n{out[-3000:]}" for r, (rc, out) in enumerate(outs)
              if rc != (-9 if r in killed else 0)]
    assert not failed, "\n".join(failed)
    return [out for _, out in outs]


@pytest.mark.parametrize("world,tp,dp", [(2, 1, 2), (4, 1, 4), (4, 2, 2)])
def test_ops_every_dtype_match_expected_and_gloo(world, tp, dp):
    run_ranks(world, "ops", tp, dp)


@pytest.mark.parametrize("world,tp,dp", [(2, 1, 2), (3, 1, 3), (4, 2, 2)])
def test_sums_every_dtype_match_expected_bits_and_gloo(world, tp, dp):
    run_ranks(world, "sums", tp, dp)


@pytest.mark.parametrize("world,tp,dp", [(2, 1, 2), (4, 1, 4), (4, 2, 2)])
def test_direct_operators_match_dist_and_gloo_and_compile(world, tp, dp):
    run_ranks(world, "direct_ops", tp, dp, timeout=600)


@pytest.mark.parametrize("world,tp,dp", [(2, 1, 2), (4, 2, 2)])
def test_fused_matmul_reduce_scatter_against_float64_and_compiled(world, tp, dp):
    run_ranks(world, "fused_rs", tp, dp, timeout=600)


@pytest.mark.parametrize("world", [2, 3])
def test_every_reduction_and_dtype_matches_the_reference_and_gloo(world):
    run_ranks(world, "reductions")


@pytest.mark.parametrize("world", [2, 3])
def test_gather_scatter_all_to_all_and_reduce_match_expected_and_gloo(world):
    run_ranks(world, "exchanges")


@pytest.mark.parametrize("world", [2, 4])
def test_dtensor_tp_defaults_and_checkpoint_save_load_match_gloo(world):
    run_ranks(world, "tp_and_checkpoint")


@pytest.mark.parametrize("world", [2, 3])
def test_all_gather_of_uneven_tensors(world):
    run_ranks(world, "uneven")


@pytest.mark.parametrize("world,tp,dp", [(2, 1, 2), (4, 2, 2)])
def test_fused_op_against_float64_reference(world, tp, dp):
    run_ranks(world, "fused", tp, dp)


@pytest.mark.parametrize("world", [2, 4])
def test_errors_raise_on_every_rank_and_the_group_stays_usable(world):
    run_ranks(world, "errors")


def test_dead_peer_raises_within_the_timeout_and_leaves_nothing():
    before = fg_segments()
    outs = run_ranks(3, "dead_peer", killed={2})  # rank 2 SIGKILLs itself
    assert "dead peer raised" in outs[0], outs[0]
    assert fg_segments() <= before, f"left in /dev/shm: {fg_segments() - before}"


@pytest.mark.parametrize("world", [2, 3])
def test_symmetric_inputs_from_fastgather_empty(world):
    run_ranks(world, "symmetric")


def test_settings_set_in_code_apply_to_the_groups_made_after():
    run_ranks(2, "settings_in_code")


def test_importing_twice_is_harmless():
    run_ranks(2, "import_twice")


@pytest.mark.parametrize("world", [2, 4])
def test_fastgather_as_the_world_backend(world):
    run_ranks(world, "world_backend")


@pytest.mark.parametrize("how", ["world_backend_env", "world_backend_cpu"])
def test_env_start_up_and_cpu_device_backend_string(how):
    run_ranks(4, how)


def test_async_work_moves_while_python_computes():
    outs = run_ranks(2, "async_overlap")
    assert "into rank 0's 50 ms matmul" in outs[0], outs[0]


@pytest.mark.parametrize("world", [2, 3])
def test_blocking_calls_run_on_the_callers_thread(world):
    run_ranks(world, "blocking_on_the_callers_thread")


@pytest.mark.parametrize("world", [2, 3])
def test_future_callbacks_that_run_collectives_finish(world):
    run_ranks(world, "future_callbacks", timeout=90)


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_defaults_and_clip_grad_norm_inf_match_gloo(world):
    run_ranks(world, "fsdp2", timeout=180)


def test_ddp_powersgd_hook_matches_gloo():
    run_ranks(2, "powersgd", timeout=120)


def test_wait_timeout_exception_and_future():
    run_ranks(2, "wait_timeout")


@pytest.mark.parametrize("world", [2, 3])
def test_coalesced_and_functional_collectives(world):
    run_ranks(world, "coalesced")


def test_torch_compile_fullgraph_of_the_fused_op():
    run_ranks(2, "compiled", timeout=600)


@pytest.mark.parametrize("world", [1, 2])
def test_none_wrong_types_foreign_and_destroyed_groups_raise(world):
    run_ranks(world, "bad_objects")


@pytest.mark.parametrize("world", [2, 3])
def test_send_recv_any_source_batch_and_objects_match_expected_and_gloo(world):
    run_ranks(world, "point_to_point", timeout=180)


def test_pipelining_gpipe_two_stages_matches_gloo():
    run_ranks(2, "pipelining", timeout=120)


@pytest.mark.parametrize("world", [2, 3])
def test_moe_all_to_all_routing_with_autograd_matches_gloo(world):
    run_ranks(world, "moe", timeout=120)


@pytest.mark.parametrize("world", [2, 4])
def test_sequence_parallel_and_loss_parallel_match_gloo(world):
    run_ranks(world, "sequence_and_loss_parallel", timeout=180)


def test_a_torch_other_than_the_one_built_against_is_named():
    """The extension loads only beside the torch release it was built against: another one is
    refused by name at import, before the extension is loaded (not an undefined symbol)."""
    code = "import torch\ntorch.__version__ = '2.99.0+cpu'\nimport fastgather\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "fastgather was built against torch" in p.stderr and "imports torch 2.99.0+cpu" in p.stderr, p.stderr
    assert "fastgather._C" not in p.stderr
    import torch
    ok = subprocess.run([sys.executable, "-c", f"import torch\ntorch.__version__ = '{torch.__version__.split('+')[0]}+other'\n"
                         "import fastgather\nprint(fastgather.BACKEND)"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout.strip() == "fastgather", ok.stderr  # the build's variant may differ
