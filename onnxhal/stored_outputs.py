"""Reading a model's stored inputs and reference outputs: ``MODEL.npz`` beside ``MODEL.onnx``, the
layout of ``tests/real_models`` (written by its ``make_corpus.py``'s ``save_outputs``).

Per signature ``s``: ``s.NAME`` an input; a map input as ``s.NAME.__map_keys`` and
``s.NAME.__map_values``; ``s.__output``, ``s.__output.1`` ... onnxruntime's outputs in order; a
sequence of maps (ZipMap) stored as the matrix of its values (a row per map) with its keys in
``s.__keys.N``. The sweep (``onnxhal.sweep``), the corpus tests and the benchmarks read it here.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

#: One signature: (feeds by input name, reference outputs in order as (array, ZipMap keys or None)).
Signature = tuple[dict[str, Any], list[tuple[np.ndarray, np.ndarray | None]]]


def stored_path(model_path: str | os.PathLike) -> str:
    """Where ``model_path``'s stored inputs and outputs are (whether or not they exist)."""
    return os.path.splitext(os.fspath(model_path))[0] + ".npz"


def read_signatures(model_path: str | os.PathLike) -> dict[str, Signature]:
    """Every stored signature of the model, by name ("a", "b", ...)."""
    data = np.load(stored_path(model_path))
    feeds: dict[str, dict[str, Any]] = {}
    outputs: dict[str, dict[int, np.ndarray]] = {}
    keys: dict[str, dict[int, np.ndarray]] = {}
    for key in data.files:
        sig, arg = key.split(".", 1)
        feeds.setdefault(sig, {})
        if arg.startswith("__output") or arg.startswith("__keys"):
            index = int(arg.split(".")[1]) if "." in arg else 0
            (outputs if arg.startswith("__output") else keys).setdefault(sig, {})[index] = data[key]
        elif arg.endswith(".__map_keys"):  # a map input (DictVectorizer): its keys, then its values
            name = arg[:-len(".__map_keys")]
            feeds[sig][name] = dict(zip(data[key].tolist(), data[f"{sig}.{name}.__map_values"].tolist()))
        elif not arg.endswith(".__map_values"):
            feeds[sig][arg] = data[key]
    return {s: (f, [(outputs[s][i], keys.get(s, {}).get(i)) for i in sorted(outputs.get(s, {}))])
            for s, f in feeds.items()}
