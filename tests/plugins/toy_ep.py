"""The plugin contract of issue 2, verbatim, plus a minimal Ep: a test keeps it working."""

from onnxhal import hal


class ToyEp(hal.Ep):
    name = "ToyExecutionProvider"


class ToyFactory(hal.EpFactory):
    name = "ToyExecutionProvider"; vendor = "Toy"; vendor_id = 0; version = "0.1.0"  # noqa: E702
    def __init__(self, api):
        self.api = api
    def get_supported_devices(self, hardware_devices):
        return [self.api.create_ep_device(self, d, ep_metadata={"k": "v"}, ep_options={"opt": "1"})
                for d in hardware_devices if d.type == hal.OrtHardwareDeviceType.CPU]
    def create_ep(self, devices, ep_metadata, session_options, logger):
        return ToyEp()

def create_ep_factories(registration_name, api, logger):
    return [ToyFactory(api)]

def release_ep_factory(factory):
    pass
