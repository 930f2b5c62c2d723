"""What the `mpirun ... ditd generate` layout checks (img2img_group.py, wan_generate_group.py)
share: a failure list, float32 .npy reading (stdlib only) and the relative error they bound
(max |a - b| / max |b|)."""
import struct

failures = []


def fail(msg):
    print("FAIL " + msg)
    failures.append(msg)


def read_npy(path):
    """(shape, values) of a little-endian float32 .npy file."""
    with open(path, "rb") as f:
        data = f.read()
    hl = struct.unpack("<H", data[8:10])[0]
    header = data[10:10 + hl].decode("latin1")
    shape = tuple(int(x) for x in header.split("'shape': (")[1].split(")")[0].split(",") if x.strip())
    n = 1
    for s in shape:
        n *= s
    return shape, struct.unpack("<%df" % n, data[10 + hl:10 + hl + 4 * n])


def rel(a, b):
    scale = max(abs(v) for v in b)
    return max(abs(x - y) for x, y in zip(a, b)) / scale
