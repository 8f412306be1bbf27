"""ai.onnx.ml's encoders, mappers and feature plumbing, vectorized, as onnxruntime computes them:
LabelEncoder (opsets 1, 2, 4), CategoryMapper, OneHotEncoder, Imputer, ArrayFeatureExtractor,
FeatureVectorizer, DictVectorizer and CastMap.

Lookups of numeric keys are one ``searchsorted`` over the sorted keys; lookups of strings map each
distinct input string once (``np.unique``) and gather the results, so a batch costs a few numpy
calls whatever its size."""

from __future__ import annotations

from itertools import repeat

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.ep import INLINE_APPLY
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.ml_common import ML
from onnxhal.runtime.providers.cpu.kernels.registry import register

_MISSING = object()  # a lookup's marker for a key the table lacks
_SMALL = 4096  # Imputer: elements of an input whose imputed values are kept at its shape
_SPAN = 1024  # OneHotEncoder: integer categories within this span of values gather their rows


def _is_text(x: np.ndarray) -> bool:
    return x.dtype.kind in "OUS"


def _as_text(values) -> np.ndarray:
    """Strings (and bytes, as onnx decodes some string attributes) as an object array of str."""
    out = np.empty(len(values), dtype=object)
    out[:] = [_text(v) for v in values]
    return out


def _text(v) -> str:
    return v.decode("utf-8", errors="surrogateescape") if isinstance(v, bytes) else str(v)


class Lookup:
    """A vectorized map from keys to values with a default for keys it does not hold. Numeric
    keys: searchsorted over the sorted keys (NaN keys match NaN inputs); string keys: a dict
    applied once per distinct input string."""

    def __init__(self, keys: np.ndarray, values: np.ndarray, default, what: str) -> None:
        if len(keys) != len(values):
            raise InvalidArgument(f"{what}: {len(keys)} keys for {len(values)} values; give one value per key.")
        self.text_keys = _is_text(keys)
        self.values = values
        self.default = np.asarray(default, dtype=values.dtype if values.dtype != object else object)
        self.default_value = self.default.item() if self.default.dtype != object else self.default.tolist()
        if self.text_keys:
            keys = _as_text(keys)
            self.table = {}
            for k, v in zip(keys.tolist(), values.tolist()):
                self.table.setdefault(k, v)  # the first of duplicate keys, as onnxruntime's map insert
            self.get = self.table.get
            self.numeric_values = values.dtype.kind != "O"
            self.int_values = values.dtype.kind in "iu"
        else:
            nan = np.isnan(keys) if keys.dtype.kind == "f" else np.zeros(len(keys), bool)
            self.nan_value = values[np.argmax(nan)] if nan.any() else None
            keep = ~nan
            k, v = keys[keep], values[keep]
            k, first = np.unique(k, return_index=True)  # sorted, first occurrence of duplicates
            self.keys, self.sorted_values = k, v[first]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        dtype = self.values.dtype
        if self.text_keys:
            if x.dtype.kind not in "OUS":
                raise InvalidArgument(f"input of type {x.dtype} for string keys; feed a string tensor.")
            # one dict lookup per element (cheaper than sorting the strings to look each up once), in
            # C through map; an element it misses (bytes, a non-str, an unknown key) sends the whole
            # batch through the decoding lookup
            flat = x.ravel().tolist()
            get = self.get
            if self.numeric_values:  # straight into the array; a miss fails the conversion
                try:
                    # a miss is None, which no integer takes; a float takes None (as NaN), not the marker
                    found = map(get, flat) if self.int_values else map(get, flat, repeat(_MISSING, len(flat)))
                    return np.fromiter(found, dtype, len(flat)).reshape(x.shape)
                except TypeError:
                    pass
            mapped = list(map(get, flat, repeat(_MISSING, len(flat))))
            if _MISSING in mapped:
                default = self.default_value
                mapped = [get(v if v.__class__ is str else _text(v), default) for v in flat]
            if self.numeric_values:
                return np.array(mapped, dtype).reshape(x.shape)
            out = np.empty(len(mapped), dtype)
            out[:] = mapped
            return out.reshape(x.shape)
        if _is_text(x):
            raise InvalidArgument(f"string input for numeric keys of type {self.keys.dtype}; feed a numeric tensor.")
        flat = x.reshape(-1).astype(self.keys.dtype, copy=False)
        if self.keys.size:
            pos = np.minimum(np.searchsorted(self.keys, flat), self.keys.size - 1)
            out = np.where(self.keys[pos] == flat, self.sorted_values[pos], self.default)
        else:
            out = np.full(flat.shape, self.default, dtype=dtype)
        if self.nan_value is not None and flat.dtype.kind == "f":
            out[np.isnan(flat)] = self.nan_value
        return out.reshape(x.shape)


def _label_encoder_arrays(node: Node) -> tuple[np.ndarray, np.ndarray, object]:
    """Keys, values and default of a LabelEncoder (opset 2 attributes, or opset 4's tensors)."""
    name = f"LabelEncoder node {node.name!r}"
    keys = node.attr("keys_tensor")
    if keys is None:
        found = [(k, node.attr(k)) for k in ("keys_strings", "keys_int64s", "keys_floats") if node.attr(k) is not None]
        if len(found) != 1:
            raise InvalidArgument(f"{name}: exactly one of keys_strings, keys_int64s, keys_floats (or keys_tensor) "
                                  f"must be given, got {[k for k, _ in found] or 'none'}.")
        kind, raw = found[0]
        keys = _as_text(raw) if kind == "keys_strings" else np.asarray(raw, np.int64 if kind == "keys_int64s"
                                                                        else np.float32)
    elif _is_text(keys):
        keys = _as_text(keys.reshape(-1))
    values = node.attr("values_tensor")
    default = None
    if values is None:
        found = [(k, node.attr(k)) for k in ("values_strings", "values_int64s", "values_floats")
                 if node.attr(k) is not None]
        if len(found) != 1:
            raise InvalidArgument(f"{name}: exactly one of values_strings, values_int64s, values_floats (or "
                                  f"values_tensor) must be given, got {[k for k, _ in found] or 'none'}.")
        kind, raw = found[0]
        if kind == "values_strings":
            values, default = _as_text(raw), node.attr("default_string", "_Unused")
        elif kind == "values_int64s":
            values, default = np.asarray(raw, np.int64), node.attr("default_int64", -1)
        else:
            values, default = np.asarray(raw, np.float32), node.attr("default_float", -0.0)
    else:
        values = _as_text(values.reshape(-1)) if _is_text(values) else values.reshape(-1)
    tensor_default = node.attr("default_tensor")
    if tensor_default is not None:
        default = tensor_default.reshape(-1)[0]
        if isinstance(default, bytes):
            default = default.decode("utf-8", errors="surrogateescape")
    elif node.attr("values_tensor") is not None:
        default = "_Unused" if values.dtype == object else (-1 if values.dtype.kind in "iu" else -0.0)
        if values.dtype == object:  # opset 4 still reads the typed default attributes when no tensor is given
            default = node.attr("default_string", default)
        elif values.dtype.kind in "iu":
            default = node.attr("default_int64", default)
        else:
            default = node.attr("default_float", default)
    return keys, values, default


@register("LabelEncoder", since=2, domain=ML)
class LabelEncoder(Kernel):
    """Maps each element through keys -> values, the default where the key is absent; the output
    has the input's shape and the values' type."""

    inline_fn = INLINE_APPLY

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        keys, values, default = _label_encoder_arrays(node)
        self.lookup = Lookup(keys, values, default, f"LabelEncoder node {node.name!r}")

    def compute(self, inputs: list) -> list:
        return [self.apply(inputs[0])]

    def apply(self, x: np.ndarray) -> np.ndarray:
        return self.lookup(x if x.__class__ is np.ndarray else np.asarray(x))


@register("LabelEncoder", since=1, domain=ML)
class LabelEncoderV1(Kernel):
    """Opset 1: strings to their index in classes_strings, or integers to the class string at
    that index; default_int64 / default_string elsewhere."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        classes = _as_text(node.attr("classes_strings", []))
        self.to_ints = Lookup(classes, np.arange(len(classes), dtype=np.int64), node.attr("default_int64", -1),
                              f"LabelEncoder node {node.name!r}")
        self.to_text = Lookup(np.arange(len(classes), dtype=np.int64), classes, node.attr("default_string", "_Unused"),
                              f"LabelEncoder node {node.name!r}")

    def compute(self, inputs: list) -> list:
        x = np.asarray(inputs[0])
        return [self.to_ints(x) if _is_text(x) else self.to_text(x.astype(np.int64, copy=False))]


@register("CategoryMapper", since=1, domain=ML)
class CategoryMapper(Kernel):
    """Strings to int64 and int64 to strings through cats_strings[i] <-> cats_int64s[i]."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        strings = _as_text(node.attr("cats_strings", []))
        ints = np.asarray(node.attr("cats_int64s", []), np.int64)
        what = f"CategoryMapper node {node.name!r}"
        if len(strings) != len(ints):
            raise InvalidArgument(f"{what}: cats_strings has {len(strings)} entries and cats_int64s {len(ints)}; "
                                  "they must pair up.")
        self.to_ints = Lookup(strings, ints, node.attr("default_int64", -1), what)
        self.to_text = Lookup(ints, strings, node.attr("default_string", "_Unused"), what)

    def compute(self, inputs: list) -> list:
        x = np.asarray(inputs[0])
        return [self.to_ints(x) if _is_text(x) else self.to_text(x.astype(np.int64, copy=False))]


@register("OneHotEncoder", since=1, domain=ML)
class OneHotEncoder(Kernel):
    """Each element as a row of len(categories) floats with a one at its category's index; the
    output is the input's shape plus that axis. Floats are truncated to int64 first, as in
    onnxruntime. With zeros=0 an unknown category is an error."""

    inline_fn = INLINE_APPLY

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        ints, strings = node.attr("cats_int64s"), node.attr("cats_strings")
        if bool(ints) == bool(strings):
            raise InvalidArgument(f"OneHotEncoder node {node.name!r}: exactly one of cats_int64s and cats_strings "
                                  "must be given.")
        cats = _as_text(strings) if strings else np.asarray(ints, np.int64)
        self.n = len(cats)
        self.lookup = Lookup(cats, np.arange(self.n, dtype=np.int64), -1, f"OneHotEncoder node {node.name!r}")
        # string categories: str -> index, the first of duplicates (as the lookup's)
        self.text_index = self.lookup.get if self.lookup.text_keys else None
        self.zeros = bool(node.attr("zeros", 1))
        self.name = node.name
        self.columns = np.arange(self.n, dtype=np.int64)
        # distinct integer categories: the one-hot rows are the input compared with them directly
        self.int_cats = cats if not strings and len(set(ints)) == len(ints) else None
        # and distinct string categories, for a string input (numpy U or object): compared with them
        # directly where every element equals one (else through the lookup, which decodes bytes)
        text = cats.tolist() if strings else []
        distinct = bool(strings) and len(set(text)) == len(text) and all(t and not t.endswith("\0") for t in text)
        self.text_cats = {"U": np.array(text, dtype=str), "O": cats} if distinct else None
        # the one-hot rows to gather by index: row i has its one at column i, and a last row of
        # zeros, which the lookup's -1 (an unknown value) reads (one ndarray.take, where comparing
        # with every category casts and broadcasts, more so on strings)
        self.rows = np.vstack([np.eye(self.n, dtype=np.float32), np.zeros((1, self.n), np.float32)])
        # distinct integer categories in a span of at most _SPAN values: rows by value - lo + 1,
        # with a row of zeros at both ends, which every value outside the span reaches by clipping
        # (a subtraction that wraps around past int64's range lands beyond an end too)
        self.span_rows = None
        if self.int_cats is not None and self.n and int(cats.max()) - int(cats.min()) < _SPAN:
            lo = int(cats.min())
            table = np.zeros((int(cats.max()) - lo + 3, self.n), np.float32)
            table[cats - lo + 1, np.arange(self.n)] = 1
            self.span_rows, self.span_shift = table, np.array(lo - 1, np.int64)

    def compute(self, inputs: list) -> list:
        return [self.apply(inputs[0])]

    def apply(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        if not _is_text(x):
            x = x.astype(np.int64, copy=False)
            if self.span_rows is not None:
                out = self.span_rows.take(np.subtract(x, self.span_shift), axis=0, mode="clip")
                if not self.zeros and np.count_nonzero(out) != x.size:
                    self._refuse(x, self.lookup(x).reshape(-1) < 0)
                return out
            if self.int_cats is not None:
                out = np.equal(x[..., None], self.int_cats, out=np.empty(x.shape + (self.n,), np.float32))
                if not self.zeros and np.count_nonzero(out) != x.size:
                    index = self.lookup(x).reshape(-1)
                    self._refuse(x, index < 0)
                return out
        if x.dtype.kind == "O":  # each string looked up once (a dict get), its row gathered
            if self.text_index is not None:
                flat = x.ravel().tolist()
                try:  # every element a known str: its index straight into the array (a miss is None, refused)
                    index = np.fromiter(map(self.text_index, flat), np.intp, len(flat))
                    return self.rows.take(index, axis=0).reshape(x.shape + (self.n,))
                except TypeError:  # an unknown value, bytes or a non-str: the lookup decides each
                    pass
            index = self.lookup(x)
            if not self.zeros and np.count_nonzero(index < 0):
                self._refuse(x, index.reshape(-1) < 0)
            return self.rows.take(index, axis=0)
        cats = self.text_cats.get(x.dtype.kind) if self.text_cats is not None else None
        if cats is not None:
            out = np.equal(x[..., None], cats, out=np.empty(x.shape + (self.n,), np.float32))
            if np.count_nonzero(out) == x.size:
                return out
        index = self.lookup(x).reshape(-1)
        if not self.zeros:
            missing = index < 0
            if missing.any():
                self._refuse(x, missing)
        # an unknown value (index -1) matches no column: a row of zeros
        out = np.equal(index[:, None], self.columns, out=np.empty((index.size, self.n), np.float32))
        return out.reshape(x.shape + (self.n,))

    def _refuse(self, x: np.ndarray, missing: np.ndarray) -> None:
        raise InvalidArgument(f"OneHotEncoder node {self.name!r}: input value "
                              f"{x.reshape(-1)[np.argmax(missing)]!r} is none of the categories and "
                              "zeros=0; set zeros=1 to encode unknown values as all zeros.")


@register("Imputer", since=1, domain=ML)
class Imputer(Kernel):
    """Replaces replaced_value (NaN if that is NaN) by imputed values: one for all columns or
    one per column of the last axis."""

    inline_fn = INLINE_APPLY

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        floats, ints = node.attr("imputed_value_floats"), node.attr("imputed_value_int64s")
        if bool(floats) == bool(ints):
            raise InvalidArgument(f"Imputer node {node.name!r}: exactly one of imputed_value_floats and "
                                  "imputed_value_int64s must be given.")
        self.imputed = np.asarray(floats, np.float32) if floats else np.asarray(ints, np.int64)
        self.replaced = (np.float32(node.attr("replaced_value_float", 0.0)) if floats else
                         np.int64(node.attr("replaced_value_int64", 0)))
        self.name = node.name
        self.nan = bool(np.isnan(self.replaced))  # NaN is replaced: the hits are isnan, not equality
        # (shape, dtype, the imputed values to copy there) of the last input checked: replaced
        # whole (one assignment), so that threads read one consistent tuple
        self._checked: tuple = ((), None, None)

    def compute(self, inputs: list) -> list:
        return [self.apply(inputs[0])]

    def apply(self, x: np.ndarray) -> np.ndarray:
        if x.__class__ is not np.ndarray:
            x = np.asarray(x)
        shape, dtype, fill = self._checked
        if x.shape != shape or x.dtype != dtype or fill is None:
            fill = self._fill(x)
        hit = np.isnan(x) if self.nan and x.dtype.kind == "f" else np.equal(x, self.replaced)
        out = x.copy()  # a copy with the hits replaced
        np.copyto(out, fill, where=hit)
        return out

    def _fill(self, x: np.ndarray) -> np.ndarray:
        """The imputed values for an input like ``x``, checked against it: in its dtype, and for a
        small input repeated to its shape (a copy between operands of one shape is cheaper than a
        broadcast on a few rows)."""
        if (x.dtype.kind == "f") != (self.imputed.dtype.kind == "f"):
            raise InvalidArgument(f"Imputer node {self.name!r}: input of type {x.dtype} with "
                                  f"{'float' if self.imputed.dtype.kind == 'f' else 'int64'} imputed values; "
                                  "feed a tensor of the imputed values' kind.")
        width = x.shape[-1] if x.ndim else 1
        if self.imputed.size not in (1, width):
            raise InvalidArgument(f"Imputer node {self.name!r}: {self.imputed.size} imputed values for an input "
                                  f"of {width} columns ({list(x.shape)}); give one value or one per column.")
        fill = self.imputed.astype(x.dtype, copy=False)
        if x.size <= _SMALL:
            fill = np.ascontiguousarray(np.broadcast_to(fill, x.shape) if x.ndim else fill.reshape(()))
            fill.flags.writeable = False
            self._checked = (x.shape, x.dtype, fill)
        return fill


@register("ArrayFeatureExtractor", since=1, domain=ML)
class ArrayFeatureExtractor(Kernel):
    """The columns Y of the last axis of X; a 1-D X gives one row [1, len(Y)]."""

    inline_fn = INLINE_APPLY

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.name = node.name
        # (Y as given, its bytes, X's width, Y's indices checked for that width): Y is usually a
        # constant, the same array every run; replaced whole (one assignment), so that threads
        # read one consistent tuple
        self._checked: tuple = (None, b"", -1, None)
        # a constant initializer Y is the same array, never changed, every run: its bytes need no
        # comparing
        self.constant_y = ctx is not None and len(node.inputs) > 1 and ctx.is_constant_initializer(node.inputs[1])

    def compute(self, inputs: list) -> list:
        return [self.apply(inputs[0], inputs[1])]

    def apply(self, x: np.ndarray, given: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim == 0:
            raise InvalidArgument(f"ArrayFeatureExtractor node {self.name!r}: X is a scalar; it needs at least one "
                                  "axis.")
        width = x.shape[-1]
        seen, seen_bytes, seen_width, index = self._checked
        if given is not seen or width != seen_width or (not self.constant_y and given.tobytes() != seen_bytes):
            y = np.asarray(given).reshape(-1)
            bad = (y < 0) | (y >= width)
            if bad.any():
                raise InvalidArgument(f"ArrayFeatureExtractor node {self.name!r}: index {int(y[np.argmax(bad)])} is "
                                      f"out of range for the last axis of X {list(x.shape)}; indices must be in "
                                      f"[0, {width}).")
            index = y.astype(np.intp)
            if given.__class__ is np.ndarray:
                self._checked = (given, given.tobytes(), width, index)
        out = x.take(index, axis=-1)
        return out.reshape(1, -1) if x.ndim == 1 else out


@register("FeatureVectorizer", since=1, domain=ML)
class FeatureVectorizer(Kernel):
    """The inputs' rows side by side as float32 [N, sum(inputdimensions)]: each input's columns
    cut or zero-padded to its declared width."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.dims = [int(d) for d in node.attr("inputdimensions", [])]
        self.name = node.name
        if len(self.dims) != len(node.inputs):
            raise InvalidArgument(f"FeatureVectorizer node {self.name!r}: inputdimensions has {len(self.dims)} "
                                  f"entries for {len(node.inputs)} inputs; give one per input.")

    def compute(self, inputs: list) -> list:
        rows = [np.asarray(x).reshape(1, -1) if np.ndim(x) <= 1 else np.asarray(x).reshape(len(x), -1)
                for x in inputs]
        n = rows[0].shape[0]
        out = np.zeros((n, sum(self.dims)), np.float32)
        at = 0
        for i, (x, d) in enumerate(zip(rows, self.dims)):
            if x.shape[0] != n:
                raise InvalidArgument(f"FeatureVectorizer node {self.name!r}: input {i} has {x.shape[0]} rows, "
                                      f"input 0 has {n}; all inputs need the same batch size.")
            w = min(d, x.shape[1])
            out[:, at:at + w] = x[:, :w]
            at += d
        return [out]


def _value_dtype(values: list) -> np.dtype:
    if all(isinstance(v, str) for v in values):
        return np.dtype(object)
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        return np.dtype(np.int64)
    return np.dtype(np.float32)


@register("DictVectorizer", since=1, domain=ML)
class DictVectorizer(Kernel):
    """A map (or a sequence of maps: one row each) as a dense row over the vocabulary: the value
    of each vocabulary key, 0 (or "") where the map lacks it; keys outside the vocabulary ignored."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        strings, ints = node.attr("string_vocabulary"), node.attr("int64_vocabulary")
        if bool(strings) == bool(ints):
            raise InvalidArgument(f"DictVectorizer node {node.name!r}: exactly one of string_vocabulary and "
                                  "int64_vocabulary must be given.")
        vocab = [str(s) for s in _as_text(strings).tolist()] if strings else [int(i) for i in ints]
        self.index = {k: i for i, k in enumerate(vocab)}
        self.n = len(vocab)
        self.zero_row = [0.0] * self.n
        self.name = node.name

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if x.__class__ is dict and 0 < len(x) <= 256:  # one map of Python floats over known keys: one row
            row = self.zero_row.copy()
            get = self.index.get
            for k, v in x.items():
                c = get(k)
                if c is None or v.__class__ is not float:
                    break
                row[c] = v
            else:  # a Python list filled and converted once: cheaper than a numpy scatter of a few values
                return [np.array([row], np.float32)]
        maps = [x] if isinstance(x, dict) else x
        if not isinstance(maps, list) or not all(isinstance(m, dict) for m in maps):
            raise InvalidArgument(f"DictVectorizer node {self.name!r}: input must be a map (dict) or a sequence of "
                                  f"maps, got {type(x).__name__}.")
        values = [v for m in maps for v in m.values()]
        dtype = _value_dtype(values)  # a map's values come as Python floats: float32, as skl2onnx declares
        out = np.zeros((len(maps), self.n), dtype)
        if dtype.kind == "O":
            out[:] = ""
        rows, cols, vals = [], [], []
        for r, m in enumerate(maps):
            for k, v in m.items():
                c = self.index.get(k.decode() if isinstance(k, bytes) else k)
                if c is not None:
                    rows.append(r)
                    cols.append(c)
                    vals.append(v)
        if rows:
            out[rows, cols] = np.asarray(vals, dtype=dtype)
        return [out]


@register("CastMap", since=1, domain=ML)
class CastMap(Kernel):
    """A map int64 -> string/float as a [1, N] tensor: DENSE, the values in key order; SPARSE,
    max_map columns with each value at its key (0 elsewhere)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.cast_to = node.attr("cast_to", "TO_FLOAT")
        self.form = node.attr("map_form", "DENSE")
        self.max_map = int(node.attr("max_map", 1))
        self.name = node.name
        if self.cast_to not in ("TO_FLOAT", "TO_STRING", "TO_INT64") or self.form not in ("DENSE", "SPARSE"):
            raise InvalidArgument(f"CastMap node {self.name!r}: cast_to {self.cast_to!r} / map_form {self.form!r}; "
                                  "cast_to is TO_FLOAT, TO_STRING or TO_INT64 and map_form DENSE or SPARSE.")

    def compute(self, inputs: list) -> list:
        m = inputs[0]
        if not isinstance(m, dict):
            raise InvalidArgument(f"CastMap node {self.name!r}: input must be a map int64 -> string/float, got "
                                  f"{type(m).__name__}.")
        keys = sorted(int(k) for k in m)
        values = [m[k] for k in keys]
        if self.cast_to == "TO_STRING":
            conv = [v if isinstance(v, str) else _float_text(v) for v in values]
            dtype, fill = np.dtype(object), "0"
        else:
            conv = [float(v) for v in values]
            dtype, fill = (np.dtype(np.float32) if self.cast_to == "TO_FLOAT" else np.dtype(np.int64)), 0
        if self.form == "DENSE":
            out = np.array(conv, dtype=dtype) if dtype.kind != "O" else _as_text(conv)
            return [out.reshape(1, -1)]
        out = np.full(self.max_map, fill, dtype=dtype)
        for k, v in zip(keys, conv):
            if 0 <= k < self.max_map:
                out[k] = v
        return [out.reshape(1, -1)]


def _float_text(v: float) -> str:
    return str(float(v))
