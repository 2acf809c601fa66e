"""What the engine tests share: the tools' folder and a tiny model made once per session."""
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools" / "llm-bench"
sys.path.insert(0, str(TOOLS))

import make_model  # noqa: E402
from hf_generate import free_port  # noqa: E402,F401  (the tests' ports, as the tool takes its own)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return make_model.make_model(str(tmp_path_factory.mktemp("tiny")), "tiny", "bfloat16")
