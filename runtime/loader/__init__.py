"""Loading a model: bytes, path or ModelProto in, a checked hal.Graph out."""
