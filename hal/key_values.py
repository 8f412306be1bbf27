"""A read-only str -> str mapping that prints as a dict, as onnxruntime's device metadata does."""

from __future__ import annotations

from collections.abc import Iterator, Mapping


class ReadOnlyKeyValues(Mapping[str, str]):
    """``OrtHardwareDevice.metadata``: a frozen copy of str -> str pairs. Reads like a dict, compares
    equal to a dict with the same items and prints as one (``{'pci_bus_id': '0000:01:00.0'}``), where
    ``types.MappingProxyType`` would print ``mappingproxy({...})``; item assignment raises TypeError."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, str] | None = None) -> None:
        self._items = {str(k): str(v) for k, v in (items or {}).items()}

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return repr(self._items)

    def __eq__(self, other: object) -> bool:
        return dict(self._items) == dict(other) if isinstance(other, Mapping) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a mapping: unhashable, like dict
