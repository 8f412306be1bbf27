"""Named kernel paths: for each kernel (or family) with more than one way to run, a table of those
ways, each with the condition that selects it in words, and the canonical form the others are
tested against. The tables live here, below every EP, so the CPU EP's kernels and the OpenCL EP's
replay register in one ``PATH_TABLES``; ``cpu.kernels.kernel_paths.all_paths()`` lists them all."""

from __future__ import annotations

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
