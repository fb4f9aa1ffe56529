#!/usr/bin/env python3
"""Writes sha256.txt: for each type, the sha256 of ggml's `ggml_quantize_chunk` output
(through the harness described in make_vectors.py) for 64 rows of 256 synthetic
weights that quant_k.rs regenerates exactly (integer hashing and exact f32 steps):
    h = (i * 2654435761) mod 2^32, u(i) = (h >> 8) / 2^24
    x[i] = ((u(i) + u(i + 7)) + u(i + 13) - 1.5) * scale[(i / 256) % 4]
with scale = [0.05, 0.001, 1.5, 0.02] (float32 at every step).
usage: python3 make_sha256.py OUT_DIR PATH/TO/qh
"""
import hashlib, subprocess, sys
import numpy as np
from gguf import GGMLQuantizationType as Q

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
N = 256 * 64


def inputs():
    def u(i):
        h = (i.astype(np.uint64) * np.uint64(2654435761)) % np.uint64(2**32)
        return (h >> np.uint64(8)).astype(np.float32) / np.float32(2**24)
    i = np.arange(N, dtype=np.uint64)
    s = (u(i) + u(i + np.uint64(7))) + u(i + np.uint64(13))
    scale = np.array([0.05, 0.001, 1.5, 0.02], dtype=np.float32)[(np.arange(N) // 256) % 4]
    return ((s - np.float32(1.5)) * scale).astype(np.float32)


def main():
    out_dir, qh = sys.argv[1:3]
    inputs().tofile("/tmp/qs_in.f32")
    with open(f"{out_dir}/sha256.txt", "w") as fh:
        fh.write("# sha256 of ggml_quantize_chunk's output for make_sha256.py's inputs\n")
        for ty in TYPES:
            subprocess.run([qh, str(int(Q[ty])), "256", "/tmp/qs_in.f32", "/tmp/qs_out.bin"], check=True)
            fh.write(f"{ty} {hashlib.sha256(open('/tmp/qs_out.bin', 'rb').read()).hexdigest()}\n")


if __name__ == "__main__":
    main()
