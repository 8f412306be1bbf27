"""ImageDecoder (opset 20) for the formats numpy + zlib can decode exactly: PNG (8-bit,
non-interlaced), BMP (24/32-bit uncompressed), PNM (P2/P3/P5/P6), TIFF (uncompressed, 8-bit,
chunky) and baseline JPEG (``jpeg_baseline``, bit-exact with libjpeg's defaults). Progressive
JPEG, JPEG 2000 and WebP need a real codec: they use Pillow when it is installed (it is not a
dependency) and otherwise raise NotImplemented naming the format.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node, errors
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.run_control import check_terminate
from onnxhal.runtime.providers.cpu.kernels.jpeg_baseline import decode_baseline_jpeg
from onnxhal.runtime.providers.cpu.kernels.registry import register


def _png(data: bytes) -> np.ndarray:
    pos, idat, palette = 8, [], None
    width = height = depth = ctype = interlace = 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"PLTE":
            palette = np.frombuffer(body, dtype=np.uint8).reshape(-1, 3)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[ctype]
    if depth != 8 or interlace:
        raise errors.NotImplemented(f"ImageDecoder: PNG with bit depth {depth}, interlace {interlace} is not "
                             "supported (8-bit non-interlaced only); install Pillow")
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8).reshape(height, 1 + width * channels)
    bpp, stride = channels, width * channels
    out = np.zeros((height, stride), dtype=np.int32)
    prev = np.zeros(stride, dtype=np.int32)
    for y in range(height):
        check_terminate()  # a row's unfiltering (byte by byte for Average/Paeth) per read
        f, row = raw[y, 0], raw[y, 1:].astype(np.int32)
        if f == 1:  # Sub: running sum per channel
            row = np.cumsum(row.reshape(width, bpp), axis=0).reshape(-1) & 255
        elif f == 2:  # Up
            row = (row + prev) & 255
        elif f in (3, 4):  # Average / Paeth depend on the left neighbour: byte by byte
            cur = row.tolist()
            up = prev.tolist()
            for i in range(stride):
                a = cur[i - bpp] if i >= bpp else 0
                b = up[i]
                if f == 3:
                    cur[i] = (cur[i] + ((a + b) >> 1)) & 255
                else:
                    c = up[i - bpp] if i >= bpp else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                    cur[i] = (cur[i] + pred) & 255
            row = np.array(cur, dtype=np.int32)
        out[y] = row
        prev = row
    img = out.astype(np.uint8).reshape(height, width, channels)
    if ctype == 3:
        img = palette[img[..., 0]]
    elif ctype == 0:
        img = np.repeat(img, 3, axis=2)
    elif ctype == 4:
        img = np.repeat(img[..., :1], 3, axis=2)
    return img[..., :3]


def _bmp(data: bytes) -> np.ndarray:
    offset = struct.unpack("<I", data[10:14])[0]
    width, height = struct.unpack("<ii", data[18:26])
    bpp, compression = struct.unpack("<HI", data[28:34])
    if bpp not in (24, 32) or compression not in (0, 3):
        raise errors.NotImplemented(f"ImageDecoder: BMP with {bpp} bits per pixel, compression {compression} is "
                             "not supported (24/32-bit uncompressed only); install Pillow")
    rows, ch = abs(height), bpp // 8
    stride = (width * ch + 3) & ~3
    px = np.frombuffer(data, dtype=np.uint8, count=rows * stride, offset=offset).reshape(rows, stride)
    img = px[:, :width * ch].reshape(rows, width, ch)[..., 2::-1]  # BGR(A) -> RGB
    return img[::-1] if height > 0 else img  # positive height: bottom-up rows


def _pnm(data: bytes) -> np.ndarray:
    tokens, pos = [], 2
    while len(tokens) < 3:
        while data[pos:pos + 1].isspace():
            pos += 1
        if data[pos:pos + 1] == b"#":
            pos = data.index(b"\n", pos) + 1
            continue
        end = pos
        while not data[end:end + 1].isspace():
            end += 1
        tokens.append(int(data[pos:end]))
        pos = end
    width, height, maxval = tokens
    kind = data[:2]
    ch = 3 if kind in (b"P3", b"P6") else 1
    if kind in (b"P5", b"P6"):
        pixels = np.frombuffer(data, dtype=np.uint8 if maxval < 256 else ">u2", count=width * height * ch, offset=pos + 1)
    else:
        pixels = np.array(data[pos:].split(), dtype=np.int64)[:width * height * ch]
    img = pixels.reshape(height, width, ch).astype(np.uint8 if maxval < 256 else np.uint16)
    return np.repeat(img, 3, axis=2) if ch == 1 else img


def _tiff(data: bytes) -> np.ndarray:
    end = "<" if data[:2] == b"II" else ">"
    ifd = struct.unpack(end + "I", data[4:8])[0]
    n = struct.unpack(end + "H", data[ifd:ifd + 2])[0]
    tags: dict[int, list[int]] = {}
    sizes = {1: 1, 3: 2, 4: 4}
    codes = {1: "B", 3: "H", 4: "I"}
    for i in range(n):
        tag, typ, count = struct.unpack(end + "HHI", data[ifd + 2 + 12 * i: ifd + 10 + 12 * i])
        raw_at = ifd + 10 + 12 * i
        if typ not in sizes:
            continue
        if sizes[typ] * count > 4:
            raw_at = struct.unpack(end + "I", data[raw_at:raw_at + 4])[0]
        tags[tag] = list(struct.unpack(end + codes[typ] * count, data[raw_at:raw_at + sizes[typ] * count]))
    width, height = tags[256][0], tags[257][0]
    spp = tags.get(277, [1])[0]
    if tags.get(259, [1])[0] != 1 or tags.get(258, [8])[0] != 8 or tags.get(284, [1])[0] != 1:
        raise errors.NotImplemented("ImageDecoder: only uncompressed 8-bit chunky TIFF is supported; install Pillow")
    strips = b"".join(data[o:o + c] for o, c in zip(tags[273], tags[279]))
    img = np.frombuffer(strips, dtype=np.uint8, count=width * height * spp).reshape(height, width, spp)
    return np.repeat(img, 3, axis=2) if spp == 1 else img[..., :3]


def _pillow(data: bytes, fmt: str) -> np.ndarray:
    try:
        import io

        import PIL.Image
    except ImportError:
        raise errors.NotImplemented(f"ImageDecoder: decoding {fmt} needs Pillow (pip install pillow); "
                             "PNG, BMP, PNM, uncompressed TIFF and baseline JPEG decode without it") from None
    return np.array(PIL.Image.open(io.BytesIO(data)).convert("RGB"))


def decode_image_rgb(data: bytes) -> np.ndarray:
    """(H, W, 3) uint8 RGB pixels of an encoded image."""
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return _png(data)
    if data[:2] == b"BM":
        return _bmp(data)
    if data[:1] == b"P" and data[1:2] in b"2356":
        return _pnm(data)
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return _tiff(data)
    if data[:2] == b"\xff\xd8":
        try:
            img = decode_baseline_jpeg(data)
        except NotImplementedError:  # progressive / arithmetic / unusual sampling
            return _pillow(data, "this JPEG (not baseline)")
        return np.repeat(img, 3, axis=2) if img.shape[2] == 1 else img
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _pillow(data, "WebP")
    if data[4:8] == b"jP  " or data[:4] == b"\xff\x4f\xff\x51":
        return _pillow(data, "JPEG 2000")
    raise InvalidArgument(f"ImageDecoder: unrecognised image header {data[:8]!r}; "
                          "expected PNG, BMP, PNM, TIFF, JPEG, JPEG 2000 or WebP")


@register("ImageDecoder", since=20)
class ImageDecoder(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.pixel_format = node.attr("pixel_format", "RGB")

    def compute(self, inputs: list) -> list:
        rgb = decode_image_rgb(inputs[0].tobytes())
        if self.pixel_format == "BGR":
            return [np.ascontiguousarray(rgb[..., ::-1])]
        if self.pixel_format == "Grayscale":  # ITU-R 601-2 luma, as Pillow's convert("L")
            r, g, b = (rgb[..., i].astype(np.uint32) for i in range(3))
            luma = (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16
            return [luma.astype(np.uint8)[..., None]]
        return [np.ascontiguousarray(rgb)]
