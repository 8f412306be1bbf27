"""An EP library whose factory brings ``com.example.AddTensor``: its input plus its tensor attribute
``bias`` (broadcast), and ``com.example.HasBody``, whose kernel records whether it sees its graph
attribute ``body``. ``READ`` records what each kernel read. onnxruntime's CPU EP runs both."""


from onnxhal import hal

READ: list = []


class _Add(hal.Kernel):
    def __init__(self, bias):
        self.bias = bias

    def compute(self, inputs):
        return [(inputs[0] + self.bias).astype(inputs[0].dtype)]


class AddTensor(hal.CustomOp):
    op_type = "AddTensor"

    def create_kernel(self, node):
        bias = node.attributes["bias"]
        READ.append((node.name, type(bias).__name__, str(bias.dtype), list(bias.shape)))
        return _Add(bias)


class _Copy(hal.Kernel):
    def compute(self, inputs):
        return [inputs[0].copy()]


class HasBody(hal.CustomOp):
    op_type = "HasBody"

    def create_kernel(self, node):
        READ.append((node.name, repr(node.attributes.get("body"))))
        return _Copy()


class TensorAttrEp(hal.Ep):
    name = "TensorAttrExecutionProvider"


class TensorAttrFactory(hal.EpFactory):
    name = "TensorAttrExecutionProvider"
    vendor = "Example"
    version = "1.0.0"

    def __init__(self, api):
        self.api = api

    def get_supported_devices(self, hardware_devices):
        return [self.api.create_ep_device(self, d) for d in hardware_devices if d.type == hal.OrtHardwareDeviceType.CPU]

    def create_ep(self, devices, ep_metadata, session_options, logger):
        return TensorAttrEp()

    def get_custom_op_domains(self):
        return [hal.CustomOpDomain("com.example", [AddTensor(), HasBody()])]


def create_ep_factories(registration_name, api, logger):
    return [TensorAttrFactory(api)]


def release_ep_factory(factory):
    pass
