"""The README's Python example runs as written."""

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_example_runs():
    text = README.read_text()
    start = text.index("```python\n") + len("```python\n")
    code = text[start : text.index("```", start)]
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    out = scope["out"]
    assert out.shape == (4, 256)
    assert all(abs(float(v)) < 1e30 for v in out.reshape(-1))
