#!/usr/bin/env python3
"""Writes the seeds of fuzz_image_in and fuzz_multipart (issue 23).

Images are made with PIL (run with /root/ditd-venv/bin/python): tiny PNGs in
every color type, JPEGs with and without an EXIF orientation (both byte
orders), WebP lossless and lossy, and hostile variants (cut short, header
dimensions patched up, a 30000x30000 JPEG header alone, a bad CRC, BMP, GIF). Multipart seeds are written by hand. Deterministic; each seed is
well under 4 KB. Leaves found-* and crash-* files alone.
"""
import io
import os
import struct
import sys
import zlib

from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))


def put(folder, name, data):
    d = os.path.join(HERE, "corpus", folder)
    os.makedirs(d, exist_ok=True)
    assert len(data) < 4096, (name, len(data))
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def img(mode, w=6, h=4):
    im = Image.new("RGBA", (w, h))
    im.putdata([((x * 40) % 256, (y * 60) % 256, (x * y * 17) % 256, 100 + x * 20)
                for y in range(h) for x in range(w)])
    if mode == "P":
        return im.convert("RGB").convert("P", palette=Image.ADAPTIVE, colors=8)
    if mode == "I;16":  # 16-bit gray
        g = im.convert("L")
        return Image.frombytes("I;16", g.size, bytes(b for v in g.tobytes() for b in (v * 3 % 256, v)))
    return im.convert(mode)


def enc(im, fmt, **kw):
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def exif(o):
    # TIFF header II, IFD0 with one entry: Orientation (SHORT, count 1)
    return b"II*\x00" + struct.pack("<IHHHIHHI", 8, 1, 0x0112, 3, 1, o, 0, 0)


def main():
    seeds = {}
    for mode in ("1", "L", "LA", "P", "RGB", "RGBA", "I;16"):
        seeds["png_" + mode.replace(";", "")] = enc(img(mode), "PNG")
    p = img("P")
    p.info["transparency"] = 2
    seeds["png_P_trns"] = enc(p, "PNG", transparency=2)
    for mode in ("L", "RGB"):
        seeds["jpeg_" + mode] = enc(img(mode, 16, 8), "JPEG", quality=80)
    seeds["jpeg_progressive"] = enc(img("RGB", 16, 8), "JPEG", quality=80, progressive=True)
    for o in (3, 6, 8):
        seeds["jpeg_exif%d" % o] = enc(img("RGB", 16, 8), "JPEG", quality=80, exif=b"Exif\x00\x00" + exif(o))
    seeds["webp_lossless"] = enc(img("RGBA"), "WEBP", lossless=True)
    seeds["webp_lossy"] = enc(img("RGB", 16, 8), "WEBP", quality=80)
    # the EXIF orientation of PNG (eXIf) and WebP (EXIF), and a chunk length past the end
    seeds["png_exif6"] = enc(img("RGB", 16, 8), "PNG", exif=exif(6))
    seeds["webp_exif6"] = enc(img("RGBA"), "WEBP", lossless=True, exif=b"Exif\x00\x00" + exif(6))
    px = bytearray(seeds["png_exif6"])
    j = px.index(b"eXIf") - 4
    struct.pack_into(">I", px, j, 0x7FFFFFF0)
    seeds["png_exif_len_past_end"] = bytes(px)
    # hostile
    png = bytearray(seeds["png_RGB"])
    struct.pack_into(">I", png, 20, 100000)
    struct.pack_into(">I", png, 29, zlib.crc32(bytes(png[12:29])))
    seeds["png_bomb_1x100000"] = bytes(png)
    bad = bytearray(seeds["png_RGB"])
    bad[29] ^= 0xFF
    seeds["png_bad_crc"] = bytes(bad)
    seeds["png_cut"] = seeds["png_RGBA"][: len(seeds["png_RGBA"]) // 2]
    jpg = bytearray(seeds["jpeg_RGB"])
    i = jpg.index(b"\xff\xc0")
    struct.pack_into(">HH", jpg, i + 5, 30000, 30000)
    seeds["jpeg_bomb_30000"] = bytes(jpg)
    seeds["jpeg_cut"] = seeds["jpeg_RGB"][: len(seeds["jpeg_RGB"]) // 2]
    seeds["webp_cut"] = seeds["webp_lossy"][: len(seeds["webp_lossy"]) - 10]
    # a real JPEG header claiming 30000x30000, cut right after its frame header (no scan)
    seeds["jpeg_bomb_30000_cut"] = bytes(jpg[: i + 19])
    seeds["jpeg_exif6_mm"] = enc(img("RGB", 16, 8), "JPEG", quality=80, exif=b"Exif\x00\x00" + b"MM\x00*"
                                 + struct.pack(">IHHHIHHI", 8, 1, 0x0112, 3, 1, 6, 0, 0))
    seeds["webp_cut_half"] = seeds["webp_lossless"][: len(seeds["webp_lossless"]) // 2]
    seeds["webp_cut_header"] = seeds["webp_lossy"][:30]
    seeds["bmp"] = enc(img("RGB"), "BMP")
    seeds["gif"] = enc(img("P"), "GIF")
    seeds["unknown"] = b"hello, world"
    for k, v in seeds.items():
        put("image_in", k, v)

    ct = b"multipart/form-data; boundary=XyZ\n"
    part = lambda h, d: b"--XyZ\r\n" + h + b"\r\n\r\n" + d + b"\r\n"
    edits = (part(b'Content-Disposition: form-data; name="image[]"; filename="a.png"\r\nContent-Type: image/png',
                  seeds["png_L"])
             + part(b'Content-Disposition: form-data; name="image[]"; filename="b.webp"', b"RIFF....WEBP")
             + part(b'Content-Disposition: form-data; name="mask"; filename="m.png"', b"\x89PNG\r\n\x1a\n")
             + part(b'Content-Disposition: form-data; name="prompt"', b"a cat\r\nin a hat")
             + b"--XyZ--\r\n")
    mp = {
        "edits": ct + edits,
        "preamble": ct + b"ignored\r\n" + edits + b"epilogue",
        "quoted": b'Multipart/Form-Data; charset=utf-8; BOUNDARY="a b"\n--a b\r\n'
                  b'Content-Disposition: form-data; name=x; filename="q\\"q"\r\n\r\nv\r\n--a b--',
        "no_boundary": b"multipart/form-data\n--XyZ\r\n",
        "truncated": ct + edits[: len(edits) // 2],
        "no_name": ct + part(b'Content-Disposition: form-data; filename="x"', b"v") + b"--XyZ--",
        "no_headers": ct + b"--XyZ\r\n\r\nv\r\n--XyZ--",
        "folded": ct + b"--XyZ\r\nContent-Disposition: form-data;\r\n name=a\r\n\r\nv\r\n--XyZ--",
        "empty_parts": ct + part(b'Content-Disposition: form-data; name="a"', b"") * 3 + b"--XyZ--",
        # several images as the OpenAI clients send them: image[] repeated (PNG, JPEG with EXIF, WebP)
        "edits_three": ct + b"".join(
            part(b'Content-Disposition: form-data; name="image[]"; filename="%s"\r\nContent-Type: %s'
                 % (fn, t), seeds[k])
            for fn, t, k in ((b"a.png", b"image/png", "png_RGB"), (b"b.jpg", b"image/jpeg", "jpeg_exif6"),
                             (b"c.webp", b"image/webp", "webp_lossless")))
            + part(b'Content-Disposition: form-data; name="n"', b"3") + b"--XyZ--\r\n",
    }
    for k, v in mp.items():
        put("multipart", k, v)
    print("wrote %d image seeds, %d multipart seeds" % (len(seeds), len(mp)), file=sys.stderr)


if __name__ == "__main__":
    main()
