"""The layering rules of docs/architecture.md, checked on the source with ``ast``.

- No private name crosses a module: no ``from X import _name`` and no ``obj._attr`` read or write
  where ``_attr`` is not defined in the module doing it (``self._x``, ``cls._x`` and
  ``super()._x`` are the class's own business). What remains is in ``ALLOWED``, each with why.
- Imports point down the layers: ``hal`` imports neither ``runtime`` nor ``simulators``, and
  ``devices`` does not import ``runtime``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
#: source folder -> the package it installs as (pyproject's package-dir)
PACKAGES = {"hal": "onnxhal.hal", "devices": "onnxhal.devices", "runtime": "onnxhal.runtime",
            "simulators": "onnxhal.simulators", "onnxhal": "onnxhal"}

#: (file relative to the repository, the private name) -> why it stays
ALLOWED: dict[tuple[str, str], str] = {
    ("runtime/providers/opencl/device_context.py", "_cl"): (
        "pyopencl's public Program(context, source).build() keeps a second on-disk cache of its own and "
        "writes the source to a temporary file on a failed build; only its private _cl._Program builds "
        "without both"),
    ("runtime/providers/opencl/device_context.py", "_Program"): "the same (pyopencl's unbuilt program class)",
    ("runtime/providers/opencl/device_context.py", "_build"): "the same (building that private program)",
    ("runtime/session/fp_errors.py", "_extobj_contextvar"): (
        "numpy has no public call to read and set the floating-point error state of the current context "
        "cheaply; np.errstate costs more than the small kernels it would wrap"),
    ("runtime/session/fp_errors.py", "_make_extobj"): "the same (numpy's error-state object)",
    ("runtime/providers/cpu/kernels/native_kernels.py", "_native"): (
        "the optional C extension (_native.c) is imported by the one module that fronts it: native_kernels "
        "gives the kernels its public entry (native_module) and the switch"),
    ("runtime/providers/opencl/native_replay.py", "_replay"): (
        "the OpenCL EP's optional C extension (_replay.c) is imported by the one module that fronts it: "
        "native_replay gives partition_plan its public entry (replay_module) and the switch"),
}


@dataclass(frozen=True)
class Crossing:
    path: str
    line: int
    name: str
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what} {self.name}"


def _sources() -> list[Path]:
    out = []
    for folder in PACKAGES:
        out += [p for p in sorted((ROOT / folder).rglob("*.py")) if "ort_source" not in p.parts]
    return out


def _private(name: str) -> bool:
    """``_x``; not dunder names and not enum's ``_sunder_`` ones (``_value_``, ``_name_``)."""
    return name.startswith("_") and not name.endswith("_")


def _defined_here(tree: ast.Module) -> set[str]:
    """The private attribute names a module defines itself: those it assigns on ``self``/``cls``,
    the names in its class bodies (methods, class attributes) and its ``__slots__`` entries. A
    module-level function or variable is not an attribute:
    ``other._f`` with a module-level ``_f`` still reaches into ``other``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(item.name)
                elif isinstance(item, ast.Assign):
                    names.update(t.id for t in item.targets if isinstance(t, ast.Name))
                    if any(isinstance(t, ast.Name) and t.id == "__slots__" for t in item.targets):
                        names.update(c.value for c in ast.walk(item.value)
                                     if isinstance(c, ast.Constant) and isinstance(c.value, str))
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _own(node.value):
            names.add(node.attr)
    return names


def _own(value: ast.expr) -> bool:
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


def crossings() -> list[Crossing]:
    found = []
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(), rel)
        local = _defined_here(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if _private(alias.name):
                        found.append(Crossing(rel, node.lineno, alias.name, f"from {node.module} import"))
            elif isinstance(node, ast.Attribute) and _private(node.attr) and not _own(node.value) \
                    and node.attr not in local:
                what = "writes" if isinstance(node.ctx, ast.Store) else "reads"
                found.append(Crossing(rel, node.lineno, node.attr, what))
    return found


def test_no_private_name_crosses_a_module() -> None:
    bad = [c for c in crossings() if (c.path, c.name) not in ALLOWED]
    assert not bad, "private names used across modules (give them a public entry point):\n" + \
        "\n".join(map(str, bad))


def test_allow_list_is_current() -> None:
    """Each allowed entry still occurs: a fixed crossing leaves the list."""
    seen = {(c.path, c.name) for c in crossings()}
    stale = [k for k in ALLOWED if k not in seen]
    assert not stale, f"allow-list entries that no longer occur, remove them: {stale}"


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def _upward_imports(folder: Path, forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for path in sorted(folder.rglob("*.py")):
        for line, module in _imports(path):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.name}:{line}: imports {module}")
    return bad


@pytest.mark.parametrize(("folder", "forbidden"), [
    ("hal", ("onnxhal.runtime", "onnxhal.simulators")),
    ("devices", ("onnxhal.runtime", "onnxhal.simulators")),
    # the OpenCL EP runs a graph on the host through hal.host_execution, not the CPU EP's modules
    ("runtime/providers/opencl", ("onnxhal.runtime.providers.cpu", "onnxhal.runtime.session.executor",
                                  "onnxhal.runtime.session.inference_session", "onnxhal.simulators")),
])
def test_imports_point_down(folder: str, forbidden: tuple[str, ...]) -> None:
    bad = _upward_imports(ROOT / folder, forbidden)
    assert not bad, f"{folder}/ imports a layer above it:\n" + "\n".join(bad)


def test_an_upward_import_is_seen(tmp_path: Path) -> None:
    """Also one inside a function (a lazy import is still a dependency)."""
    (tmp_path / "m.py").write_text("def f():\n    from onnxhal.runtime.env.environment import get_environment\n")
    assert _upward_imports(tmp_path, ("onnxhal.runtime",)) == ["m.py:2: imports onnxhal.runtime.env.environment"]


def test_the_scanner_sees_a_crossing(tmp_path: Path) -> None:
    """The rule itself: a private import and a write to another module's private attribute are
    found; self._x and a module's own private names are not."""
    src = ("from onnxhal.runtime.env.environment import _load_module\n"
           "class A:\n    def __init__(self):\n        self._mine = 1\n"
           "    def f(self, other):\n        other._mine = 2\n        return self._mine\n"
           "def g(so):\n    so._config['x'] = 1\n")
    tree = ast.parse(src)
    local = _defined_here(tree)
    hits = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and _private(n.attr)
            and not _own(n.value) and n.attr not in local]
    imports = [a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names if _private(a.name)]
    assert hits == ["_config"] and imports == ["_load_module"]


def test_host_execution_runs_a_graph_on_the_host() -> None:
    """The service EPs use instead of the CPU EP's modules: provided once the engine is imported."""
    from onnx import TensorProto, helper

    import onnxhal.runtime  # noqa: F401 - provides the service
    from onnxhal.hal import Graph
    from onnxhal.hal.host_execution import host_plan

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["y"], ["z"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [3])])
    graph = Graph.from_proto(g, {"": 17})
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    assert np.array_equal(host_plan(graph).run({"x": x})[0], -np.maximum(x, 0))
    y, = host_plan(graph, ["y"]).run({"x": x})
    assert np.array_equal(y, np.maximum(x, 0))


def _opencl_ep_classes(cls: type) -> list[str]:
    """The OpenCL EP's Ep and EpFactory classes among ``cls``'s bases (its MRO)."""
    from onnxhal.hal.ep import Ep, EpFactory

    return [f"{base.__module__}.{base.__qualname__}" for base in cls.__mro__[1:]
            if base.__module__.startswith("onnxhal.runtime.providers.opencl") and issubclass(base, (Ep, EpFactory))]


def test_simulators_hold_the_opencl_backend_not_subclass_the_opencl_ep() -> None:
    """A simulated device is the OpenCL backend under a profile: its EP and factory hold what they
    use of the OpenCL package (``OpenCLBackend``), so neither the OpenCL EP nor its factory carries
    a branch or a hook for the simulators."""
    import importlib
    import inspect
    import pkgutil

    pytest.importorskip("pyopencl")
    import onnxhal.simulators as simulators

    bad = []
    for info in pkgutil.iter_modules(simulators.__path__, "onnxhal.simulators."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and _opencl_ep_classes(cls):
                bad.append(f"{cls.__module__}.{cls.__qualname__} subclasses {', '.join(_opencl_ep_classes(cls))}")
    assert not bad, "simulator classes that subclass an OpenCL EP class (hold an OpenCLBackend instead):\n" + \
        "\n".join(bad)


def test_the_subclass_check_sees_a_subclass() -> None:
    pytest.importorskip("pyopencl")
    from onnxhal.runtime.providers.opencl.ep import OpenCLEp
    from onnxhal.runtime.providers.opencl.factory import OpenCLEpFactory

    class Sub(OpenCLEp):
        pass

    class SubFactory(OpenCLEpFactory):
        pass

    assert _opencl_ep_classes(Sub) == ["onnxhal.runtime.providers.opencl.ep.OpenCLEp"]
    assert _opencl_ep_classes(SubFactory) == ["onnxhal.runtime.providers.opencl.factory.OpenCLEpFactory"]
    assert _opencl_ep_classes(OpenCLEp) == []
