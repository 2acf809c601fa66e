#!/usr/bin/env bash
# `pip install --no-build-isolation .` from this tree into a fresh target
# folder, with the interpreter given (scripts/run.sh's .venv), then the
# Python tests that start ranks from it: the installed package, not the
# build tree's, serves them.
set -euo pipefail
PY=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")  # absolute, links kept (a venv is found from its path)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=$(mktemp -d)
SRC=$(mktemp -d)
trap 'rm -rf "$TARGET" "$SRC"' EXIT
# A copy of the tracked tree: pip's build folder must not be this checkout's.
(cd "$ROOT" && git ls-files -z | tar --null -T - -cf -) | (cd "$SRC" && tar -xf -)
"$PY" -m pip install -q --no-build-isolation --no-deps --target "$TARGET" "$SRC"
cd "$TARGET"
where=$(PYTHONPATH="$TARGET" "$PY" -c "import fastgather, os; print(os.path.dirname(fastgather._C.__file__))")
[ "$where" = "$TARGET/fastgather" ] || { echo "fastgather came from $where, not $TARGET"; exit 1; }
PYTHONPATH="$TARGET" "$PY" -m pytest -q -p no:cacheprovider \
  "$ROOT/tests/python/test_torch_backend.py::test_fastgather_as_the_world_backend" \
  "$ROOT/tests/python/test_torch_backend.py::test_async_work_moves_while_python_computes" \
  "$ROOT/tests/python/test_npu_script.py::test_original_script_runs_unedited"
