"""A session's plain run as one generated function: ``InferenceSession.run(names, feeds)`` with no
run options, on a session whose run needs no logging scope, profiler, sparse outputs, graph capture
or EP hooks other than ``on_run_start``.

``InferenceSession._run`` serves every run: it checks the run options, builds the feeds' dict
(``FeedChecker.check``), asks the core which hooks to call, has the plan place each feed and pick
its run function, and hands the outputs over (``_owned``). For a tiny model those steps cost more
than its kernels, and for a given session they decide the same way at every plain run. So the
session prepares, per core, one function in which each decision is already taken: the feeds'
checks written out per input (a dict of exactly the required inputs, each a numpy array of the
input's dtype, rank and fixed dims; a string input's str or object array made an object array of
str; a map or sequence input's dict or list as given), the start hooks called, the feeds put into
their slots of the plan's template, numpy's error state set to ignore around the plan's generated
run function, and ``_owned``'s common case tested in line (fresh writeable arrays, none a feed, no
two the same; lists and None as they are). Any feed it does not pass makes it return None before
anything runs, and the caller takes ``_run``, whose checks accept the feed or raise the typed error
naming the input; any other output list goes through ``_owned``.

A plan with device memory (an OpenCL or simulated device's partition) is prepared too: each feed
read on a device is uploaded by the function ``MemoryContext.uploader`` made for that device at
preparation, each output produced there downloaded by its ``downloader``, and the run framed by the
memory context's ``run_begin`` / ``run_end`` (feed uploads held until the download) and
``end_of_run``, as ``ExecutionPlan.run`` does; session config ``session.onnxhal.prepared_copies``
= "0" leaves such plans to ``_run`` (the previous path, for A/B).

``prepared_source`` is the source, to read; ``tests/test_run_path.py`` checks both ways agree.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from types import CodeType
from typing import Any

import numpy as np

from onnxhal.hal.errors import OrtError
from onnxhal.hal.run_control import RUN_OPTIONS, Terminated
from onnxhal.runtime.session.config_switches import switch
from onnxhal.runtime.session.executor import HostEntry
from onnxhal.runtime.session.fp_errors import FP_STATE, ignore_fp_errors, ignoring, restore_fp_errors
from onnxhal.runtime.session.input_checks import stringified
from onnxhal.runtime.session.plan_codegen import PLAN_CODE_CACHE_SIZE

_OBJECT = np.dtype(object)

#: Session config: "0" leaves a plan with device memory (feeds read on a device, outputs produced
#: there, streams) to ``InferenceSession._run`` at every run; "1" (the default) prepares its run too,
#: its uploads and downloads found once (``ExecutionPlan.host_entry(copies=True)``).
PREPARED_COPIES = "session.onnxhal.prepared_copies"

#: Session config: "1" (default) offers a prepared run whose plan is one fused node reading only feeds
#: and producing every output to the node's EP first, where it runs host arrays to host arrays itself
#: (``HostEntry.one_call``: the OpenCL EP's one native call, feed writes, launches, reads and one
#: wait); "0" makes its copies and launches one by one (the previous path, for A/B).
ONE_CALL_RUN = "session.onnxhal.one_call_run"

#: (feed, fetch, run options) -> the outputs (``fetch``: their indices, None for all), or None when
#: ``_run`` must take the feed
PreparedRun = Callable[[Any, "Sequence[int] | None", Any], "list | None"]


@functools.lru_cache(maxsize=PLAN_CODE_CACHE_SIZE)
def compiled_run(source: str) -> CodeType:
    """The code object of a prepared run, kept per process by its source, as the plan's
    (``plan_codegen.compiled_plan``): compiling costs more than a hundred small runs, and every
    session of one model generates the same source (its dtypes and objects are bound at ``exec``)."""
    return compile(source, "<onnxhal prepared run>", "exec")


def prepared_source(specs: Sequence[tuple[str, Any, int, tuple[tuple[int, int], ...]]], feed_slots: Sequence[int],
                    n_starts: int, with_options: bool = False, uploads: Sequence[Sequence[int]] = (),
                    downloads: Sequence[bool] = (), framed: bool = False,
                    one_call_feeds: Sequence[int] | None = None) -> str:
    """The source of the prepared run for the required inputs ``specs`` (``FeedChecker.ordered_specs``),
    fed into ``feed_slots``, with ``n_starts`` EPs whose ``on_run_start`` is called. ``with_options``:
    the run of a ``RunOptions`` ``ro`` (``ExecutionPlan._execute``'s with options): the hooks get
    it, ``RUN_OPTIONS`` holds it for the run (the EPs' kernels and subgraphs read it there), and
    the plan's function is the one that checks ``ro.terminate`` between steps. A plan with device
    memory (``framed``, ``HostEntry.memory``): ``uploads[k]``, the slots feed ``k`` is copied to
    (by ``u{k}_{j}``), ``downloads[i]``, whether output ``i`` is copied to the host (by ``dl[i]``),
    and the run framed by the memory context's ``run_begin`` / ``run_end`` and ``end_of_run``,
    as ``ExecutionPlan.run`` frames it. ``one_call_feeds`` (``HostEntry.one_call_feeds``): the run is
    first offered to ``one_call`` (the feeds in that order); its outputs, reordered by ``oc_out``,
    are the run's unless it returned None, and then the run takes its plan as without it."""
    lines = ["def _prepared(feed, fetch, ro):",
             f"    if feed.__class__ is not dict or len(feed) != {len(specs)}:",
             "        return None"]
    for k, (name, dtype, rank, fixed) in enumerate(specs):
        v = f"v{k}"
        lines.append(f"    {v} = feed.get({name!r})")  # a missing name gives None, which is no array
        if dtype is None:  # a map or sequence input
            lines += [f"    if {v}.__class__ is not dict and {v}.__class__ is not list:", "        return None"]
            continue
        lines += [f"    if {v}.__class__ is not ndarray or {v}.ndim != {rank}:", "        return None"]
        if dtype == _OBJECT:
            lines += [f"    if {v}.dtype.kind not in 'UO':", "        return None", f"    {v} = stringified({v})"]
        else:
            lines += [f"    if {v}.dtype is not d{k} and {v}.dtype != d{k}:", "        return None"]
        if fixed:
            lines += [f"    _s = {v}.shape",
                      "    if " + " or ".join(f"_s[{axis}] != {dim}" for axis, dim in fixed) + ":",
                      "        return None"]
    lines += [f"    h{j}.on_run_start({'ro' if with_options else 'None'})" for j in range(n_starts)]
    head, lines = lines, []  # the plan's run, under the one-call runner's fallback where there is one
    lines.append("    slots = template.copy()")
    lines += [f"    slots[{i}] = v{k}" for k, i in enumerate(feed_slots)]
    body = []  # the run, indented under the memory context's frame where there is one
    for k, targets in enumerate(uploads):
        name = specs[k][0]
        for j, slot in enumerate(targets):
            body += ["try:", f"    slots[{slot}] = u{k}_{j}(v{k}, hold)", "except OrtError:", "    raise",
                     "except Exception as e:", f"    raise copy_error(e, {name!r}) from e"]
    if FP_STATE is not None:
        body.append("token = fp_set(ignoring(fp_get()))")
    else:
        body.append("token = ignore_fp_errors()")
    if with_options:
        body.append("options_token = options_set(ro)")
    body += ["try:",
             f"    r = fn(slots, fns, {'ro' if with_options else 'None'})",
             "except Terminated:",
             "    raise",
             "except Exception as e:",
             "    raise run_error(e, slots) from e",
             "finally:"]
    if with_options:
        body.append("    options_reset(options_token)")
    body.append("    fp_reset(token)" if FP_STATE is not None else "    restore_fp_errors(token)")
    if framed:
        body.append("    end_of_run()")
    if any(downloads):
        all_outputs = tuple(range(len(downloads)))
        body += ["try:",
                 f"    out = [r[i] if dl[i] is None else dl[i](r[i]) for i in ({all_outputs!r} if fetch is None "
                 "else fetch)]",
                 "except OrtError:",
                 "    raise",
                 "except Exception as e:",
                 "    raise copy_error(e, '') from e"]
    else:
        body.append("out = list(r) if fetch is None else [r[i] for i in fetch]")
    if framed:
        lines += ["    hold = run_begin()", "    try:", *("        " + b for b in body),
                  "    finally:", "        run_end()"]
    else:
        lines += ["    " + b for b in body]
    if one_call_feeds is not None:
        lines = [*head, "    try:",
                 f"        r = one_call(({''.join(f'v{k}, ' for k in one_call_feeds)}))",
                 "    except OrtError:",
                 "        raise",
                 "    except Exception as e:",  # as the plan's run raises it: naming the fused node
                 "        raise run_error(e, template.copy()) from e",
                 "    if r is not None:",
                 "        out = [r[i] for i in oc_out] if fetch is None else [r[oc_out[i]] for i in fetch]",
                 "    else:", *("    " + line for line in lines)]
    else:
        lines = head + lines
    lines += ["    for v in out:",
              "        if v.__class__ is ndarray:",
              "            if v.base is not None or not v.flags.writeable"
              + "".join(f" or v is v{k}" for k, spec in enumerate(specs) if spec[1] is not None) + ":",
              "                return owned(out, feed)",
              "        elif v.__class__ is not list and v is not None:",
              "            return owned(out, feed)",
              "    if len(out) > 1 and len({id(v) for v in out}) < len(out):",
              "        return owned(out, feed)",
              "    return out"]
    return "\n".join(lines)


def one_call_option(config: Callable[[str, str], str]) -> bool:
    """Session config ``ONE_CALL_RUN`` read by ``config(key, default)``, checked."""
    return switch(config, ONE_CALL_RUN, "a plan that is one fused node whose EP runs it from host arrays runs that way",
                  "its copies and launches are made one by one")


def prepared_copies_option(config: Callable[[str, str], str]) -> bool:
    """Session config ``PREPARED_COPIES`` read by ``config(key, default)``, checked."""
    return switch(config, PREPARED_COPIES, "a run with device copies is prepared once",
                  "it takes the general run path each time")


def prepared_run(specs: Sequence[tuple[str, Any, int, tuple[tuple[int, int], ...]]], entry: HostEntry,
                 starts: Sequence[Any], owned: Callable[[list, Any], list], with_options: bool = False) -> PreparedRun:
    """The prepared run: ``specs`` from ``FeedChecker.ordered_specs``, ``entry`` from
    ``ExecutionPlan.host_entry`` for the same names (``check_terminate`` as ``with_options``),
    ``starts`` the EPs whose ``on_run_start`` a run calls, ``owned`` the hand-over of an output list
    that the quick test does not pass; ``with_options`` as ``prepared_source``'s."""
    framed = entry.memory is not None
    source = prepared_source(specs, entry.feed_slots, len(starts), with_options,
                             [[slot for slot, _ in t] for t in entry.uploads] if framed else (),
                             [d is not None for d in entry.downloads] if framed else (), framed,
                             entry.one_call_feeds if entry.one_call is not None else None)
    namespace: dict[str, Any] = {
        "ndarray": np.ndarray, "stringified": stringified, "OrtError": OrtError, "Terminated": Terminated, "template": entry.template,
        "fn": entry.generated.fn, "fns": entry.generated.fns, "run_error": entry.run_error, "owned": owned,
        "ignore_fp_errors": ignore_fp_errors, "restore_fp_errors": restore_fp_errors, "ignoring": ignoring}
    if FP_STATE is not None:
        namespace.update(fp_get=FP_STATE.get, fp_set=FP_STATE.set, fp_reset=FP_STATE.reset)
    if with_options:
        namespace.update(options_set=RUN_OPTIONS.set, options_reset=RUN_OPTIONS.reset)
    if entry.one_call is not None:
        namespace.update(one_call=entry.one_call, oc_out=entry.one_call_outputs)
    if framed:
        memory = entry.memory
        namespace.update(run_begin=memory.run_begin, run_end=memory.run_end, end_of_run=memory.end_of_run,
                         dl=entry.downloads, copy_error=entry.copy_error)
        namespace.update({f"u{k}_{j}": up for k, targets in enumerate(entry.uploads)
                          for j, (_, up) in enumerate(targets)})
    namespace.update({f"d{k}": spec[1] for k, spec in enumerate(specs)})
    namespace.update({f"h{j}": ep for j, ep in enumerate(starts)})
    exec(compiled_run(source), namespace)  # noqa: S102 - generated from the plan
    return namespace.pop("_prepared")  # out of its own globals: no reference cycle (plan_codegen.generate)
