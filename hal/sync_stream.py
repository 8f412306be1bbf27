"""Sync streams and notifications (ORT's OrtSyncStreamImpl / OrtSyncNotificationImpl).

A stream orders work on one device. A notification, activated on a stream after some work, lets
another stream (``wait_on_device``) or the host (``wait_on_host``) wait for that work only.
On the CPU work runs inline, so the base classes are already correct for host-only EPs.
"""

from __future__ import annotations


class SyncNotification:
    def activate(self) -> None:
        """Mark the point in the producing stream that waiters wait for."""

    def wait_on_device(self, consumer_stream: SyncStream) -> None:
        """Make ``consumer_stream``'s later work wait for the activation point."""

    def wait_on_host(self) -> None:
        """Block the calling thread until the activation point is reached."""


class SyncStream:
    def handle(self) -> object:
        """The native handle (an OpenCL command queue, ...); None for inline streams."""
        return None

    def create_notification(self) -> SyncNotification:
        return SyncNotification()

    def flush(self) -> None:
        """Submit queued work without waiting for it."""

    def on_session_run_end(self) -> None:
        """Called once per run that used this stream, after the last work was queued."""

    def get_handle(self) -> object:  # onnxruntime's Python OrtSyncStream name
        return self.handle()


OrtSyncStream = SyncStream
