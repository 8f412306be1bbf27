"""Finds or builds the bridge's shared library (``bridge.c``) that onnxruntime loads.

``pip install`` builds it with the package (a setuptools extension, optional so that an install
without a compiler still succeeds). When that build is missing, the first ``library_path()`` call
compiles it with the C compiler into onnxhal's cache folder, keyed by the source's hash; with no
compiler it raises ``Fail`` naming the remedy.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path

from onnxhal.hal.errors import Fail

SOURCE = Path(__file__).resolve().parent / "bridge.c"
#: The extension's module name in pyproject.toml (the file carries Python's suffix for extensions).
EXTENSION_STEM = "_bridge"
CACHE_ENV = "ONNXHAL_CACHE_DIR"


def installed_library() -> Path | None:
    """The library ``pip install`` built next to this file, if it is there and matches bridge.c."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    built = SOURCE.parent / f"{EXTENSION_STEM}{suffix}"
    if built.is_file() and built.stat().st_mtime >= SOURCE.stat().st_mtime:
        return built
    return None


def _cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "onnxhal")
    return Path(root) / "ort_bridge"


def compiler() -> str | None:
    """The C compiler to use: $CC, else cc, gcc or clang on PATH."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc.split()[0]) and cc
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return name
    return None


def compiled_library() -> Path:
    """Compile bridge.c into the cache (once per source version) and return the library's path."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    target = _cache_dir() / f"libonnxhal_ort_bridge-{digest}.so"
    if target.is_file():
        return target
    cc = compiler()
    if cc is None:
        raise Fail("onnxhal.ort_plugin needs its bridge library, which is built from C (onnxhal/ort_plugin/"
                   "bridge.c), and no C compiler was found ($CC, cc, gcc, clang). Install one (Debian/Ubuntu: "
                   "'apt-get install gcc') and reinstall onnxhal ('pip install -e .'), or set CC.")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build under a temporary name, then rename: concurrent processes never load a half-written file.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [*cc.split(), "-O2", "-shared", "-fPIC", "-o", tmp, str(SOURCE)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise Fail(f"building onnxhal's bridge library failed: {' '.join(cmd)} exited with {done.returncode}: "
                       f"{done.stderr.strip()[:2000]}. Check that the C compiler works, or reinstall onnxhal.")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def bridge_library() -> Path:
    """The bridge library's path: the one built at install, else one compiled now."""
    return installed_library() or compiled_library()
