"""Random shape and indexing operator cases for ``tests/test_ops_random.py`` (see random_ops.py)."""

from __future__ import annotations

from typing import Callable

GENERATORS: dict[str, Callable] = {}
