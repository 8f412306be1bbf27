"""Where a device partition's run went, told to the session that runs it.

A partition that times its signatures on both sides (the OpenCL EP's cost rule,
``dynamic_partition``) may settle a signature on the host. It then still takes device copies:
the session uploads the feeds, the partition downloads them for its host plan and uploads its
outputs, and the session downloads those. A session whose every such partition settled on the host
for a run's feeds can run those feeds on a CPU-only plan instead (``runtime/session/host_settled``).

The session counts, for one run, how many partition runs there were and how many of them ran on
the host because their signature settled there: it sets ``SETTLE_TALLY`` around the run and each
partition calls ``note`` (one context-variable read when no session counts). The tally also says how
many partitions the session's core has (``partitions``): a partition whose run is counted and that is
the core's only one knows that, settled on the host, its feeds will run on the CPU-only plan, with
no copy at all (``whole_session_settles``): what a trial of its host side should time.
A compute info that calls ``note`` on every run says so with ``SETTLES_ON_HOST`` (an attribute
set to True): a session counts only where every partition it compiled does.
"""

from __future__ import annotations

from contextvars import ContextVar

#: The attribute of a compute info that calls ``note`` on each of its runs.
SETTLES_ON_HOST = "settles_on_host"


class SettleTally:
    """One run's partition runs (``runs``), those that ran on the host settled there (``host``) and
    those whose signature a timed trial settled on either side (``tried``); ``partitions``: how many
    the session's core has (0: not told)."""

    __slots__ = ("runs", "host", "tried", "partitions")

    def __init__(self, partitions: int = 0) -> None:
        self.runs = 0
        self.host = 0
        self.tried = 0
        self.partitions = partitions

    @property
    def all_host(self) -> bool:
        """Whether partitions ran and every one of them ran on the host, settled there."""
        return self.runs > 0 and self.host == self.runs

    @property
    def all_tried(self) -> bool:
        """Whether partitions ran and a trial had settled every one's signature (the host was near
        enough to be timed for each), on either side."""
        return self.runs > 0 and self.tried == self.runs


#: The tally of the run in progress in this thread (or async context); None when no session counts.
SETTLE_TALLY: ContextVar[SettleTally | None] = ContextVar("onnxhal_settle_tally", default=None)


def note(settled_on_host: bool, tried: bool = False) -> None:
    """A partition ran; ``settled_on_host``: on the host because its signature settled there (not
    a trial's host run, not a host run for want of a plan); ``tried``: its signature was settled,
    on either side, by a timed trial."""
    tally = SETTLE_TALLY.get()
    if tally is not None:
        tally.runs += 1
        tally.host += settled_on_host
        tally.tried += tried


def whole_session_settles() -> bool:
    """Whether the run in progress is counted by a session whose core has one partition, the caller:
    settled on the host, that partition's feeds then run on the session's CPU-only plan, so its host
    side costs its host plan alone, and its device side the session's copies as well as its run."""
    tally = SETTLE_TALLY.get()
    return tally is not None and tally.partitions == 1
