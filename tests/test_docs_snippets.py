"""Every ``bash`` and ``python`` code block in README.md and docs/*.md runs as it is written, unless
it says why not.

Each such block carries an HTML comment on the line before it: ``<!-- not-run: reason -->`` for a
block that cannot run as pasted (a placeholder for the reader's own application or files, a system
install, a signature), or ``<!-- runnable -->``, optionally followed by ``: `` and space-separated
words: ``KEY=VALUE`` (an
environment variable for this block), ``needs-opencl`` (skipped, with the probe's verdict, where no
OpenCL device works), ``file=PATH`` (write the block to PATH instead of running it, for a later
block to use). The blocks of one file run in order in one scratch folder that holds ``model.onnx``
(``onnxhal.demo_models.demo_model()``), with the ``onnxhal`` command of this environment on PATH.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import pytest

from onnxhal.demo_models import demo_model

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_MARKER = re.compile(r"^<!-- runnable(?::\s*(?P<words>[^>]*?))?\s*-->\s*\n```(?P<lang>bash|python)\n(?P<code>.*?)^```",
                     re.M | re.S)


@dataclass
class Snippet:
    path: Path
    line: int
    lang: str
    code: str
    env: dict[str, str] = field(default_factory=dict)
    needs_opencl: bool = False
    file: str = ""


def snippets(path: Path) -> list[Snippet]:
    text = path.read_text()
    out = []
    for m in _MARKER.finditer(text):
        s = Snippet(path, text.count("\n", 0, m.start("code")) + 1, m["lang"], m["code"])
        for word in (m["words"] or "").split():
            if word == "needs-opencl":
                s.needs_opencl = True
            elif word.startswith("file="):
                s.file = word[len("file="):]
            elif "=" in word:
                key, value = word.split("=", 1)
                s.env[key] = value
            else:
                raise ValueError(f"{path.name}:{s.line}: unknown runnable marker word {word!r}")
        out.append(s)
    return out


def _run(s: Snippet, cwd: Path) -> None:
    where = f"{s.path.relative_to(ROOT)}:{s.line}"
    if s.file:
        target = cwd / s.file
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(s.code)
        return
    env = {k: v for k, v in os.environ.items() if k not in ("ONNXHAL_SIMULATE", "COLUMNS")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update(s.env)
    cmd = ["bash", "-euo", "pipefail", "-c", s.code] if s.lang == "bash" else [sys.executable, "-c", s.code]
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{where} ({s.lang}) failed:\n{s.code}\n--- stdout\n{out.stdout[-3000:]}\n" \
                                f"--- stderr\n{out.stderr[-3000:]}"


MARKED = [p for p in DOCS if snippets(p)]
_FENCE = re.compile(r"^```(?P<lang>[\w+-]*)[^\n]*\n.*?^```", re.M | re.S)
_NOT_RUN = re.compile(r"^<!-- not-run: \S.*-->$")
_SHELL_OR_PYTHON = {"bash", "sh", "shell", "console", "python", "py", "python3", "pycon"}


def test_every_bash_and_python_block_runs_or_says_why_not():
    """A new block is run by the test above unless its marker says why it cannot be."""
    unmarked = []
    for path in DOCS:
        text = path.read_text()
        for m in _FENCE.finditer(text):
            if m["lang"] not in _SHELL_OR_PYTHON:
                continue
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            if not (before.startswith("<!-- runnable") or _NOT_RUN.match(before)):
                unmarked.append(f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}")
    assert not unmarked, "blocks with neither <!-- runnable --> nor <!-- not-run: reason -->: " + ", ".join(unmarked)


@pytest.mark.parametrize("path", MARKED, ids=[str(p.relative_to(ROOT)) for p in MARKED])
def test_runnable_snippets_run(path, tmp_path):
    onnx.save(demo_model(), tmp_path / "model.onnx")
    skipped = []
    for s in snippets(path):
        if s.needs_opencl:
            from tests.opencl_support import opencl_verdict

            index, reason = opencl_verdict()
            if index is None:
                skipped.append(f"line {s.line}: {reason}")
                continue
        _run(s, tmp_path)
    if skipped:
        pytest.skip(f"needs a working OpenCL device: {'; '.join(skipped)}")


def test_the_documents_mark_their_snippets():
    """README, the CI guide, devices, memory, OpenCL and simulators pages each carry runnable blocks."""
    names = {p.relative_to(ROOT).as_posix() for p in MARKED}
    assert {"README.md", "docs/ci-simulation.md", "docs/devices.md", "docs/memory.md", "docs/opencl.md",
            "docs/simulators.md"} <= names
    assert sum(len(snippets(p)) for p in MARKED) >= 12


def test_no_document_installs_a_package_that_is_not_on_the_index():
    """onnxhal is installed from a clone, a local path or a built wheel, never by name."""
    by_name = re.compile(r"pip install\s+(?:--?\S+\s+)*[\"']?onnxhal(?:\[[^\]]*\])?[\"']?(?=\s|$|`)")
    bad = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in DOCS
           for n, line in enumerate(p.read_text().splitlines(), 1) if by_name.search(line)]
    assert not bad, "\n".join(bad)


def test_the_readme_keeps_its_first_two_commands():
    """CI runs them: they must stay as they are, and .ci/run runs the README's test command as written."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("```bash")
    assert lines[start + 1].startswith("pip install -e . && onnxhal demo ")
    assert lines[start + 2].startswith('pip install -e ".[test]" && pytest -q ')
    command = lines[start + 2].split("#")[0].strip()
    assert f"{command} || status=$?" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_runs_fix_shapes_as_it_shows_it():
    """The README's fix-shapes example runs as written, on a model it makes with a symbolic dimension."""
    readme = ROOT / "README.md"
    runnable = [s.code for s in snippets(readme) if s.lang == "bash"]
    assert any("onnxhal fix-shapes" in code and "--dim batch=1" in code for code in runnable)
    lines = [line for line in readme.read_text().splitlines() if "fix-shapes" in line and "--dim batch=" in line]
    assert all("model.onnx" not in line for line in lines), lines  # model.onnx, the README's model, has none
