#!/usr/bin/env python3
"""Writes the quantisation test vectors in this directory: for each type, <TYPE>.bin
holds 4 records of 256 elements, each 256 little-endian f32 inputs followed by the bytes
ggml's `ggml_quantize_chunk` (llama.cpp d775b8967, no importance matrix: what
llama-quantize runs) makes of them.

Records 0-1 are real weights (SmolLM2-135M-Instruct Q8_0, dequantised: 256 elements of
blk.0.attn_q and of blk.5.ffn_down); record 2 is Gaussian noise; record 3 has an
all-zero group, tiny values, an outlier and a constant group (seeded).

ggml is reached through a small harness, not part of this repository:
    // qh.c: qh TYPE_ID N_PER_ROW in.f32 out.bin
    #include <stdio.h>
    #include <stdlib.h>
    #include "ggml.h"
    int main(int argc, char **argv) {
        int type = atoi(argv[1]); long npr = atol(argv[2]);
        FILE *f = fopen(argv[3], "rb"); fseek(f, 0, SEEK_END); long sz = ftell(f);
        fseek(f, 0, SEEK_SET); float *x = malloc(sz); fread(x, 1, sz, f); fclose(f);
        void *dst = malloc(sz + 1024);
        size_t out = ggml_quantize_chunk(type, x, dst, 0, sz / 4 / npr, npr, NULL);
        FILE *g = fopen(argv[4], "wb"); fwrite(dst, 1, out, g); fclose(g);
    }
built against libggml-base (cmake -DGGML_NATIVE=OFF).

usage: python3 make_vectors.py OUT_DIR SmolLM2-135M-Instruct.Q8_0.gguf PATH/TO/qh
"""
import subprocess
import sys
import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as Q
from gguf.quants import dequantize

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def main():
    out_dir, model, qh = sys.argv[1:4]
    r = GGUFReader(model)
    t = {x.name: x for x in r.tensors}
    real = [dequantize(t[n].data, t[n].tensor_type).reshape(-1)[:256]
            for n in ("blk.0.attn_q.weight", "blk.5.ffn_down.weight")]
    rng = np.random.default_rng(7)
    noise = rng.normal(0, 0.05, 256)
    odd = rng.normal(0, 0.02, 256)
    odd[0:32] = 0.0
    odd[32:48] = 1e-9 * rng.normal(size=16)
    odd[100] = 3.5
    odd[160:176] = -0.25
    inputs = np.stack([real[0], real[1], noise, odd]).astype("<f4")
    for ty in TYPES:
        with open(f"{out_dir}/{ty}.bin", "wb") as fh:
            for x in inputs:
                x.tofile("/tmp/qv_in.f32")
                subprocess.run([qh, str(int(Q[ty])), "256", "/tmp/qv_in.f32", "/tmp/qv_out.bin"],
                               check=True)
                fh.write(x.tobytes())
                fh.write(open("/tmp/qv_out.bin", "rb").read())
        print(ty)


if __name__ == "__main__":
    main()
