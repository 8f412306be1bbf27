"""What the bridge does for a ``hal.Ep`` hook that onnxruntime does not call.

onnxruntime calls a member only if it knows it and the EP declares a version that has it
(ep_struct_table.py). Where it does not, the bridge keeps the hook's promise itself, from the
members that onnxruntime does call:

- ``is_concurrent_run_supported``, on every version: an EP that answers False gets one ``Compute``
  at a time (a lock per EP). onnxruntime's own answer (``IsConcurrentRunSupported``, API 24) is a
  session lock that its Python API takes while holding the GIL: concurrent ``run`` calls from
  Python threads then deadlock against the EP's Python code (seen on 1.32), so the bridge leaves
  that member NULL;
- ``on_session_initialization_end`` before API 27 (``OnSessionInitializationEnd``): called once, at
  the first ``OnRunStart``;
- ``sync`` before API 25 (``Sync``): called at ``OnRunEnd`` when onnxruntime asks that run to
  synchronize.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from onnxhal.hal.ep import Ep
from onnxhal.ort_plugin.ep_struct_table import ORT_EP

SINCE = dict(ORT_EP)


class MissingHooks:
    """The fallbacks one session's EP needs at API ``version``."""

    def __init__(self, ep: Ep, version: int) -> None:
        self.ep = ep
        self.syncs_at_run_end = version < SINCE["Sync"]
        self._init_end_pending = version < SINCE["OnSessionInitializationEnd"]
        self._init_lock = threading.Lock()
        self._compute_lock = None if ep.is_concurrent_run_supported() else threading.Lock()

    @property
    def serializes_compute(self) -> bool:
        return self._compute_lock is not None

    def run_start(self) -> None:
        if self._init_end_pending:
            with self._init_lock:
                if self._init_end_pending:
                    self.ep.on_session_initialization_end()
                    self._init_end_pending = False

    def run_end(self, sync_stream: bool) -> None:
        if self.syncs_at_run_end and sync_stream:
            self.ep.sync()

    def compute(self, call: Callable[[], Any]) -> Any:
        if self._compute_lock is None:
            return call()
        with self._compute_lock:
            return call()
