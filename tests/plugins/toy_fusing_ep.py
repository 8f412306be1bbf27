"""A configurable toy EP library, written only against the public plugin contract.

Two EP names (ToyA, ToyB), each offered on two virtual NPUs. Provider options choose what an
instance claims: ``ops`` (comma list), ``mode`` ("fuse": one group per connected run, "group":
all claimed nodes as a single group even if that is invalid, "single": add_single_node, "script":
the groups named by ``groups``, node names joined by "+" and groups by ";", then the single nodes
named by ``singles``, comma-separated, repeats kept),
``fail`` ("compile" or "capability"), ``lose_after`` (N: the device is lost after N runs). Fused groups are compiled into a small numpy interpreter.
In "fuse" mode each group is compiled while it is claimed, on the graph ``compile`` will receive
(``filtered_graph``), and ``compile`` keeps that result: the "trials_kept" event counts them.
"""

import threading
import weakref

import numpy as np

from onnxhal import hal
from onnxhal.errors import EPFail

LOG: list = []  # (event, ep name, device id, details)

_OPS = {"Add": np.add, "Mul": np.multiply, "Sub": np.subtract, "Relu": lambda x: np.maximum(x, 0)}


class _Compute(hal.NodeComputeInfo):
    def __init__(self, graph, ep=None):
        self.ep = ep
        self.nodes = [(n.op_type, list(n.inputs), list(n.outputs)) for n in graph.nodes]
        self.inputs = graph.input_names
        self.outputs = graph.output_names
        self.consts = dict(graph.initializers)

    def create_state(self, fused_node):
        return {"name": fused_node.name}

    def compute(self, state, ctx):
        if self.ep is not None and self.ep.lose_after >= 0:
            with self.ep.lock:
                self.ep.runs += 1
                if self.ep.runs > self.ep.lose_after:
                    raise EPFail(f"{self.ep.name}: device lost after {self.ep.lose_after} runs")
        env = dict(self.consts)
        env.update(zip(self.inputs, ctx.inputs))
        for op, ins, outs in self.nodes:
            env[outs[0]] = _OPS[op](*[env[i] for i in ins]).astype(np.float32)
        for k, o in enumerate(self.outputs):
            ctx.set_output(k, env[o])


class _Kernel(hal.Kernel):
    def __init__(self, op):
        self.fn = _OPS[op]

    def compute(self, inputs):
        return [self.fn(*inputs).astype(np.float32)]


class ToyEp(hal.Ep):
    def __init__(self, name, device, options):
        self.name = name
        self.device = device
        self.ops = set(filter(None, options.get("ops", "Add,Mul").split(",")))
        self.mode = options.get("mode", "fuse")
        self.script = (options.get("groups", ""), options.get("singles", ""))
        self.fail = options.get("fail", "")
        self.lose_after = int(options.get("lose_after", "-1"))  # device lost after N runs
        self.runs = 0
        self.lock = threading.Lock()
        self.trials = weakref.WeakKeyDictionary()  # filtered graph -> its _Compute, made while claiming

    def get_capability(self, graph, support_info):
        LOG.append(("capability", self.name, self.device.device_id, graph.name))
        if self.fail == "capability":
            raise RuntimeError("capability probe failed")
        mine = [n for n in graph.nodes if n.op_type in self.ops]
        if self.mode == "script":
            by_name = {n.name: n for n in graph.nodes}
            for group in filter(None, self.script[0].split(";")):
                if all(name in by_name for name in group.split("+")):
                    support_info.add_nodes_to_fuse([by_name[name] for name in group.split("+")])
            for name in filter(None, self.script[1].split(",")):
                if name in by_name:
                    support_info.add_single_node(by_name[name])
        elif self.mode == "single":
            for n in mine:
                support_info.add_single_node(n)
        elif self.mode == "group":
            if mine:
                support_info.add_nodes_to_fuse(mine)
        else:
            options = hal.NodeFusionOptions(drop_constant_initializers=True)
            for group in _connected_runs(graph, mine):
                part = support_info.filtered_graph(group, options)
                self.trials[part] = _Compute(part, self)
                support_info.add_nodes_to_fuse(group, options)

    def compile(self, graphs, fused_nodes):
        LOG.append(("compile", self.name, self.device.device_id,
                    [(g.input_names, g.output_names, len(g.nodes)) for g in graphs]))
        if self.fail == "compile":
            raise RuntimeError("program build failed")
        kept = [self.trials.pop(g, None) for g in graphs]
        LOG.append(("trials_kept", self.name, self.device.device_id, sum(k is not None for k in kept)))
        return [k if k is not None else _Compute(g, self) for k, g in zip(kept, graphs)]

    def create_kernel(self, node, context):
        return _Kernel(node.op_type)


def _connected_runs(graph, nodes):
    ids = {id(n) for n in nodes}
    groups, seen = [], set()
    for n in nodes:
        if id(n) in seen:
            continue
        group, stack = [], [n]
        seen.add(id(n))
        while stack:
            cur = stack.pop()
            group.append(cur)
            nbrs = [graph.producer(i) for i in cur.inputs if i] + [c for o in cur.outputs for c in graph.consumers(o)]
            for m in nbrs:
                if m is not None and id(m) in ids and id(m) not in seen:
                    seen.add(id(m))
                    stack.append(m)
        groups.append(group)
    return groups


class ToyFactory(hal.EpFactory):
    vendor = "Toy"
    version = "1.0.0"

    def __init__(self, api, name):
        self.api = api
        self.name = name
        self.hw = [api.create_hardware_device(hal.OrtHardwareDeviceType.NPU, 0x7070, i, "Toy", {"index": str(i)})
                   for i in (0, 1)]

    def get_supported_devices(self, hardware_devices):
        return [self.api.create_ep_device(self, hw) for hw in self.hw]

    def create_ep(self, devices, ep_metadata, session_options, logger):
        options = session_options.provider_options_for(self.name)
        LOG.append(("create_ep", self.name, devices[0].device_id, dict(options)))
        return ToyEp(self.name, devices[0], options)


def create_ep_factories(registration_name, api, logger):
    return [ToyFactory(api, "ToyA"), ToyFactory(api, "ToyB")]


def release_ep_factory(factory):
    pass
