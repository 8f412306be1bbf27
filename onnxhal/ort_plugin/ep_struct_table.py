"""Member order of onnxruntime's plugin structs and the API version each member arrived in.

Facts from onnxruntime's public header ``include/onnxruntime/core/session/onnxruntime_ep_c_api.h``
(microsoft/onnxruntime): the member order of its newest revision, and the version each member
arrived in from the ``\\since Version 1.N`` notes of the 1.24 revision. For members after
``IsConcurrentRunSupported`` the version is the first API version at which onnxruntime 1.32 calls
the member (the bridge declaring 24, 25, ... 32; docs/onnxruntime-plugin.md); None where that was
not observed: such a member arrived between the versions of its neighbours and the bridge leaves it
NULL.
"""

#: The newest API version these tables describe completely.
NEWEST_VERSION = 32

# (member, API version it arrived in), in the struct's order after ``ort_version_supported``.
ORT_EP: list[tuple[str, int | None]] = [
    ("GetName", 22),
    ("GetCapability", 23),
    ("Compile", 23),
    ("ReleaseNodeComputeInfos", 23),
    ("GetPreferredDataLayout", 23),
    ("ShouldConvertDataLayoutForOp", 23),
    ("SetDynamicOptions", 23),
    ("OnRunStart", 23),
    ("OnRunEnd", 23),
    ("CreateAllocator", 23),
    ("CreateSyncStreamForDevice", 23),
    ("GetCompiledModelCompatibilityInfo", 23),
    ("GetKernelRegistry", 24),
    ("IsConcurrentRunSupported", 24),
    ("Sync", 25),
    ("CreateProfiler", 25),
    ("IsGraphCaptureEnabled", 26),
    ("IsGraphCaptured", None),
    ("ReplayGraph", None),
    ("GetGraphCaptureNodeAssignmentPolicy", None),
    ("GetAvailableResource", None),
    ("OnSessionInitializationEnd", 27),
    ("GetDefaultMemoryDevice", 27),
    ("ReleaseCapturedGraph", None),
    ("GetWeightlessSupport", None),
]

ORT_EP_FACTORY: list[tuple[str, int | None]] = [
    ("GetName", 22),
    ("GetVendor", 22),
    ("GetSupportedDevices", 22),
    ("CreateEp", 22),
    ("ReleaseEp", 22),
    ("GetVendorId", 23),
    ("GetVersion", 23),
    ("ValidateCompiledModelCompatibilityInfo", 23),
    ("CreateAllocator", 23),
    ("ReleaseAllocator", 23),
    ("CreateDataTransfer", 23),
    ("IsStreamAware", 23),
    ("CreateSyncStreamForDevice", 23),
    ("GetHardwareDeviceIncompatibilityDetails", 24),
    ("CreateExternalResourceImporterForDevice", 24),
    ("GetNumCustomOpDomains", 24),
    ("GetCustomOpDomains", 24),
    ("InitGraphicsInterop", None),
    ("DeinitGraphicsInterop", None),
    ("SelectBestModelCandidate", None),
]

#: OrtEpApi, the table of functions onnxruntime gives an EP library: (function, API version), by slot.
ORT_EP_API: list[tuple[str, int]] = [
    ("CreateEpDevice", 22),
    ("ReleaseEpDevice", 22),
    ("EpGraphSupportInfo_AddNodesToFuse", 23),
    ("EpGraphSupportInfo_AddSingleNode", 23),
    ("NodeComputeContext_NodeName", 23),
    ("EpDevice_AddAllocatorInfo", 23),
    ("MemoryInfo_GetMemoryDevice", 23),
    ("Value_GetMemoryDevice", 23),
    ("MemoryDevice_AreEqual", 23),
    ("MemoryDevice_GetDeviceType", 23),
    ("MemoryDevice_GetMemoryType", 23),
    ("MemoryDevice_GetVendorId", 23),
    ("MemoryDevice_GetDeviceId", 23),
    ("SyncStream_GetImpl", 23),
    ("SyncStream_GetSyncId", 23),
    ("GetSyncIdForLastWaitOnSyncStream", 23),
    ("CreateHardwareDevice", 24),
    ("ReleaseHardwareDevice", 24),
    ("CreateKernelRegistry", 24),
    ("ReleaseKernelRegistry", 24),
    ("KernelRegistry_AddKernel", 24),
    ("CreateKernelDefBuilder", 24),
    ("ReleaseKernelDefBuilder", 24),
    ("KernelDefBuilder_SetOperatorType", 24),
    ("KernelDefBuilder_SetDomain", 24),
    ("KernelDefBuilder_SetSinceVersion", 24),
    ("KernelDefBuilder_SetExecutionProvider", 24),
    ("KernelDefBuilder_SetInputMemType", 24),
    ("KernelDefBuilder_SetOutputMemType", 24),
    ("KernelDefBuilder_AddTypeConstraint", 24),
    ("KernelDefBuilder_AddInputOutputAliases", 24),
    ("KernelDefBuilder_AddInputOutputMutableAliases", 24),
    ("KernelDefBuilder_Build", 24),
    ("ReleaseKernelDef", 24),
    ("KernelDef_GetOperatorType", 24),
    ("KernelDef_GetDomain", 24),
    ("KernelDef_GetSinceVersion", 24),
    ("KernelDef_GetExecutionProvider", 24),
    ("KernelDef_GetInputMemType", 24),
    ("KernelDef_GetOutputMemType", 24),
    ("GetTensorDataType", 24),
    ("EpGraphSupportInfo_LookUpKernel", 24),
    ("SharedPrePackedWeightCache_StoreWeightData", 24),
    ("KernelInfo_GetEp", 24),
    ("DeviceEpIncompatibilityDetails_SetDetails", 24),
    ("CreateIfKernel", 24),
    ("CreateLoopKernel", 24),
    ("CreateScanKernel", 24),
    ("ReleaseKernelImpl", 24),
    ("GetEnvConfigEntries", 24),
]
