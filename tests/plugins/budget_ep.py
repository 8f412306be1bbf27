"""An EP library whose EP answers ``get_available_resource`` (onnxruntime's GetAvailableResource).

onnxruntime 1.32 keeps a resource budget during partitioning only for an EP named
``CUDAExecutionProvider`` (its resource_accountant.cc makes the accountant for that name, when the
session config entry ``session.resource_cuda_partitioning_settings`` is set), and asks the EP for
the budget through ``OrtEp::GetAvailableResource`` when the entry gives none. So this EP takes that
name (the CPU-only onnxruntime wheel has no CUDA EP of its own). It claims each Add as a group of
its own, computed in numpy; ``BUDGET["bytes"]`` is what ``get_available_resource`` answers (None:
not known), ``ASKED`` counts the calls.
"""

import numpy as np

from onnxhal import hal

BUDGET: dict = {"bytes": None}
ASKED: list = []


class AddCompute(hal.NodeComputeInfo):
    def __init__(self, graph):
        node = graph.nodes[0]
        self.inputs, self.node = graph.input_names, node
        self.consts = dict(graph.initializers)

    def compute(self, state, ctx):
        env = dict(self.consts)
        env.update(zip(self.inputs, ctx.inputs))
        ctx.set_output(0, np.add(*[env[i] for i in self.node.inputs]).astype(np.float32))


class BudgetEp(hal.Ep):
    name = "CUDAExecutionProvider"

    def get_capability(self, graph, support_info):
        for n in graph.nodes:
            if n.op_type == "Add":
                support_info.add_nodes_to_fuse([n])

    def compile(self, graphs, fused_nodes):
        return [AddCompute(g) for g in graphs]

    def get_available_resource(self):
        ASKED.append(BUDGET["bytes"])
        return BUDGET["bytes"]


class BudgetFactory(hal.EpFactory):
    name = "CUDAExecutionProvider"
    vendor = "Example"
    version = "1.0.0"

    def __init__(self, api):
        self.api = api

    def get_supported_devices(self, hardware_devices):
        return [self.api.create_ep_device(self, d) for d in hardware_devices if d.type == hal.OrtHardwareDeviceType.CPU]

    def create_ep(self, devices, ep_metadata, session_options, logger):
        return BudgetEp()


def create_ep_factories(registration_name, api, logger):
    return [BudgetFactory(api)]


def release_ep_factory(factory):
    pass
