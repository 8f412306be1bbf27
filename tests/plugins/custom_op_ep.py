"""An EP library whose factory brings custom operators (``EpFactory.get_custom_op_domains``).

Domain ``com.example``: ``Triple`` (3 x its input), ``ScaleShift`` (``alpha`` x input + ``beta``,
float attributes, ``beta`` optional; its ``tag`` string and ``axes`` ints attributes are checked
and recorded), ``Fails`` (its kernel raises), ``LateAttribute`` (its kernel first reads an attribute
at run time), ``AsDouble`` (returns float64 where onnxruntime types the output like its float input). No ``execution_provider``: onnxruntime's CPU EP runs
them, as onnxruntime does for a custom op that names no EP. ``EpTriple`` names the library's own EP, which claims it and runs it with its kernel.
``CREATED`` records (node name, attributes read) for each kernel made.
"""

import numpy as np

from onnxhal import hal
from onnxhal.hal.errors import InvalidArgument

CREATED: list = []


class _Triple(hal.Kernel):
    def compute(self, inputs):
        return [inputs[0] * 3]


class Triple(hal.CustomOp):
    op_type = "Triple"

    def create_kernel(self, node):
        CREATED.append((node.name, node.domain, list(node.inputs), list(node.outputs), {}))
        return _Triple()


class _ScaleShift(hal.Kernel):
    def __init__(self, alpha, beta):
        self.alpha, self.beta = np.float32(alpha), np.float32(beta)

    def compute(self, inputs):
        return [(inputs[0] * self.alpha + self.beta).astype(inputs[0].dtype)]


class ScaleShift(hal.CustomOp):
    op_type = "ScaleShift"

    def create_kernel(self, node):
        a = node.attributes
        read = {"alpha": a["alpha"], "beta": a.get("beta", 0.0), "tag": a.get("tag"), "axes": a.get("axes"),
                "missing_in": "missing" in a}
        CREATED.append((node.name, node.domain, list(node.inputs), list(node.outputs), read))
        return _ScaleShift(read["alpha"], read["beta"])


class _Fails(hal.Kernel):
    def compute(self, inputs):
        raise InvalidArgument("Fails: this kernel refuses every input; use Triple")


class Fails(hal.CustomOp):
    op_type = "Fails"

    def create_kernel(self, node):
        return _Fails()


class _LateAttribute(hal.Kernel):
    def __init__(self, node):
        self.node = node

    def compute(self, inputs):
        return [inputs[0] * self.node.attributes["alpha"]]


class LateAttribute(hal.CustomOp):
    op_type = "LateAttribute"

    def create_kernel(self, node):
        return _LateAttribute(node)


class _AsDouble(hal.Kernel):
    def compute(self, inputs):
        return [inputs[0].astype(np.float64)]


class AsDouble(hal.CustomOp):
    op_type = "AsDouble"

    def create_kernel(self, node):
        return _AsDouble()


class EpTriple(hal.CustomOp):
    op_type = "EpTriple"
    execution_provider = "CustomOpsExecutionProvider"  # the library's own EP claims and runs it

    def create_kernel(self, node):
        CREATED.append((node.name, node.domain, list(node.inputs), list(node.outputs), {"on": "CustomOpsEp"}))
        return _Triple()


class CustomOpsEp(hal.Ep):
    name = "CustomOpsExecutionProvider"

    def get_capability(self, graph, support_info):
        for node in graph.nodes:
            if (node.domain, node.op_type) == ("com.example", "EpTriple"):
                support_info.add_single_node(node)

    def create_kernel(self, node, context):
        return EpTriple().create_kernel(node)


class CustomOpsFactory(hal.EpFactory):
    name = "CustomOpsExecutionProvider"
    vendor = "Example"
    version = "1.0.0"

    def __init__(self, api):
        self.api = api

    def get_supported_devices(self, hardware_devices):
        return [self.api.create_ep_device(self, d) for d in hardware_devices if d.type == hal.OrtHardwareDeviceType.CPU]

    def create_ep(self, devices, ep_metadata, session_options, logger):
        return CustomOpsEp()

    def get_custom_op_domains(self):
        return [hal.CustomOpDomain("com.example", [Triple(), ScaleShift(), Fails(), LateAttribute(), AsDouble(), EpTriple()])]


def create_ep_factories(registration_name, api, logger):
    return [CustomOpsFactory(api)]


def release_ep_factory(factory):
    pass
