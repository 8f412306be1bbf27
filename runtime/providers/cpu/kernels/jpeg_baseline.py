"""Baseline (sequential, Huffman) JPEG decoding that reproduces libjpeg's default output bit for
bit: the integer "islow" IDCT (jidctint.c), fancy (triangle) upsampling of 2x subsampled chroma
(jdsample.c) and the fixed-point YCbCr->RGB tables (jdcolor.c). Progressive and arithmetic-coded
JPEGs are not handled (``decode_baseline_jpeg`` raises ``NotImplementedError``)."""

from __future__ import annotations

import struct

import numpy as np

from onnxhal.hal.run_control import check_terminate

_ZIGZAG = np.array([0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27,
                    20, 13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51,
                    58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63])

# jidctint.c constants (CONST_BITS = 13).
_C = {"0_298631336": 2446, "0_390180644": 3196, "0_541196100": 4433, "0_765366865": 6270,
      "0_899976223": 7373, "1_175875602": 9633, "1_501321110": 12299, "1_847759065": 15137,
      "1_961570560": 16069, "2_053119869": 16819, "2_562915447": 20995, "3_072711026": 25172}
_CONST_BITS, _PASS1_BITS = 13, 2


class _Bits:
    """MSB-first bit reader over entropy-coded data (0xFF00 stuffing removed up front)."""

    def __init__(self, data: bytes) -> None:
        self.bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8)).tolist()
        self.pos = 0

    def read(self, n: int) -> int:
        v = 0
        for b in self.bits[self.pos:self.pos + n]:
            v = (v << 1) | b
        self.pos += n
        return v

    def huffman(self, table: dict) -> int:
        code, length = 0, 0
        while length < 16:
            code = (code << 1) | self.bits[self.pos]
            self.pos += 1
            length += 1
            sym = table.get((length, code))
            if sym is not None:
                return sym
        raise ValueError("corrupt JPEG: bad Huffman code")


def _extend(v: int, s: int) -> int:
    return v - (1 << s) + 1 if s and v < (1 << (s - 1)) else v


def _idct_pass(z0, z1, z2, z3, z4, z5, z6, z7):
    """One 1-D islow pass on the 8 inputs (arrays); returns the 8 outputs before descaling."""
    a = (z2 + z6) * _C["0_541196100"]
    tmp2 = a - z6 * _C["1_847759065"]
    tmp3 = a + z2 * _C["0_765366865"]
    tmp0 = (z0 + z4) << _CONST_BITS
    tmp1 = (z0 - z4) << _CONST_BITS
    t10, t13, t11, t12 = tmp0 + tmp3, tmp0 - tmp3, tmp1 + tmp2, tmp1 - tmp2
    o0, o1, o2, o3 = z7, z5, z3, z1
    q1, q2, q3, q4 = o0 + o3, o1 + o2, o0 + o2, o1 + o3
    q5 = (q3 + q4) * _C["1_175875602"]
    o0 = o0 * _C["0_298631336"]
    o1 = o1 * _C["2_053119869"]
    o2 = o2 * _C["3_072711026"]
    o3 = o3 * _C["1_501321110"]
    q1 = q1 * -_C["0_899976223"]
    q2 = q2 * -_C["2_562915447"]
    q3 = q3 * -_C["1_961570560"] + q5
    q4 = q4 * -_C["0_390180644"] + q5
    o0 += q1 + q3
    o1 += q2 + q4
    o2 += q2 + q3
    o3 += q1 + q4
    return [t10 + o3, t11 + o2, t12 + o1, t13 + o0, t13 - o0, t12 - o1, t11 - o2, t10 - o3]


def _descale(x, n):
    return (x + (1 << (n - 1))) >> n


def idct_islow(coefs: np.ndarray) -> np.ndarray:
    """(B, 8, 8) dequantized coefficients (natural order) -> (B, 8, 8) uint8 samples."""
    c = coefs.astype(np.int64)
    cols = _idct_pass(*(c[:, r, :] for r in range(8)))  # pass 1 down the columns
    ws = np.stack([_descale(v, _CONST_BITS - _PASS1_BITS) for v in cols], axis=1)
    rows = _idct_pass(*(ws[:, :, k] for k in range(8)))  # pass 2 along the rows
    out = np.stack([_descale(v, _CONST_BITS + _PASS1_BITS + 3) for v in rows], axis=2)
    out = ((out + 512) & 1023) - 512  # libjpeg's RANGE_MASK wrap, then clamp around the center
    return np.clip(out + 128, 0, 255).astype(np.uint8)


def _fancy_upsample_h2v2(p: np.ndarray) -> np.ndarray:
    """jdsample.c h2v2_fancy_upsample: 3/4-1/4 triangle filter, edges replicated."""
    x = p.astype(np.int32)
    above = np.vstack([x[:1], x[:-1]])
    below = np.vstack([x[1:], x[-1:]])
    out = np.empty((2 * x.shape[0], 2 * x.shape[1]), dtype=np.int32)
    for v, near in ((0, above), (1, below)):
        cs = 3 * x + near
        left = np.hstack([cs[:, :1], cs[:, :-1]])
        right = np.hstack([cs[:, 1:], cs[:, -1:]])
        out[v::2, 0::2] = (3 * cs + left + 8) >> 4
        out[v::2, 1::2] = (3 * cs + right + 7) >> 4
    return out


def _fancy_upsample_h2v1(p: np.ndarray) -> np.ndarray:
    x = p.astype(np.int32)
    left = np.hstack([x[:, :1], x[:, :-1]])
    right = np.hstack([x[:, 1:], x[:, -1:]])
    out = np.empty((x.shape[0], 2 * x.shape[1]), dtype=np.int32)
    out[:, 0::2] = (3 * x + left + 1) >> 2
    out[:, 1::2] = (3 * x + right + 2) >> 2
    return out


def _ycc_to_rgb(y: np.ndarray, cb: np.ndarray, cr: np.ndarray) -> np.ndarray:
    """jdcolor.c ycc_rgb_convert with its 16-bit fixed-point tables."""
    def fix(v: float) -> int:
        return int(v * 65536 + 0.5)

    y, cb, cr = (a.astype(np.int64) for a in (y, cb, cr))
    xb, xr = cb - 128, cr - 128
    r = y + ((fix(1.40200) * xr + 32768) >> 16)
    g = y + ((-fix(0.34414) * xb + 32768 - fix(0.71414) * xr) >> 16)
    b = y + ((fix(1.77200) * xb + 32768) >> 16)
    return np.clip(np.stack([r, g, b], axis=-1), 0, 255).astype(np.uint8)


def decode_baseline_jpeg(data: bytes) -> np.ndarray:
    """(H, W, 3) RGB (or (H, W, 1) for grayscale JPEGs) as libjpeg decodes it by default."""
    qt: dict[int, np.ndarray] = {}
    huff: dict[tuple[int, int], dict] = {}
    comps: list[dict] = []
    restart, pos = 0, 2
    width = height = 0
    while True:
        marker = data[pos + 1]
        length = struct.unpack(">H", data[pos + 2:pos + 4])[0]
        seg = data[pos + 4:pos + 2 + length]
        if marker in (0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
            raise NotImplementedError(f"JPEG SOF{marker - 0xC0} (progressive/lossless/arithmetic)")
        if marker == 0xDB:
            i = 0
            while i < len(seg):
                precision, tid = seg[i] >> 4, seg[i] & 15
                n = 2 if precision else 1
                vals = np.frombuffer(seg[i + 1:i + 1 + 64 * n], dtype=">u2" if precision else np.uint8)
                table = np.zeros(64, dtype=np.int64)
                table[_ZIGZAG] = vals
                qt[tid] = table.reshape(8, 8)
                i += 1 + 64 * n
        elif marker == 0xC4:
            i = 0
            while i < len(seg):
                cls, tid = seg[i] >> 4, seg[i] & 15
                counts = seg[i + 1:i + 17]
                symbols = seg[i + 17:i + 17 + sum(counts)]
                table, code, k = {}, 0, 0
                for bit_len in range(1, 17):
                    for _ in range(counts[bit_len - 1]):
                        table[(bit_len, code)] = symbols[k]
                        code += 1
                        k += 1
                    code <<= 1
                huff[(cls, tid)] = table
                i += 17 + sum(counts)
        elif marker == 0xC0:
            height, width = struct.unpack(">HH", seg[1:5])
            for c in range(seg[5]):
                cid, samp, tq = seg[6 + 3 * c:9 + 3 * c]
                comps.append({"id": cid, "h": samp >> 4, "v": samp & 15, "tq": tq})
        elif marker == 0xDD:
            restart = struct.unpack(">H", seg[:2])[0]
        elif marker == 0xDA:
            n = seg[0]
            for c in range(n):
                cid, tables = seg[1 + 2 * c:3 + 2 * c]
                comp = next(x for x in comps if x["id"] == cid)
                comp["td"], comp["ta"] = tables >> 4, tables & 15
            pos = pos + 2 + length
            break
        pos += 2 + length
    end = data.find(b"\xff\xd9", pos)
    scan = data[pos:end if end >= 0 else len(data)]
    hmax, vmax = max(c["h"] for c in comps), max(c["v"] for c in comps)
    mcux, mcuy = -(-width // (8 * hmax)), -(-height // (8 * vmax))
    for c in comps:
        c["blocks"] = np.zeros((mcuy * c["v"], mcux * c["h"], 8, 8), dtype=np.int64)
        c["pred"] = 0
    # Split at restart markers; remove byte stuffing.
    segments = [s.replace(b"\xff\x00", b"\xff") for s in _split_restarts(scan)]
    mcus_per_segment = restart or mcux * mcuy
    m = 0
    for seg_data in segments:
        bits = _Bits(seg_data)
        for c in comps:
            c["pred"] = 0
        for _ in range(mcus_per_segment):
            check_terminate()  # one MCU's Huffman decoding per read
            if m >= mcux * mcuy:
                break
            my, mx = divmod(m, mcux)
            for c in comps:
                dc, ac = huff[(0, c["td"])], huff[(1, c["ta"])]
                for by in range(c["v"]):
                    for bx in range(c["h"]):
                        coef = np.zeros(64, dtype=np.int64)
                        s = bits.huffman(dc)
                        c["pred"] += _extend(bits.read(s), s)
                        coef[0] = c["pred"]
                        k = 1
                        while k < 64:
                            rs = bits.huffman(ac)
                            r, s = rs >> 4, rs & 15
                            if s == 0:
                                if r != 15:
                                    break
                                k += 16
                                continue
                            k += r
                            coef[_ZIGZAG[k]] = _extend(bits.read(s), s)
                            k += 1
                        c["blocks"][my * c["v"] + by, mx * c["h"] + bx] = coef.reshape(8, 8)
            m += 1
    planes = []
    for c in comps:
        b = c["blocks"]
        pix = idct_islow((b * qt[c["tq"]]).reshape(-1, 8, 8)).reshape(b.shape)
        plane = pix.transpose(0, 2, 1, 3).reshape(b.shape[0] * 8, b.shape[1] * 8)
        cw, ch = -(-width * c["h"] // hmax), -(-height * c["v"] // vmax)
        plane = plane[:ch, :cw]
        ratio = (hmax // c["h"], vmax // c["v"])
        if ratio == (2, 2):
            plane = _fancy_upsample_h2v2(plane)
        elif ratio == (2, 1):
            plane = _fancy_upsample_h2v1(plane)
        elif ratio != (1, 1):
            raise NotImplementedError(f"JPEG sampling factors {c['h']}x{c['v']} of {hmax}x{vmax}")
        planes.append(plane[:height, :width])
    if len(planes) == 1:
        return planes[0].astype(np.uint8)[..., None]
    return _ycc_to_rgb(*planes[:3])


def _split_restarts(scan: bytes) -> list[bytes]:
    """Entropy-coded segments between RSTn markers (0xFFD0-0xFFD7)."""
    out, start, i = [], 0, 0
    while True:
        i = scan.find(b"\xff", i)
        if i < 0 or i + 1 >= len(scan):
            break
        if 0xD0 <= scan[i + 1] <= 0xD7:
            out.append(scan[start:i])
            start = i + 2
        i += 2
    out.append(scan[start:])
    return out
