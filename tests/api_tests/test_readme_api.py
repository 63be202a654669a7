"""The README's Python API example runs as written (on a small generated trace)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.api_tests.conftest import write_trace_csv

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_python_api_example_runs(tmp_path: Path, monkeypatch) -> None:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Python API") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    trace = write_trace_csv(tmp_path / "AzureLLMInferenceTrace_conv.csv", n=120)
    monkeypatch.chdir(tmp_path)  # the example's relative paths land here
    assert trace.exists()
    printed: list[str] = []
    namespace = {"print": lambda *a: printed.append(" ".join(map(str, a)))}
    exec(compile(code, "README.md", "exec"), namespace)
    assert printed[0].startswith("TTFT p90 ") and "attainment" in printed[0]
    assert printed[1].startswith("CUDA_VISIBLE_DEVICES=0 "), printed[1]  # runs as pasted
    assert " vllm serve " in printed[1] or " python -m sglang" in printed[1], printed[1]
    assert namespace["outcome"].num_trials == 10
