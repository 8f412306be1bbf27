"""``onnxhal profiles list`` and ``onnxhal profiles show NAME``: the simulated devices' profiles,
their rules and where each rule was read."""

from __future__ import annotations

import argparse
from typing import Any

from onnxhal.simulators.profiles import Profile, load_profile, shipped_profiles


def _ref(p: Profile, table: str) -> str:
    src = p.table_sources.get(table)
    return f"  [{src.id}]" if src is not None else ""


def _compute_line(p: Profile) -> str:
    f32 = {"none": "refused" + (" (int8 QDQ groups only)" if p.int8_qdq_only else ""),
           "float16": "computed in fp16", "bfloat16": "computed in bf16", "float32": "computed in fp32"}[p.float32_as]
    return f"dtypes {', '.join(sorted(p.dtypes))}; float32 {f32}"


def cmd_list(args: argparse.Namespace) -> int:
    rows = [load_profile(n) for n in shipped_profiles()]
    width = max(len(p.name) for p in rows)
    for p in rows:
        sourced = "sourced rules" if p.sources else "no sources"
        print(f"{p.name:<{width}}  {p.type_name}  {len(p.ops):3d} ops  {sum(len(r) for r in p.op_rules.values()):3d} "
              f"op rules  {sourced:<13}  {p.description}")
    return 0


def profile_text(p: Profile) -> str:
    """The profile in words: device, limits with their sources, op list, op rules with theirs."""
    lines = [f"{p.name}: {p.description or p.type_name}", f"  file: {p.path}",
             f"  vendor: {p.vendor} ({p.vendor_id:#x}:{p.device_id:#x}), {p.type_name}" + _ref(p, "device")]
    lines.append(f"  compute: {_compute_line(p)}" + _ref(p, "compute"))
    for opt in p.float32_options:
        choices = ", ".join(f"{k} -> {v}" for k, v in sorted(opt.values.items()))
        lines.append(f"  provider option {opt.name}: float32 {choices}")
    lines.append(f"  shapes: {'static only' if p.static_shapes_only else 'dynamic allowed'}; rank <= {p.max_rank}; "
                 f"layout {p.preferred_layout}")
    lines.append(f"  memory: {p.capacity_bytes / 2**20:g} MiB{' shared with the host' if p.host_shared else ''}"
                 + _ref(p, "memory"))
    limits = [f"at least {p.min_partition_nodes} nodes (unless the whole graph)"] if p.min_partition_nodes else []
    limits += [f"at most {p.max_partition_nodes} nodes"] if p.max_partition_nodes else []
    if limits:
        lines.append(f"  partitions: {', '.join(limits)}" + _ref(p, "partitions"))
    peak = ", ".join(f"{k} {v:g}" for k, v in sorted(p.peak_tops.items()))
    lines.append(f"  performance: peak TOPS {peak}; {p.memory_bandwidth_gbps:g} GB/s" + _ref(p, "performance"))
    lines.append(f"  power: {p.idle_w:g} W idle, {p.active_w:g} W active" + _ref(p, "power"))
    lines.append(f"  numerics: rtol {p.rtol:g}, atol {p.atol:g}" + _ref(p, "numerics"))
    lines.append(f"  ops ({len(p.ops)}): {', '.join(sorted(p.ops))}" + (_ref(p, "ops") or _ref(p, "compute")))
    if p.op_rules:
        lines.append("  op rules:")
        for op in sorted(p.op_rules):
            for rule in p.op_rules[op]:
                lines.append(f"    {op}  [{rule.source.id}]" + (f"  {rule.note}" if rule.note else ""))
                lines += [f"      - {c}" for c in rule.lines()]
    if p.sources:
        lines.append("  sources:")
        for s in p.sources.values():
            lines.append(f"    {s.cite()}" + (f"  ({s.note})" if s.note and not s.estimate else ""))
    return "\n".join(lines)


def cmd_show(args: argparse.Namespace) -> int:
    print(profile_text(load_profile(args.name)))
    return 0


def add_profiles_parser(sub: Any) -> None:
    p = sub.add_parser("profiles", help="list the simulated devices' profiles, or show one with its rules and sources")
    ps = p.add_subparsers(dest="profiles_command", required=True)
    ps.add_parser("list", help="the shipped profiles").set_defaults(fn=cmd_list)
    show = ps.add_parser("show", help="one profile (a shipped name or a .toml path): rules and their sources")
    show.add_argument("name")
    show.set_defaults(fn=cmd_show)
