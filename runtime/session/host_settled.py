"""Feeds whose every device partition settled on the host run on a CPU-only plan of the session.

The OpenCL EP's cost rule times a partition's signatures on the host and on the device and
settles each on the faster (``dynamic_partition``). Settled on the host, the partition still sits
between device copies: the session uploads the feeds, the partition downloads them for its host
plan and uploads its outputs, and the session downloads them (resnet_ts: 0.33 ms a run against
0.14 for a CPU-only session of the model), and its host plan lacks the CPU EP's own optimizer
passes. Here a session counts, per run, where its partitions ran (``hal/settled_host.py``); feeds
whose run had every partition run on the host, settled there, are keyed by their names, shapes
and dtypes, and their later runs take a CPU-only core of the session, built once at the first such
run from the same model with the CPU EP's passes. No device buffer or copy is touched then.

A session whose partitions' signatures each settled by a timed trial, some on the device, has its
feed key tried whole: its next runs alternate between the device core and the CPU-only core, timed
(``SessionTrial``, ``SESSION_TRIAL_RUNS`` each), and the key settles on the CPU-only core where that
ran faster by ``SESSION_MARGIN``. A partition's trial weighs its own host plan, the partition's graph
as the device EP saw it (without the CPU EP's own fusions: gpt2_ts_qdyn's 636-839 us against 220 for
the CPU-only session), and among several partitions one at a time between the copies the session's
plan keeps around it (pt_mamba, 5 partitions each faster on the device than on the host with its
copies: 1.9-6 ms a run on the device core against 0.37 on the CPU-only one). The figures are in
``SettledFeeds.trials`` and the log.

The key is the feeds' shapes, the partitions' signatures may also hold values computed from the
feeds (a Reshape's shape): a key settled on one run's values runs every later run of that key on
the host. Both plans compute the same results, so that costs time, never correctness. Session
config ``HOST_SETTLED_PLAN`` ("0") turns it off. Only ``run`` takes it; IOBinding and the other
run calls keep the device core (their outputs may be bound to device memory).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from onnxhal.hal.settled_host import SETTLE_TALLY, SETTLES_ON_HOST, SettleTally
from onnxhal.runtime.session.config_switches import switch

logger = logging.getLogger("onnxhal.session")

#: Session config: "1" (default) runs feeds settled on the host on a CPU-only plan, "0" keeps the
#: device core for every run.
HOST_SETTLED_PLAN = "session.onnxhal.host_settled_plan"
#: Feed keys remembered as settled; the oldest goes beyond it (the partitions cache 8 signatures).
MAX_SETTLED = 32
#: Runs of each core a key's session trial times before it settles (the fastest of each counts: the
#: first runs of a core pay a ramp, a loaded machine deschedules some).
SESSION_TRIAL_RUNS = 6
#: The CPU-only core must win a session trial by this factor (runs on a loaded machine differ by more
#: than that near the line, where either choice costs about the same), as a partition's trial.
SESSION_MARGIN = 0.8

#: (output names, feed, run options) -> outputs
Runner = Callable[[Any, Mapping[str, Any], Any], list]


def host_settled_option(config: Callable[[str, str], str]) -> bool:
    """Session config ``HOST_SETTLED_PLAN`` read by ``config(key, default)``, checked."""
    return switch(config, HOST_SETTLED_PLAN,
                  "feeds whose device partitions all settled on the host run on a CPU-only plan",
                  "they run on the device core")


def can_settle(compute_infos: Mapping[Any, tuple[Any, Any]]) -> bool:
    """Whether a core's compiled partitions (``SessionCore.fused_infos``) all tell where they ran
    (``SETTLES_ON_HOST``): a partition that does not may run on the device whatever the others did."""
    return bool(compute_infos) and all(getattr(info, SETTLES_ON_HOST, False) is True
                                       for info, _ in compute_infos.values())


def feed_key(feed: Mapping[str, Any]) -> tuple | None:
    """The feeds' names, shapes and dtypes; None unless every feed is a numpy array (a list's
    shape is not known before it is converted)."""
    key = []
    for name, v in feed.items():
        if v.__class__ is not np.ndarray:
            return None
        key.append((name, v.shape, v.dtype))
    return tuple(key)


class SessionTrial:
    """A feed key's runs on the device core and on the CPU-only core, alternating (CPU first), timed."""

    def __init__(self) -> None:
        self.device: list[float] = []
        self.cpu: list[float] = []

    def next_side(self) -> str:
        """"cpu" or "device": which core runs the key's next run."""
        return "cpu" if len(self.cpu) <= len(self.device) else "device"

    def record(self, side: str, seconds: float) -> None:
        (self.cpu if side == "cpu" else self.device).append(seconds)

    @property
    def settled(self) -> bool:
        return len(self.cpu) >= SESSION_TRIAL_RUNS and len(self.device) >= SESSION_TRIAL_RUNS

    @property
    def cpu_wins(self) -> bool:
        return min(self.cpu) < SESSION_MARGIN * min(self.device)

    def figures(self) -> str:
        side = "the CPU-only plan" if self.cpu_wins else "the device"
        return (f"settled on {side} by a session trial: its runs took {min(self.cpu) * 1e6:.0f} us on the CPU-only "
                f"plan and {min(self.device) * 1e6:.0f} us on the device (the fastest of {SESSION_TRIAL_RUNS} each, "
                f"alternating); session config {HOST_SETTLED_PLAN}=0 keeps the device")


class SettledFeeds:
    """The settled feed keys of one device core (``core``) and the CPU-only runner they take,
    built by ``build`` at the first settled run. ``release``: called with the runner's core when
    this goes (the session's core changed, or the session is released)."""

    def __init__(self, core: Any, build: Callable[[], tuple[Runner, Any]], release: Callable[[Any], None]) -> None:
        self.core = core
        self._build = build
        self._release = release
        self._keys: OrderedDict[tuple, None] = OrderedDict()
        self._lock = threading.Lock()
        self._runner: Runner | None = None
        self._cpu_core: Any = None
        self._failed = False
        self._trials: OrderedDict[tuple, SessionTrial] = OrderedDict()  # keys under a session trial
        #: feed key -> its session trial's figures, where it settled (the last MAX_SETTLED keys)
        self.trials: OrderedDict[tuple, str] = OrderedDict()

    @property
    def settled_keys(self) -> int:
        """How many feed keys run on the CPU-only plan now."""
        return len(self._keys)

    @property
    def cpu_core(self) -> Any:
        """The CPU-only core, once built (None before the first settled run)."""
        return self._cpu_core

    def run(self, device_run: Runner, output_names: Any, feed: Mapping[str, Any], run_options: Any) -> list:
        """A run: on the CPU-only plan when ``feed``'s key settled, else ``device_run`` counted."""
        key = feed_key(feed)
        if key is None:
            return device_run(output_names, feed, run_options)
        if key in self._keys:
            runner = self._runner if self._runner is not None else self._built()
            if runner is not None:
                return runner(output_names, feed, run_options)
        trial = self._trials.get(key)
        if trial is not None and trial.next_side() == "cpu":
            runner = self._runner if self._runner is not None else self._built()  # (its build not timed)
            if runner is not None:
                start = time.perf_counter()
                result = runner(output_names, feed, run_options)
                self._record(key, trial, "cpu", time.perf_counter() - start)
                return result
        tally = SettleTally(len(self.core.fused_infos))
        token = SETTLE_TALLY.set(tally)
        start = time.perf_counter()
        try:
            result = device_run(output_names, feed, run_options)
        finally:
            SETTLE_TALLY.reset(token)
        seconds = time.perf_counter() - start
        if self._failed:
            return result
        if tally.all_host:
            self._settle(key)
        elif trial is not None:
            self._record(key, trial, "device", seconds)
        elif tally.all_tried and key not in self.trials:
            # each partition's trial weighed its own host plan, between the copies the session
            # keeps around it where there are others: the whole session on either core is tried once
            with self._lock:
                self._trials.setdefault(key, SessionTrial())
                while len(self._trials) > MAX_SETTLED:
                    self._trials.popitem(last=False)
        return result

    def _settle(self, key: tuple) -> None:
        with self._lock:
            self._keys[key] = None
            while len(self._keys) > MAX_SETTLED:
                self._keys.popitem(last=False)

    def _record(self, key: tuple, trial: SessionTrial, side: str, seconds: float) -> None:
        """One timed run of ``key``'s session trial; once settled, the key stays where it ran faster."""
        with self._lock:
            if self._trials.get(key) is not trial:
                return  # settled by another thread meanwhile
            trial.record(side, seconds)
            if not trial.settled:
                return
            del self._trials[key]
            self.trials[key] = trial.figures()
            while len(self.trials) > MAX_SETTLED:
                self.trials.popitem(last=False)
        logger.info("feeds %s: %s", key, self.trials[key])
        if trial.cpu_wins:
            self._settle(key)

    def _built(self) -> Runner | None:
        """The runner, built by the first thread to get here; None when the build failed (logged):
        the keys are dropped and every run stays on the device core, which computes the same."""
        with self._lock:
            if self._runner is None and not self._failed:
                try:
                    self._runner, self._cpu_core = self._build()
                except Exception:
                    logger.warning("the CPU-only plan for feeds settled on the host could not be built; "
                                   "they run on the device core", exc_info=True)
                    self._failed = True
                    self._keys.clear()
                    self._trials.clear()
            return self._runner

    def release(self) -> None:
        with self._lock:
            core, self._cpu_core, self._runner = self._cpu_core, None, None
            self._keys.clear()
            self._trials.clear()
        if core is not None:
            self._release(core)
