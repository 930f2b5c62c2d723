"""Helpers of the ditd generate clip tests (wan_generate.py, wan_i2v_generate.py): a .npy
reader and a PNG frame decoder, stdlib plus ffmpeg."""
import struct
import subprocess


def read_npy(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:6] == b"\x93NUMPY", path
    major = data[6]
    if major == 1:
        hlen = struct.unpack("<H", data[8:10])[0]
        off = 10
    else:
        hlen = struct.unpack("<I", data[8:12])[0]
        off = 12
    header = eval(data[off:off + hlen].decode("latin1"))  # a Python dict literal
    shape = tuple(header["shape"])
    descr = header["descr"]
    body = data[off + hlen:]
    n = 1
    for d in shape:
        n *= d
    fmt = {"<f4": "f", "<f8": "d", "|u1": "B"}[descr]
    vals = struct.unpack("<%d%s" % (n, fmt), body[: n * struct.calcsize(fmt)])
    return shape, vals


def png_rgb(path, W, H):
    """The RGB bytes of a W x H PNG frame, decoded by ffmpeg (exact for PNG)."""
    px = subprocess.run(["ffmpeg", "-v", "error", "-i", path, "-f", "rawvideo", "-pix_fmt", "rgb24",
                         "-"], capture_output=True).stdout
    return px if len(px) == W * H * 3 else None
