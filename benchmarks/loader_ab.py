"""Loading (``model_loader.load_model``) A/B in one process: the loader's functions as a git
revision had them (``--base``, default ``main``) against the working tree's, alternating per model
and round, in CPU time (``time.process_time_ns``), over the corpus.

    python benchmarks/loader_ab.py [--base main] [--rounds 5] [--models a,b]

The base revision's modules are loaded from ``git show`` under other names, and the functions that
differ between the two (same name, other source) are swapped into the working tree's modules for
the base's turns, so that one process times both with the same warm caches and the same load.
"""

from __future__ import annotations

import argparse
import ast
import glob
import importlib.util
import inspect
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
#: the modules of the load whose changed functions are swapped (module name, path in the repository)
MODULES = ("runtime.loader.model_loader", "runtime.loader.node_checks", "runtime.loader.guarded_inference",
           "runtime.loader.constant_initializers", "runtime.session.ep_context_model", "hal.graph")


def _base_source(rev: str, name: str) -> str:
    return subprocess.run(["git", "show", f"{rev}:{name.replace('.', '/')}.py"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout


def _base_module(name: str, source: str, rev: str):
    spec = importlib.util.spec_from_loader(f"_base_{name.replace('.', '_')}", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up there)
    exec(compile(source, f"{rev}:{name}", "exec"), module.__dict__)  # noqa: S102 - the repository's own code
    return module


def _functions(source: str) -> dict[str, str]:
    """Top-level function name -> its source text."""
    tree = ast.parse(source)
    return {n.name: ast.get_source_segment(source, n) or "" for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _swaps(rev: str) -> list[tuple[object, str, object, object]]:
    """(module, attribute, base function, working-tree function) for each top-level function whose
    source differs, and each module's import of such a function by name."""
    import importlib

    found = []
    changed = {}
    for name in MODULES:
        new = importlib.import_module(f"onnxhal.{name}")
        base_source = _base_source(rev, name)
        with open(os.path.join(ROOT, f"{name.replace('.', '/')}.py")) as f:
            ours = _functions(f.read())
        theirs = _functions(base_source)
        differ = [attr for attr, text in ours.items() if attr in theirs and theirs[attr] != text]
        if not differ:
            continue
        old = _base_module(name, base_source, rev)
        # the base functions read the working tree's module state (context variables, caches,
        # tables) and call its unchanged functions: only the changed functions differ
        for attr, value in vars(new).items():
            if attr not in differ and attr in vars(old) and not attr.startswith("__"):
                setattr(old, attr, value)
        for attr in differ:
            found.append((new, attr, getattr(old, attr), getattr(new, attr)))
            changed[getattr(new, attr)] = getattr(old, attr)
    for name in MODULES:  # ``from x import f`` copies
        new = importlib.import_module(f"onnxhal.{name}")
        for attr, fn in list(vars(new).items()):
            if inspect.isfunction(fn) and fn in changed and fn.__module__ != new.__name__:
                found.append((new, attr, changed[fn], fn))
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="main")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--models", default="")
    args = p.parse_args(argv)
    from onnxhal.runtime.loader.model_loader import load_model

    swaps = _swaps(args.base)
    print("swapped:", ", ".join(sorted({f"{m.__name__.split('.')[-1]}.{a}" for m, a, _, _ in swaps})))
    paths = sorted(glob.glob(os.path.join(ROOT, "tests", "real_models", "*.onnx")))
    if args.models:
        wanted = set(args.models.split(","))
        paths = [q for q in paths if os.path.basename(q)[:-5] in wanted]

    def use(base: bool) -> None:
        for module, attr, old, new in swaps:
            setattr(module, attr, old if base else new)

    load_before = os.getloadavg()
    rows = []
    for path in paths:
        times: dict[bool, list[int]] = {True: [], False: []}
        try:
            for base in (True, False):
                use(base)
                load_model(path)  # warm
            for _ in range(args.rounds):
                for base in (True, False):
                    use(base)
                    t = time.process_time_ns()
                    load_model(path)
                    times[base].append(time.process_time_ns() - t)
        except Exception as exc:  # noqa: BLE001 - one model failing must not hide the others
            print(f"{os.path.basename(path)}: {type(exc).__name__}: {exc}"[:160], file=sys.stderr)
            continue
        finally:
            use(False)
        rows.append((os.path.basename(path)[:-5], statistics.median(times[True]) / 1e6,
                     statistics.median(times[False]) / 1e6))
    load_after = os.getloadavg()
    for name, old, new in sorted(rows, key=lambda r: r[2] / r[1]):
        print(f"{name:28s} base {old:7.2f} ms  new {new:7.2f} ms  {(new / old - 1) * 100:+6.1f}%")
    ratios = [new / old for _, old, new in rows]
    print(f"{len(rows)} models: load sums base {sum(r[1] for r in rows):.1f} ms, new {sum(r[2] for r in rows):.1f} ms; "
          f"geometric mean new/base {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}; "
          f"load average {load_before[0]:.2f} -> {load_after[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
