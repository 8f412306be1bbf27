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

from onnxhal.runtime.providers.path_tables import PATH_TABLES, KernelPath, PathTable, path_table

__all__ = ["PATH_TABLES", "KernelPath", "PathTable", "all_paths", "path_table"]


def all_paths() -> Iterator[tuple[str, KernelPath]]:
    """(kernel, path) for every registered path, the numerics module's included."""
    from onnxhal.runtime.providers.cpu.kernels import (  # noqa: F401 - they fill PATH_TABLES
        activation,
        conv,
        conv3d,
        dead_taps,
        fused,
        fused_conv,
        gather_nd,
        grid_sample,
        ml_svm,
        ml_trees,
        numerics,
        onnx_attention,
        pad_indices,
        pooling,
        quantize,
        recurrent,
        reduction,
        resize,
        rms_group_norm,
        scatter,
        signal,
        tfidf_vectorizer,
        tokenizer,
    )
    from onnxhal.runtime.providers.opencl import native_replay  # noqa: F401 - the OpenCL EP's replay paths

    for kernel, table in PATH_TABLES.items():
        for path in table.values():
            yield kernel, path
    for fp in numerics.FAST_PATHS.values():
        yield f"numerics.{fp.canonical}", KernelPath(fp.name, fp.condition)
