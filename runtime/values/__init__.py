"""Values: OrtValue, IOBinding, OrtValueVector, DLPack, sparse tensors, LoRA adapters."""
