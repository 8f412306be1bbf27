"""Hardware profiles: what a class of device can do, read from TOML and checked against a schema.

A profile is one TOML file (``simulators/profiles/<name>.toml`` or any path). Every table and key
is checked: an unknown key, a wrong type or an out-of-range value raises ``ProfileError`` naming the
file, the key and the reason, so a typo never silently turns a feature off. Units are in the key
names (``_mib``, ``_gbps`` = GB/s, ``_us``, ``_w``, ``peak_tops`` = 10^12 operations per second).

Schema (``*`` = required)::

    [device]      name*, type* ("npu" | "gpu"), vendor*, vendor_id*, device_id*, description,
                  discrete (GPU on its own card; ORT sorts those first)
    [memory]      capacity_mib*, host_shared
    [compute]     ops* (ONNX op types), dtypes* (compute dtypes), float32_as ("float32" | "float16" |
                  "none": how float32 tensors are computed), static_shapes_only, max_rank,
                  preferred_layout ("NCHW" | "NHWC")
    [performance] peak_tops* (table dtype -> TOPS), memory_bandwidth_gbps*, host_link_bandwidth_gbps*,
                  host_link_latency_us, kernel_launch_us
    [power]       idle_w*, active_w*
    [numerics]    rtol, atol (allowed error against the CPU EP)
    [faults]      device_lost_after_runs, alloc_fail_after_bytes, compile_fail, transient_error_rate,
                  seed, slowdown (see ``faults.py``)
    [partitions]  max_nodes (most nodes one partition may hold; 0 = no limit), min_nodes (a smaller
                  partition is declined unless it is the whole graph; 0 = no limit)
    [sources.ID]  url, version, read, note, estimate: where a rule was read (``profile_rules.py``)
    [op.TYPE]     per-op rules, each naming its source (``profile_rules.py``)

[compute] also takes ``ops_source`` (the op list's source) and ``float32_option`` (a provider option that picks ``float32_as``), and each of
[device], [memory], [compute], [performance], [power], [numerics], [partitions] a ``source`` (a
[sources.ID]) for its figures. With ``float32_as = "none"`` and int8 in ``dtypes``, the device
computes float only inside int8 QDQ groups (``quantized.py``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from onnxhal.hal.enums import OrtHardwareDeviceType
from onnxhal.hal.errors import InvalidArgument
from onnxhal.simulators.profile_rules import (
    Float32Option,
    OpRule,
    Source,
    parse_float32_option,
    parse_op_rules,
    parse_sources,
    source_ref,
)

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
DTYPES = ("float32", "float16", "bfloat16", "int8", "uint8", "int16", "int32")
LAYOUTS = ("NCHW", "NHWC")
#: How float32 tensors are computed: as they are, stored as fp16 or bf16, or refused ("none").
FLOAT32_AS = ("float32", "float16", "bfloat16", "none")
TYPES = {"npu": OrtHardwareDeviceType.NPU, "gpu": OrtHardwareDeviceType.GPU}
#: Ops the runtime optimizer creates (domain com.onnxhal) and the ONNX ops a device must support
#: to run them: a profile lists standard ONNX op types only.
FUSED_OP_PARTS = {"FusedConv": ("Conv",), "FusedGemm": ("Gemm",), "FusedMatMul": ("MatMul", "Add"),
                  "Gelu": ("Erf",), "LayerNormalization": ("LayerNormalization",),
                  "FusedBatchNormalization": ("BatchNormalization",), "ReplaceNaN": ("IsNaN", "Where")}


class ProfileError(InvalidArgument):
    """A profile that cannot be used: ``path``, ``key`` (dotted; "" when the whole profile is at
    fault: a missing file, an unknown name) and ``reason`` say why."""

    def __init__(self, path: str, key: str, reason: str) -> None:
        self.path, self.key, self.reason = path, key, reason
        super().__init__(f"simulator profile {path!r}: " + (f"key {key!r}: " if key else "") + reason)


@dataclass(frozen=True)
class Faults:
    """Faults to inject; every default means "none"."""

    device_lost_after_runs: int = -1  # N runs succeed, then every compute raises EPFail
    alloc_fail_after_bytes: int = -1  # an allocation fails once this many bytes were allocated
    compile_fail: bool = False  # compile() raises EPFail
    transient_error_rate: float = 0.0  # probability that one partition's compute fails
    seed: int = 0  # of the transient errors' random generator
    slowdown: float = 1.0  # device (simulated and wall-clock) time multiplier

    @property
    def any(self) -> bool:
        return self != Faults()


#: The allowed range of each numeric fault, for a profile's [faults] table and ``fault_*`` provider
#: options alike: -1 means "never" for the counts; a seed is numpy's non-negative 64-bit seed; the
#: slowdown is finite (a device idles ``slowdown - 1`` times its busy time).
FAULT_RANGES: dict[str, tuple[float, float]] = {
    "device_lost_after_runs": (-1, 2**31 - 1),
    "alloc_fail_after_bytes": (-1, 2**63 - 1),
    "transient_error_rate": (0.0, 1.0),
    "seed": (0, 2**63 - 1),
    "slowdown": (1.0, 1e6),
}


@dataclass(frozen=True)
class Profile:
    name: str
    path: str
    type: OrtHardwareDeviceType
    vendor: str
    vendor_id: int
    device_id: int
    description: str
    discrete: bool
    capacity_bytes: int
    host_shared: bool
    ops: frozenset[str]
    dtypes: frozenset[str]
    float32_as: str
    static_shapes_only: bool
    max_rank: int
    preferred_layout: str
    peak_tops: Mapping[str, float]
    memory_bandwidth_gbps: float
    host_link_bandwidth_gbps: float
    host_link_latency_us: float
    kernel_launch_us: float
    idle_w: float
    active_w: float
    rtol: float
    atol: float
    faults: Faults = field(default_factory=Faults)
    sources: Mapping[str, Source] = field(default_factory=dict)
    #: op type -> its rules (several when they come from different sources)
    op_rules: Mapping[str, tuple[OpRule, ...]] = field(default_factory=dict)
    #: table name ([compute], [memory], ...) -> the source of its figures
    table_sources: Mapping[str, Source] = field(default_factory=dict)
    float32_options: tuple[Float32Option, ...] = ()
    max_partition_nodes: int = 0
    min_partition_nodes: int = 0

    @property
    def int8_qdq_only(self) -> bool:
        """Float is computed only inside int8 QDQ groups (float32 refused elsewhere)."""
        return self.float32_as == "none" and bool({"int8", "uint8"} & self.dtypes)

    def cite(self, table: str) -> str:
        """`` (source ...)`` for the figures of ``table`` ("ops": the op list, else [compute]), or ""
        when the profile names none."""
        src = self.table_sources.get(table) or (self.table_sources.get("compute") if table == "ops" else None)
        return f" (source {src.cite()})" if src is not None else ""

    def rules_for(self, op_type: str) -> tuple[OpRule, ...]:
        """The op rules that apply to a node of ``op_type`` (a fused op obeys the rules of the op
        it was made from)."""
        rules = self.op_rules.get(op_type, ())
        parts = FUSED_OP_PARTS.get(op_type)
        if parts and op_type.startswith("Fused"):
            rules = rules + self.op_rules.get(parts[0], ())
        return rules

    def with_options(self, options: Mapping[str, str]) -> Profile:
        """This profile under a session's provider options (``float32_option``: each option given
        sets float32_as, in the profile's order; "unchanged" leaves it)."""
        profile = self
        for opt in self.float32_options:
            if opt.name not in options:
                continue
            value = str(options[opt.name])
            if value not in opt.values:
                raise ProfileError(self.path, "compute.float32_option", f"provider option {opt.name}={value!r} is "
                                   f"not one of {', '.join(sorted(opt.values))}")
            if opt.values[value] != "unchanged":
                profile = replace(profile, float32_as=opt.values[value])
        return profile

    @property
    def type_name(self) -> str:
        return "npu" if self.type == OrtHardwareDeviceType.NPU else "gpu"

    @property
    def compute_dtype(self) -> str:
        """The dtype float32 tensors are computed in ("none" if the device declines them)."""
        return self.float32_as

    def peak_ops_per_s(self, dtype: str) -> float:
        return self.peak_tops.get(dtype, max(self.peak_tops.values())) * 1e12

    def supports_op(self, op_type: str) -> bool:
        parts = FUSED_OP_PARTS.get(op_type)
        if op_type in self.ops:
            return True
        return parts is not None and all(p in self.ops for p in parts)

    def hardware_metadata(self) -> dict[str, str]:
        """The profile's figures as hardware device metadata (all strings, as ORT's)."""
        md = {"Description": self.description or self.name, "simulator_profile": self.name,
              "simulator_profile_path": self.path, "memory_bytes": str(self.capacity_bytes),
              "host_shared_memory": "1" if self.host_shared else "0",
              "memory_bandwidth_gbps": f"{self.memory_bandwidth_gbps:g}",
              "host_link_bandwidth_gbps": f"{self.host_link_bandwidth_gbps:g}",
              "host_link_latency_us": f"{self.host_link_latency_us:g}",
              "idle_power_w": f"{self.idle_w:g}", "active_power_w": f"{self.active_w:g}",
              "compute_dtypes": ",".join(sorted(self.dtypes)), "preferred_layout": self.preferred_layout,
              "static_shapes_only": "1" if self.static_shapes_only else "0"}
        md.update({f"peak_tops_{k}": f"{v:g}" for k, v in sorted(self.peak_tops.items())})
        if self.type == OrtHardwareDeviceType.GPU:
            md["Discrete"] = "1" if self.discrete else "0"
        return md


# -- loading ------------------------------------------------------------------------------------
def resolve_profile_path(name_or_path: str) -> Path:
    """A shipped profile's file by name (``generic-npu``), or the given path."""
    text = str(name_or_path).strip()
    if not text:
        raise ProfileError("", "", "empty profile name; give a shipped name or the path of a .toml file")
    if text.endswith(".toml") or os.sep in text or "/" in text:
        path = Path(text).expanduser()
        if not path.is_file():
            raise ProfileError(str(path), "", "no such file")
        return path
    path = PROFILE_DIR / f"{text}.toml"
    if not path.is_file():
        raise ProfileError(text, "", f"no shipped profile of that name; choose one of {', '.join(shipped_profiles())}, "
                           "or give the path of a .toml file")
    return path


def _toml_module(path: str) -> Any:
    """``tomllib`` (Python 3.11+), or the ``tomli`` backport on 3.10."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise ProfileError(path, "", "reading TOML needs Python 3.11 (tomllib) or the tomli package") from None
    return tomllib


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def load_profile(name_or_path: str | os.PathLike) -> Profile:
    """Read and check one profile; raises ``ProfileError``."""
    path = resolve_profile_path(os.fspath(name_or_path))
    toml = _toml_module(str(path))
    try:
        data = toml.loads(path.read_text())
    except toml.TOMLDecodeError as exc:
        raise ProfileError(str(path), "", f"not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ProfileError(str(path), "", f"cannot read: {exc}") from exc
    return _Reader(str(path), data).profile()


def parse_profile_list(text: str) -> list[Profile]:
    """``"generic-npu,generic-gpu"`` (names or paths, comma-separated) -> profiles; names must differ
    and so must (vendor_id, device_id), which identify each device's memory."""
    profiles = [load_profile(p) for p in (s.strip() for s in str(text).split(",")) if p]
    seen: dict[object, str] = {}
    for p in profiles:
        for key, what in ((("name", p.name), "device.name"), (("id", p.vendor_id, p.device_id), "device.device_id")):
            if key in seen:
                raise ProfileError(p.path, what, f"the same as in {seen[key]}: two simulated devices need distinct "
                                   "names and (vendor_id, device_id) pairs")
            seen[key] = p.path
    return profiles


class _Reader:
    """Pulls typed, range-checked values out of the parsed TOML, rejecting unknown keys."""

    def __init__(self, path: str, data: dict) -> None:
        self.path = path
        self.data = data
        self.used: dict[str, set[str]] = {}

    def fail(self, key: str, reason: str) -> ProfileError:
        return ProfileError(self.path, key, reason)

    def table(self, name: str, required: bool = True) -> dict:
        t = self.data.get(name)
        if t is None:
            if required:
                raise self.fail(name, "missing table")
            t = {}
        if not isinstance(t, dict):
            raise self.fail(name, f"must be a table, got {type(t).__name__}")
        self.used.setdefault(name, set())
        return t

    def get(self, table: str, key: str, kind: type | tuple, default: Any = ...,
            check: Callable[[Any], str | None] | None = None) -> Any:
        t = self.table(table, required=default is ...)
        self.used[table].add(key)
        full = f"{table}.{key}"
        if key not in t:
            if default is ...:
                raise self.fail(full, "missing required key")
            return default
        v = t[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise self.fail(full, f"must be {names}, got {type(v).__name__} {v!r}")
        if check is not None and (reason := check(v)):
            raise self.fail(full, reason)
        return v

    def profile(self) -> Profile:
        g = self.get
        pos = _range(lo=0.0, strict=True)
        name = g("device", "name", str, check=_nonempty)
        type_name = g("device", "type", str, check=_choice(tuple(TYPES)))
        discrete = g("device", "discrete", bool, False)
        if discrete and type_name != "gpu":
            raise self.fail("device.discrete", "only a GPU can be discrete")
        ops = g("compute", "ops", list, check=_op_list)
        dtypes = g("compute", "dtypes", list, check=_dtype_list)
        peak = self._peak(dtypes)
        prof = Profile(
            name=name, path=self.path, type=TYPES[type_name],
            vendor=g("device", "vendor", str, check=_nonempty),
            vendor_id=g("device", "vendor_id", int, check=_range(1, 0xFFFFFFFF)),
            device_id=g("device", "device_id", int, check=_range(0, 0xFFFFFFFF)),
            description=g("device", "description", str, ""), discrete=discrete,
            capacity_bytes=int(g("memory", "capacity_mib", float, check=pos) * 2**20),
            host_shared=g("memory", "host_shared", bool, False),
            ops=frozenset(ops), dtypes=frozenset(dtypes),
            float32_as=g("compute", "float32_as", str, "float32", check=_choice(FLOAT32_AS)),
            static_shapes_only=g("compute", "static_shapes_only", bool, False),
            max_rank=g("compute", "max_rank", int, 6, check=_range(1, 8)),
            preferred_layout=g("compute", "preferred_layout", str, "NCHW", check=_choice(LAYOUTS)),
            peak_tops=peak,
            memory_bandwidth_gbps=g("performance", "memory_bandwidth_gbps", float, check=pos),
            host_link_bandwidth_gbps=g("performance", "host_link_bandwidth_gbps", float, check=pos),
            host_link_latency_us=g("performance", "host_link_latency_us", float, 0.0, check=_range(0.0)),
            kernel_launch_us=g("performance", "kernel_launch_us", float, 0.0, check=_range(0.0)),
            idle_w=g("power", "idle_w", float, check=_range(0.0)),
            active_w=g("power", "active_w", float, check=pos),
            rtol=g("numerics", "rtol", float, 1e-4, check=_range(0.0)),
            atol=g("numerics", "atol", float, 1e-4, check=_range(0.0)),
            faults=self._faults())
        sources = parse_sources(self.data.get("sources"), self.fail)
        self.used["sources"] = set(sources)
        ops_known = _known_ops()
        op_rules = parse_op_rules(self.data.get("op"), sources, ops_known, self.fail)
        self.used["op"] = set(op_rules)
        table_sources = {}
        for tname in ("device", "memory", "compute", "performance", "power", "numerics", "partitions"):
            ref = self.get(tname, "source", str, None) if tname in self.data else None
            if ref is not None:
                table_sources[tname] = source_ref(ref, sources, f"{tname}.source", self.fail)
        ops_ref = self.get("compute", "ops_source", str, None)
        if ops_ref is not None:  # the op list's source, when [compute]'s other figures have another
            table_sources["ops"] = source_ref(ops_ref, sources, "compute.ops_source", self.fail)
        prof = replace(prof, sources=sources, op_rules=op_rules, table_sources=table_sources,
                       float32_options=parse_float32_option(self.get("compute", "float32_option", (dict, list), None),
                                                            dtypes, self.fail),
                       max_partition_nodes=self.get("partitions", "max_nodes", int, 0, check=_range(0, 2**31 - 1)),
                       min_partition_nodes=self.get("partitions", "min_nodes", int, 0, check=_range(0, 2**31 - 1)))
        if prof.float32_as not in ("none", *dtypes):
            raise self.fail("compute.float32_as", f"{prof.float32_as!r} is not one of compute.dtypes {dtypes}")
        if prof.active_w < prof.idle_w:
            raise self.fail("power.active_w", f"{prof.active_w} W is below power.idle_w {prof.idle_w} W")
        self._no_unknown_keys()
        return prof

    def _peak(self, dtypes: list[str]) -> dict[str, float]:
        peak = self.get("performance", "peak_tops", dict)
        out = {}
        for k, v in peak.items():
            if k not in DTYPES:
                raise self.fail(f"performance.peak_tops.{k}", f"unknown dtype; known: {', '.join(DTYPES)}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise self.fail(f"performance.peak_tops.{k}", f"must be a positive number, got {v!r}")
            out[k] = float(v)
        missing = [d for d in dtypes if d not in out]
        if missing:
            raise self.fail("performance.peak_tops", f"no figure for compute dtype(s) {missing}")
        return out

    def _faults(self) -> Faults:
        g = self.get
        r = FAULT_RANGES
        return Faults(
            device_lost_after_runs=g("faults", "device_lost_after_runs", int, -1, check=_range(*r["device_lost_after_runs"])),
            alloc_fail_after_bytes=g("faults", "alloc_fail_after_bytes", int, -1, check=_range(*r["alloc_fail_after_bytes"])),
            compile_fail=g("faults", "compile_fail", bool, False),
            transient_error_rate=g("faults", "transient_error_rate", float, 0.0, check=_range(*r["transient_error_rate"])),
            seed=g("faults", "seed", int, 0, check=_range(*r["seed"])),
            slowdown=g("faults", "slowdown", float, 1.0, check=_range(*r["slowdown"])))

    def _no_unknown_keys(self) -> None:
        for tname, t in self.data.items():
            if tname not in self.used:
                raise self.fail(tname, f"unknown table; known: {', '.join(sorted(self.used))}")
            for key in t:
                if key not in self.used[tname]:
                    raise self.fail(f"{tname}.{key}", f"unknown key; known in [{tname}]: "
                                    f"{', '.join(sorted(self.used[tname]))}")


# -- checks (return a reason or None) ----------------------------------------------------------
def _nonempty(v: str) -> str | None:
    return None if v.strip() else "must not be empty"


def _choice(options: tuple[str, ...]) -> Callable[[str], str | None]:
    return lambda v: None if v in options else f"{v!r} is not one of {', '.join(options)}"


def _range(lo: float | None = None, hi: float | None = None, strict: bool = False) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if isinstance(v, float) and not math.isfinite(v):  # NaN compares false with every bound
            return f"{v!r} must be a finite number"
        if lo is not None and (v <= lo if strict else v < lo):
            return f"{v!r} must be {'>' if strict else '>='} {lo}"
        if hi is not None and v > hi:
            return f"{v!r} must be <= {hi}"
        return None
    return check


def _known_ops() -> frozenset[str]:
    import onnx.defs

    return frozenset(s.name for s in onnx.defs.get_all_schemas()) | frozenset(FUSED_OP_PARTS)


def _op_list(v: list) -> str | None:
    if not v:
        return "must list at least one op type"
    known = _known_ops()
    for op in v:
        if not isinstance(op, str) or op not in known:
            return f"{op!r} is not an ONNX op type"
    return None


def _dtype_list(v: list) -> str | None:
    if not v:
        return "must list at least one dtype"
    bad = [d for d in v if d not in DTYPES]
    return f"unknown dtype(s) {bad}; known: {', '.join(DTYPES)}" if bad else None
