"""Ctrl-C tests start from Python's own SIGINT handling, whatever the test run inherited: a shell
starts a background job (``pytest ... &``) with SIGINT ignored, its children inherit that, and a
process that ignores SIGINT never gets the KeyboardInterrupt these tests send for."""

from __future__ import annotations

import signal


def sigint_default() -> None:
    """``preexec_fn`` for a child that must see SIGINT: the default disposition, so the child's
    Python installs its KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
