"""Public home of onnxhal's error types (defined in onnxhal.hal.errors so every layer can raise them)."""

from onnxhal.hal.errors import *  # noqa: F403
from onnxhal.hal.errors import __all__  # noqa: F401
