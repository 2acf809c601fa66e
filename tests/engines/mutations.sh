#!/usr/bin/env bash
# The engine plugins' mutation checks (scripts/run.sh's engines phase): each test named must FAIL
# when the code it guards is broken as stated. The installed packages (fastgather, fastgather_vllm)
# are copied to a folder put first on PYTHONPATH (so that vLLM's workers and the test's ranks import
# the copy too), one mutation applied to the copy at a time, and the test run against it.
#   tests/engines/mutations.sh PYTHON   (the engines venv's interpreter, fastgather pip-installed)
set -euo pipefail
PY=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")  # absolute (the tests run from tests/engines), links kept
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SITE=$("$PY" -c "import fastgather, os; print(os.path.dirname(os.path.dirname(fastgather.__file__)))")
cp -r "$SITE/fastgather" "$SITE/fastgather_vllm" "$WORK/"
find "$WORK" -name __pycache__ -prune -exec rm -rf {} +
# name | file (in the package) | perl substitution | pytest node (tests/engines/...)
MUTATIONS=(
  "the plugin leaves vLLM's backend gloo|fastgather_vllm/__init__.py|s/    platform\.dist_backend = fastgather\.BACKEND\n//|test_vllm.py::test_plugin_off_imports_nothing_on_registers_once"
  "the plugin acts without FG_VLLM|fastgather_vllm/__init__.py|s/    if value in \(\x22\x22, \x220\x22\):\n        return False/    if value in (\x22\x22, \x220\x22):\n        return True/|test_vllm.py::test_plugin_off_imports_nothing_on_registers_once"
  "the plugin lets a broken fastgather pass|fastgather_vllm/__init__.py|s/    except Exception as e:  # ImportError/    except ZeroDivisionError as e:  # ImportError/|test_vllm.py::test_plugin_bad_setups_say_why"
  "vLLM's all_reduce goes through torch.distributed|fastgather_vllm/communicator.py|s/torch\.ops\.fastgather\.all_reduce_\(input_, \x22sum\x22, self\._handle\)/torch.distributed.all_reduce(input_, group=self.device_group)/|test_vllm.py::test_communicator_sends_each_per_token_collective_to_the_direct_operators[2-bfloat16]"
  "vLLM's all_gather along a later dimension keeps the rows' order|fastgather_vllm/communicator.py|s/\.movedim\(0, dim\)/.movedim(0, 0)/|test_vllm.py::test_communicator_sends_each_per_token_collective_to_the_direct_operators[2-bfloat16]"
  "vLLM's reduce_scatter along a later dimension scatters rows|fastgather_vllm/communicator.py|s/x = input_\.movedim\(dim, 0\) if dim else input_/x = input_/|test_vllm.py::test_communicator_sends_each_per_token_collective_to_the_direct_operators[3-float32]"
  "FG_VLLM_TIMES counts no call|fastgather_vllm/communicator.py|s/times\[\x22calls\x22\] \+= 1/times[\x22calls\x22] += 0/|test_vllm.py::test_communicator_sends_each_per_token_collective_to_the_direct_operators[3-float32]"
  "DeepSpeed's inference_all_reduce is left where it went|fastgather/__init__.py|s/    backend_cls\.inference_all_reduce = inference_all_reduce\n//|test_hf_deepspeed.py::test_serve_deepspeed_sums_fastgather_groups_on_the_direct_operator"
  "DeepSpeed's other reductions are summed too|fastgather/__init__.py|s/if h is None or op not in \(DsReduceOp\.SUM, dist\.ReduceOp\.SUM\):/if h is None:/|test_hf_deepspeed.py::test_serve_deepspeed_sums_fastgather_groups_on_the_direct_operator"
)
run() { (cd "$ROOT/tests/engines" && PYTHONPATH="$WORK${PYTHONPATH:+:$PYTHONPATH}" timeout 900 "$PY" -m pytest -q -x -p no:cacheprovider "$1") >"$WORK/run.log" 2>&1; }
caught=0 missed=0
for m in "${MUTATIONS[@]}"; do
  IFS='|' read -r name file subst node <<<"$m"
  run "$node" || { echo "FAILED: $node fails unmutated"; tail -30 "$WORK/run.log"; exit 1; }
done
for m in "${MUTATIONS[@]}"; do
  IFS='|' read -r name file subst node <<<"$m"
  cp "$WORK/$file" "$WORK/$file.orig"
  perl -0pi -e "$subst" "$WORK/$file"
  if cmp -s "$WORK/$file" "$WORK/$file.orig"; then
    echo "FAILED: mutation '$name' no longer applies to $file (update tests/engines/mutations.sh)"; missed=$((missed + 1))
  elif run "$node"; then
    echo "FAILED: '$name' ($file) is not caught by $node"; missed=$((missed + 1))
  else
    echo "ok: '$name' is caught by $node"; caught=$((caught + 1))
  fi
  mv "$WORK/$file.orig" "$WORK/$file"
  find "$WORK" -name __pycache__ -prune -exec rm -rf {} +
done
echo "engine mutations: $caught passed, $missed failed"
[ "$missed" = 0 ]
