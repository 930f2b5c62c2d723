#!/usr/bin/env python3
"""Attention at long sequences: ditd's CPU kernel beside PyTorch's SDPA, in one run.

For each token count N (default 1024, 4096, 8192), B x N queries attend to B x N keys,
H heads of Dh channels, fp32, no mask: ditd_cpu_attention (through
`bench_kernels -a`, which also computes the log-sum-exp ring attention needs) and
torch.nn.functional.scaled_dot_product_attention on (B, H, N, Dh) tensors, both with
the same thread count. Prints median ms, GFLOP/s (4 B H N^2 Dh) and the ratio. A
benchmark: it asserts nothing; on a shared machine compare the ratios.

    /root/ditd-venv/bin/python bench/attention_torch.py \\
        --bench build/tests/kernels/bench_kernels --tokens 1024,4096,8192
"""
import argparse
import re
import statistics
import subprocess
import time


def torch_ms(B, N, H, Dh, threads, reps):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, Dh, generator=g) * 0.5 for _ in range(3))
    with torch.inference_mode():
        F.scaled_dot_product_attention(q, k, v)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            F.scaled_dot_product_attention(q, k, v)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), torch.__version__


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default="build/tests/kernels/bench_kernels")
    ap.add_argument("--tokens", default="1024,4096,8192")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=72)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    print(f"attention fp32, batch {a.batch}, {a.heads} heads x {a.head_dim}, {a.threads} threads, "
          f"median of {a.reps}")
    print("| tokens | ditd ms | ditd GFLOP/s | SDPA ms | SDPA GFLOP/s | ditd speed / SDPA |")
    print("|---|---|---|---|---|---|")
    for n in [int(x) for x in a.tokens.split(",")]:
        out = subprocess.run([a.bench, "-a", str(n), "-b", str(a.batch), "-H", str(a.heads),
                              "-d", str(a.head_dim), "-t", str(a.threads), "-r", str(a.reps)],
                             check=True, capture_output=True, text=True).stdout
        m = re.search(r"attention .*?([\d.]+) ms\s+([\d.]+) GFLOP/s", out)
        d_ms = float(m.group(1))
        t_ms, tv = torch_ms(a.batch, n, a.heads, a.head_dim, a.threads, a.reps)
        gf = 4.0 * a.batch * a.heads * n * n * a.head_dim / 1e6
        print(f"| {n} | {d_ms:.1f} | {gf / d_ms:.1f} | {t_ms:.1f} | {gf / t_ms:.1f} | "
              f"{t_ms / d_ms:.2f} |")
    print(f"(PyTorch {tv})")


if __name__ == "__main__":
    main()
