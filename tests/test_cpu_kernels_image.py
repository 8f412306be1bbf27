"""ImageDecoder's own decoders: images encoded here (PNG with every filter type, BMP both row
orders, PNM binary and ASCII, uncompressed TIFF) must decode to the exact pixels; pixel formats."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from onnxhal.hal import errors
from onnxhal.runtime.providers.cpu.kernels.image_decoder import decode_image_rgb
from tests.test_cpu_kernels_nn import RNG, run_native

IMG = RNG.integers(0, 256, (5, 7, 3)).astype(np.uint8)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def encode_png(img: np.ndarray, filters: list[int]) -> bytes:
    """Minimal PNG encoder applying the given filter type to each row (cycled)."""
    h, w, ch = img.shape
    raw = bytearray()
    prev = [0] * (w * ch)
    for y in range(h):
        row = img[y].reshape(-1).tolist()
        f = filters[y % len(filters)]
        out = []
        for i, v in enumerate(row):
            a = row[i - ch] if i >= ch else 0
            b = prev[i]
            c = prev[i - ch] if i >= ch else 0
            pred = [0, a, b, (a + b) >> 1, _paeth(a, b, c)][f]
            out.append((v - pred) & 255)
        raw += bytes([f] + out)
        prev = row
    ctype = {1: 0, 3: 2, 4: 6}[ch]
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, ctype, 0, 0, 0))
            + _chunk(b"IDAT", zlib.compress(bytes(raw))) + _chunk(b"IEND", b""))


@pytest.mark.parametrize("filters", [[0], [1], [2], [3], [4], [0, 1, 2, 3, 4]])
def test_png_every_filter_type(filters):
    np.testing.assert_array_equal(decode_image_rgb(encode_png(IMG, filters)), IMG)


def test_png_rgba_and_gray():
    rgba = np.concatenate([IMG, np.full((5, 7, 1), 200, np.uint8)], axis=2)
    np.testing.assert_array_equal(decode_image_rgb(encode_png(rgba, [4])), IMG)
    gray = IMG[..., :1]
    np.testing.assert_array_equal(decode_image_rgb(encode_png(gray, [1])), np.repeat(gray, 3, axis=2))


@pytest.mark.parametrize("top_down", [False, True])
def test_bmp_24bit_row_orders(top_down):
    h, w, _ = IMG.shape
    stride = (w * 3 + 3) & ~3
    rows = IMG[..., ::-1] if top_down else IMG[::-1, :, ::-1]  # BGR, bottom-up unless negative height
    pixels = b"".join(r.tobytes() + b"\0" * (stride - w * 3) for r in rows)
    header = struct.pack("<2sIHHI", b"BM", 54 + len(pixels), 0, 0, 54)
    info = struct.pack("<IiiHHIIiiII", 40, w, -h if top_down else h, 1, 24, 0, len(pixels), 0, 0, 0, 0)
    np.testing.assert_array_equal(decode_image_rgb(header + info + pixels), IMG)


def test_pnm_binary_and_ascii_with_comments():
    h, w, _ = IMG.shape
    p6 = f"P6\n# made in a test\n{w} {h}\n255\n".encode() + IMG.tobytes()
    np.testing.assert_array_equal(decode_image_rgb(p6), IMG)
    p3 = f"P3 {w} {h} 255\n".encode() + " ".join(map(str, IMG.reshape(-1).tolist())).encode()
    np.testing.assert_array_equal(decode_image_rgb(p3), IMG)


def test_tiff_uncompressed_little_endian():
    h, w, _ = IMG.shape
    pixels = IMG.tobytes()
    entries = [(256, 3, 1, w), (257, 3, 1, h), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 2),
               (273, 4, 1, 8), (277, 3, 1, 3), (278, 3, 1, h), (279, 4, 1, len(pixels))]
    ifd_at = 8 + len(pixels)
    ifd = struct.pack("<H", len(entries))
    for tag, typ, count, value in entries:
        ifd += struct.pack("<HHI", tag, typ, count) + (struct.pack("<HH", value, 0) if typ == 3 else struct.pack("<I", value))
    data = b"II*\x00" + struct.pack("<I", ifd_at) + pixels + ifd + b"\0\0\0\0"
    np.testing.assert_array_equal(decode_image_rgb(data), IMG)


def test_pixel_formats_through_the_kernel():
    data = np.frombuffer(encode_png(IMG, [0]), dtype=np.uint8)
    (rgb,) = run_native("ImageDecoder", [data], 20)
    (bgr,) = run_native("ImageDecoder", [data], 20, pixel_format="BGR")
    (gray,) = run_native("ImageDecoder", [data], 20, pixel_format="Grayscale")
    np.testing.assert_array_equal(rgb, IMG)
    np.testing.assert_array_equal(bgr, IMG[..., ::-1])
    r, g, b = (IMG[..., i].astype(np.uint32) for i in range(3))
    np.testing.assert_array_equal(gray[..., 0], (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16)
    assert gray.shape == (5, 7, 1) and gray.dtype == np.uint8


def test_unknown_format_is_a_typed_error():
    with pytest.raises(errors.InvalidArgument, match="unrecognised image header"):
        decode_image_rgb(b"GIF89a....")


@pytest.mark.parametrize("subsampling", [0, 1, 2])  # 4:4:4, 4:2:2, 4:2:0
@pytest.mark.parametrize("extra", [{}, {"restart_marker_blocks": 2}])
def test_baseline_jpeg_bit_exact_with_pillow(subsampling, extra):
    """Pillow (libjpeg) is the oracle when installed; it is not a dependency."""
    pil_image = pytest.importorskip("PIL.Image", reason="Pillow is not installed (optional oracle)")
    import io

    from onnxhal.runtime.providers.cpu.kernels.jpeg_baseline import decode_baseline_jpeg

    img = RNG.integers(0, 256, (37, 45, 3)).astype(np.uint8)
    buf = io.BytesIO()
    pil_image.fromarray(img).save(buf, "JPEG", quality=85, subsampling=subsampling, **extra)
    want = np.array(pil_image.open(io.BytesIO(buf.getvalue())).convert("RGB"))
    np.testing.assert_array_equal(decode_baseline_jpeg(buf.getvalue()), want)
    buf = io.BytesIO()
    pil_image.fromarray(img[..., 0]).save(buf, "JPEG", quality=85)
    gray = np.array(pil_image.open(io.BytesIO(buf.getvalue())))
    np.testing.assert_array_equal(decode_baseline_jpeg(buf.getvalue())[..., 0], gray)
