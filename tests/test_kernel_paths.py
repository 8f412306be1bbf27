"""Every named path of the CPU kernels (``kernel_paths.all_paths()``: the path tables and the
numerics module's fast paths) has a condition in words and is named by a test, the test that
reaches it directly and holds it to its canonical form."""

from __future__ import annotations

import re
from pathlib import Path

from onnxhal.runtime.providers.cpu.kernels.kernel_paths import PATH_TABLES, all_paths

TESTS = Path(__file__).resolve().parent


def test_every_path_has_a_condition_and_a_canonical_form():
    paths = list(all_paths())
    assert len(paths) >= 30, paths  # the tables are filled by their modules' import
    for kernel, path in paths:
        assert path.condition.strip(), f"{kernel}: path {path.name!r} says nothing of when it is taken"
    for kernel, table in PATH_TABLES.items():
        assert table.canonical.strip(), f"{kernel}: no canonical form named"


def test_every_path_is_named_by_a_test():
    """A table's path is named by a test as a string or in a test's name; the numerics module's are
    all run by test_numerics, which takes every entry of ``numerics.FAST_PATHS``."""
    files = {p.name: p.read_text() for p in TESTS.glob("test_*.py") if p.name != Path(__file__).name}
    text = "\n".join(files.values())
    assert 'parametrize("name", sorted(FAST_PATHS))' in files["test_numerics.py"]
    unnamed = [f"{kernel}: {path.name}" for kernel, path in all_paths() if not kernel.startswith("numerics.")
               and not re.search(rf"[\"']{path.name}[\"']|def test_\w*{path.name}", text)]
    assert not unnamed, ("paths no test names (add a test that reaches each and compares it with the "
                         f"canonical form): {unnamed}")
