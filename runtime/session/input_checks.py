"""Feed validation: names, dtypes, ranks and fixed dimensions, with errors that say what to send."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from onnxhal.hal import DeviceTensor, ValueInfo
from onnxhal.hal.errors import InvalidArgument


def _describe(dtype: Any, shape: Any) -> str:
    dims = ",".join("?" if d is None else str(d) for d in shape) if shape is not None else "?"
    return f"{dtype} [{dims}]"


def _unwrap(value: Any) -> Any:
    inner = getattr(value, "_value", None)  # OrtValue
    return inner if inner is not None or type(value).__name__ == "OrtValue" else value


def check_feeds(feed: Mapping[str, Any], infos: Mapping[str, ValueInfo], required: list[str]) -> dict[str, Any]:
    if not isinstance(feed, Mapping):
        raise InvalidArgument(f"input_feed must be a dict of input name -> numpy array, got {type(feed).__name__}")
    out: dict[str, Any] = {}
    for name, value in feed.items():
        info = infos.get(name)
        if info is None:
            raise InvalidArgument(f"Invalid input name: {name!r}. The model's inputs are {list(infos)}.")
        out[name] = _check_one(name, _unwrap(value), info)
    missing = [n for n in required if n not in out]
    if missing:
        # onnxruntime's wording first (tools match on it), then what each missing input expects.
        expect = ", ".join(f"{n!r} ({_describe(infos[n].dtype, infos[n].shape)})" for n in missing)
        raise InvalidArgument(f"Required inputs ({missing}) are missing from input feed ({list(feed)}). "
                              f"Add them to input_feed: {expect}.")
    return out


class FeedChecker:
    """``check_feeds`` for one session, its per-input expectations read once from the model.

    Reading a ``ValueInfo``'s dtype and shape walks its TypeProto (about 2 us an input); a run's
    feeds are checked against the tuples built here. Plain numpy arrays whose dtype, rank and fixed
    dims match pass in a few comparisons (a string input's ``U`` or object array is then made an
    object array of str, as ``check_feeds`` makes it); anything else (a missing or unknown name, a
    mismatch, bytes, lists, OrtValues) goes through ``check_feeds``, which accepts or refuses it with
    the usual typed errors. A map or sequence input's dict or list is passed as given, as
    ``check_feeds`` passes it (its kernels check it).
    """

    __slots__ = ("infos", "required", "_expect", "_required_set", "_ordered")

    def __init__(self, infos: Mapping[str, ValueInfo], required: list[str]) -> None:
        self.infos = infos
        self.required = required
        self._required_set = frozenset(required)
        #: name -> (dtype, rank, ((axis, fixed dim), ...)) for the inputs the quick check covers
        self._expect: dict[str, tuple[np.dtype | None, int, tuple[tuple[int, int], ...]]] = {}
        for name, info in infos.items():
            if not info.is_tensor:  # a map or a sequence: check_feeds passes it through, to the kernels
                self._expect[name] = _PASS
                continue
            dtype, shape = info.dtype, info.shape
            if dtype is None or shape is None:
                continue
            dtype = _OBJECT if dtype == _OBJECT else dtype  # check() tests strings by identity
            self._expect[name] = (dtype, len(shape), tuple((a, d) for a, d in enumerate(shape) if isinstance(d, int)))
        #: ``ordered_specs``
        ordered = [(n, *self._expect[n]) for n in required if n in self._expect]
        self._ordered = tuple(ordered) if len(ordered) == len(required) else None

    @property
    def ordered_specs(self) -> tuple[tuple[str, np.dtype | None, int, tuple[tuple[int, int], ...]], ...] | None:
        """(name, dtype, rank, ((axis, fixed dim), ...)) of each required input in ``required``
        order, the tuples ``check`` tests plain arrays against: dtype ``np.dtype(object)`` for a
        string input (a str or object array passes, made an object array of str by
        ``stringified``), None for a map or sequence input (a dict or list passes as given). None
        when an input's type or rank is unknown (``check`` sends every feed of it through
        ``check_feeds``)."""
        return self._ordered

    def check(self, feed: Mapping[str, Any]) -> dict[str, Any]:
        """The feeds as the kernels get them; a typed ``InvalidArgument`` for a wrong one."""
        if feed.__class__ is not dict:
            return check_feeds(feed, self.infos, self.required)
        expect = self._expect
        strings = None
        for name, value in feed.items():
            spec = expect.get(name)
            if spec is _PASS and (value.__class__ is dict or value.__class__ is list):
                continue
            if spec is None or value.__class__ is not np.ndarray:
                return check_feeds(feed, self.infos, self.required)
            dtype, rank, fixed = spec
            if value.ndim != rank:
                return check_feeds(feed, self.infos, self.required)
            if dtype is _OBJECT:  # a string input: str or object elements, made str below
                if value.dtype.kind not in "UO":
                    return check_feeds(feed, self.infos, self.required)
                strings = [name] if strings is None else [*strings, name]
            elif value.dtype != dtype:
                return check_feeds(feed, self.infos, self.required)
            if fixed:
                shape = value.shape
                for axis, dim in fixed:
                    if shape[axis] != dim:
                        return check_feeds(feed, self.infos, self.required)
        if not self._required_set.issubset(feed):
            return check_feeds(feed, self.infos, self.required)
        out = dict(feed)
        if strings is not None:
            for name in strings:
                out[name] = stringified(out[name])
        return out


_PASS = (None, -1, ())  # FeedChecker: a non-tensor input, a dict or list passed as given
_OBJECT = np.dtype(object)  # a ValueInfo's string dtype is this one object (numpy caches builtin dtypes)


def _decode(name: str, item: Any) -> Any:
    if isinstance(item, (bytes, np.bytes_, np.void)):
        try:
            return bytes(item).decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidArgument(f"input {name!r}: a string element is not UTF-8 ({e}); ONNX strings are UTF-8 text. "
                                  "Decode it yourself, or pass str values.") from None
    return item


def _as_strings(name: str, value: Any) -> Any:
    """A string input given as onnxruntime takes it: a (nested) list of str or bytes, or a bytes
    (``S``) or void (``V``) array, as an object array of str. Bytes are decoded as UTF-8 (onnxruntime
    turns a list's bytes into their repr, "b'a'", and reads an ``S`` array's elements past their end)."""
    if isinstance(value, list):
        arr = np.empty(np.shape(np.array(value, dtype=object)), dtype=object)
        flat = np.array(value, dtype=object).reshape(-1)
        arr.reshape(-1)[:] = [_decode(name, v) for v in flat]
        return arr
    if isinstance(value, np.ndarray) and value.dtype.kind in "SV":
        return np.vectorize(lambda v: _decode(name, v), otypes=[object])(value) if value.size else \
            np.empty(value.shape, dtype=object)
    return value


def _check_one(name: str, value: Any, info: ValueInfo) -> Any:
    if not info.is_tensor:
        return value  # sequences, maps and optionals are passed through; kernels check them
    if info.dtype == np.dtype(object):
        value = _as_strings(name, value)
    if isinstance(value, DeviceTensor):
        got_dtype, got_shape = value.dtype, value.shape
    else:
        if isinstance(value, list) and info.dtype is not None:
            value = _from_list(name, value, info)
        if not isinstance(value, np.ndarray):
            if isinstance(value, (list, tuple, int, float, bool, str, np.generic)):
                raise InvalidArgument(
                    f"input {name!r} expects a numpy array of {_describe(info.dtype, info.shape)}, got "
                    f"{type(value).__name__}. Wrap it: np.asarray(value, dtype={_numpy_name(info.dtype)}).")
            raise InvalidArgument(f"input {name!r}: unsupported value of type {type(value).__name__}; pass a numpy "
                                  "array or an OrtValue")
        got_dtype, got_shape = value.dtype, value.shape
    want = info.dtype
    if want is not None:
        ok = got_dtype == want or (want == np.dtype(object) and got_dtype.kind in "UO")
        if not ok:
            raise InvalidArgument(
                f"input {name!r} expects {_describe(want, info.shape)}, got {_describe(got_dtype, got_shape)}: "
                f"wrong element type. Convert it with .astype({_numpy_name(want)}).")
        if want == np.dtype(object) and isinstance(value, np.ndarray):
            value = stringified(value)
    shape = info.shape
    if shape is not None:
        if len(shape) != len(got_shape):
            raise InvalidArgument(
                f"input {name!r} expects {_describe(want, shape)}, got {_describe(got_dtype, got_shape)}: "
                f"rank {len(got_shape)} where the model wants rank {len(shape)}.")
        for axis, (w, g) in enumerate(zip(shape, got_shape)):
            if isinstance(w, int) and w != g:
                raise InvalidArgument(
                    f"input {name!r} expects {_describe(want, shape)}, got {_describe(got_dtype, got_shape)}: "
                    f"dimension {axis} must be {w}.")
    return value


def _from_list(name: str, value: list, info: ValueInfo) -> np.ndarray:
    """A (nested) list fed to a numeric tensor input, as onnxruntime takes it: an array of the input's
    element type (a float list into an integer input truncates, as there). Ragged lists, strings and
    values the type cannot hold are refused with onnxruntime's words and the remedy."""
    want = info.dtype
    if want == np.dtype(object):
        return value  # string inputs: _as_strings made it already
    try:
        if any(isinstance(x, (str, bytes)) for x in _leaves(value)):
            raise ValueError("the list holds strings")
        return np.asarray(value, dtype=want)
    except (ValueError, TypeError, OverflowError) as e:
        raise InvalidArgument(f"Could not create tensor from given input list for input {name!r} "
                              f"({_describe(want, info.shape)}): {e}. Pass a rectangular list of numbers, or "
                              f"np.asarray(value, dtype={_numpy_name(want)}).") from None


def _leaves(value: list) -> Any:
    for x in value:
        if isinstance(x, list):
            yield from _leaves(x)
        else:
            yield x


def _numpy_name(dtype: Any) -> str:
    """How to write the dtype in numpy code (numpy 2 has no ``np.object``)."""
    return "object" if dtype == np.dtype(object) else f"np.{dtype}"


def stringified(value: np.ndarray) -> np.ndarray:
    """A string input as an object array of str: numpy str arrays are converted, and in an object
    array every element that is not a str becomes ``str(element)``, as onnxruntime converts them
    (the string kernels expect str elements, never integers or None). An object array of str
    only is returned as it is."""
    if value.dtype.kind == "U":
        return value.astype(object)
    flat = value.ravel()
    if all(type(x) is str for x in flat):
        return value
    return np.array([x if isinstance(x, str) else str(x) for x in flat], dtype=object).reshape(value.shape)
