"""The CPU kernels' named paths: for each kernel (or family) with more than one way to run, a table
of those ways, each with the condition that selects it in words, and the canonical form the others
are tested against. Every table is listed in ``PATH_TABLES``, so one place shows every fast path
the CPU EP holds (``onnxhal.runtime.providers.cpu.kernels.kernel_paths.all_paths()``) and
tests/test_kernel_paths.py checks that a test names each one.

The numerics module's fast paths (softmax, erf, rounding) carry more than a condition (the inputs
they take, their tolerance) and keep their own ``numerics.FAST_PATHS``; ``all_paths`` lists them
too. The OpenCL EP's replay paths (``opencl/native_replay.py``) are listed here as well."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelPath:
    """One way a kernel runs, and when it takes it."""

    name: str
    condition: str  #: when the kernel takes it, in words


class PathTable(dict[str, KernelPath]):
    """A kernel's paths by name, in the order the kernel tries them."""

    def __init__(self, kernel: str, canonical: str) -> None:
        super().__init__()
        self.kernel = kernel  #: the kernel (module.function or op) whose paths these are
        self.canonical = canonical  #: what every path is held to, in words

    def add(self, name: str, condition: str) -> str:
        """Register path ``name``; returns the name (for a module constant)."""
        if name in self:
            raise ValueError(f"{self.kernel}: path {name!r} registered twice")
        self[name] = KernelPath(name, condition)
        return name


#: Every table, by kernel.
PATH_TABLES: dict[str, PathTable] = {}


def path_table(kernel: str, canonical: str) -> PathTable:
    """A new table for ``kernel``, listed in ``PATH_TABLES``."""
    table = PATH_TABLES[kernel] = PathTable(kernel, canonical)
    return table


def all_paths() -> Iterator[tuple[str, KernelPath]]:
    """(kernel, path) for every registered path, the numerics module's included."""
    from onnxhal.runtime.providers.cpu.kernels import (  # noqa: F401 - they fill PATH_TABLES
        conv,
        dead_taps,
        fused,
        fused_conv,
        ml_svm,
        ml_trees,
        numerics,
        recurrent,
        tfidf_vectorizer,
        tokenizer,
    )
    from onnxhal.runtime.providers.opencl import native_replay  # noqa: F401 - the OpenCL EP's replay paths

    for kernel, table in PATH_TABLES.items():
        for path in table.values():
            yield kernel, path
    for fp in numerics.FAST_PATHS.values():
        yield f"numerics.{fp.canonical}", KernelPath(fp.name, fp.condition)
