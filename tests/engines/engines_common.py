"""What the engine tests share: the tools' folder and a tiny model made once per session."""
import pathlib
import socket
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools" / "llm-bench"
sys.path.insert(0, str(TOOLS))

import make_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return make_model.make_model(str(tmp_path_factory.mktemp("tiny")), "tiny", "bfloat16")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
