"""The plugin bridge's tests on every onnxruntime release: one virtual environment per version (kept
under ``--venvs``, made on first use with that onnxruntime and this checkout installed editable), the
bridge's test files run in each, a table of the results.

    python benchmarks/ort_versions.py [--versions 1.23.2,1.24.4,...] [--venvs ~/.cache/onnxhal/ort-venvs]

Default versions: every onnxruntime release from 1.23 (the first with plugin EP libraries) that
this script knows of; pass ``--versions`` for others. CI runs the suite on the newest only.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSIONS = ["1.23.2", "1.24.4", "1.25.1", "1.26.0", "1.27.0", "1.28.0", "1.29.0", "1.30.0", "1.31.1", "1.32.0"]
TESTS = ["tests/test_ort_plugin.py", "tests/test_ort_plugin_control_flow.py", "tests/test_ort_plugin_late_hooks.py",
         "tests/test_ort_plugin_capture.py"]


def venv_for(version: str, base: Path) -> Path:
    """The virtual environment for ``version``, made (with onnxruntime and onnxhal) if missing."""
    env = base / f"ort{version.replace('.', '')}"
    python = env / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"onnxruntime=={version}", "pytest"], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", str(ROOT)], check=True)
    where = subprocess.run([str(python), "-c", "import onnxhal.runtime.env.environment as e; print(e.__file__)"],
                           capture_output=True, text=True).stdout.strip()
    if not where.startswith(str(ROOT)):  # an environment made for another checkout: point it at this one
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)], check=True)
    return python


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--versions", default=",".join(VERSIONS))
    p.add_argument("--venvs", default=os.path.expanduser("~/.cache/onnxhal/ort-venvs"))
    args = p.parse_args(argv)
    base = Path(args.venvs)
    base.mkdir(parents=True, exist_ok=True)
    rows = []
    for version in args.versions.split(","):
        python = venv_for(version, base)
        done = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS], cwd=ROOT,
                              capture_output=True, text=True)
        last = (done.stdout.strip().splitlines() or ["no output"])[-1]
        counts = dict((k, int(n)) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", last))
        # pytest that ends without running a test (an error at collection, exit 3, 4 or 5) did not
        # test this version: it counts as failed, whatever its last line says
        ran = done.returncode in (0, 1) and counts.get("passed", 0) + counts.get("failed", 0) > 0
        rows.append((version, counts.get("passed", 0), counts.get("failed", 0) + counts.get("error", 0),
                     counts.get("skipped", 0), ran))
        print(f"onnxruntime {version}: {last}" + ("" if ran else f" (pytest exit {done.returncode}: nothing tested)"),
              flush=True)
        if not ran:
            print(done.stdout[-2000:] + done.stderr[-2000:], file=sys.stderr)
        for line in done.stdout.splitlines():  # which tests, so a failure that does not repeat is still named
            if line.startswith(("FAILED ", "ERROR ")):
                print(f"  {line}", flush=True)
    print(f"\n{'onnxruntime':<12}{'passed':>8}{'failed':>8}{'skipped':>9}")
    for version, passed, failed, skipped, ran in rows:
        print(f"{version:<12}{passed:>8}{failed:>8}{skipped:>9}" + ("" if ran else "  not tested"))
    bad = [r[0] for r in rows if r[2] or not r[4]]
    if bad:
        print(f"ort_versions: the bridge's tests failed or did not run on onnxruntime {', '.join(bad)}",
              file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
