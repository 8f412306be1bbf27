"""Four toy EPs for selection tests, written against the public plugin contract.

ZNpuEP on a virtual NPU; GpuEP on a discrete and an integrated virtual GPU; AmdCpuEP whose vendor
matches the CPU's (by vendor id); OtherCpuEP on the CPU with an unrelated vendor. Each Ep records
the devices it was created with and claims nothing (so every node falls back to the CPU EP).
"""

from onnxhal import hal

CREATED: list = []  # (ep name, hardware devices, ep_metadata, session options) per create_ep


class RecordingEp(hal.Ep):
    def __init__(self, name, devices):
        self.name = name
        self.devices = list(devices)


class _Factory(hal.EpFactory):
    def __init__(self, api):
        self.api = api

    def create_ep(self, devices, ep_metadata, session_options, logger):
        CREATED.append((self.name, list(devices), list(ep_metadata), session_options))
        return RecordingEp(self.name, devices)


class ZNpuFactory(_Factory):
    name = "ZNpuEP"; vendor = "NpuVendor"; vendor_id = 0x1111  # noqa: E702

    def get_supported_devices(self, hardware_devices):
        hw = self.api.create_hardware_device(hal.OrtHardwareDeviceType.NPU, 0x1111, 1, "NpuVendor")
        return [self.api.create_ep_device(self, hw, ep_options={"npu_opt": "default"})]


class GpuFactory(_Factory):
    name = "GpuEP"; vendor = "GpuVendor"; vendor_id = 0  # noqa: E702

    def get_supported_devices(self, hardware_devices):
        integrated = self.api.create_hardware_device(hal.OrtHardwareDeviceType.GPU, 0x2222, 1, "Other")
        discrete = self.api.create_hardware_device(hal.OrtHardwareDeviceType.GPU, 0x2222, 2, "Other",
                                                   {"Discrete": "1"})
        return [self.api.create_ep_device(self, integrated, ep_metadata={"which": "integrated"}),
                self.api.create_ep_device(self, discrete, ep_metadata={"which": "discrete"})]


class AmdCpuFactory(_Factory):
    name = "AmdCpuEP"; vendor = "SomeCpuVendor"  # noqa: E702

    def get_supported_devices(self, hardware_devices):
        cpu = [d for d in hardware_devices if d.type == hal.OrtHardwareDeviceType.CPU][0]
        self.vendor_id = cpu.vendor_id  # matches the machine's CPU by vendor id
        return [self.api.create_ep_device(self, cpu)]


class OtherCpuFactory(_Factory):
    name = "OtherCpuEP"; vendor = "Nobody"; vendor_id = 0  # noqa: E702

    def get_supported_devices(self, hardware_devices):
        return [self.api.create_ep_device(self, d) for d in hardware_devices if d.type == hal.OrtHardwareDeviceType.CPU]


def create_ep_factories(registration_name, api, logger):
    # Registration order differs from the sorted order on purpose.
    return [OtherCpuFactory(api), GpuFactory(api), AmdCpuFactory(api), ZNpuFactory(api)]


def release_ep_factory(factory):
    pass
