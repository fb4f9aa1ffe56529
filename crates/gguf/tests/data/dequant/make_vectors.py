#!/usr/bin/env python3
"""Writes the dequantisation test vectors in this directory: for each type, <TYPE>.bin
holds 4 records of 256 elements, each the type's raw bytes for those elements followed
by the 256 f32 (little-endian) that llama.cpp's own Python reference,
`gguf.quants.dequantize` (PyPI `gguf` 0.19.0), makes of them.

Records 0-1 are real data: 256 elements from the start and from the middle of the
first tensor of that type in the GGUF files given (in order); records 2-3 are random
bytes (seeded) with the scale fields set to finite f16 values. The committed vectors
were made from gemma-3-270m-q4_k_m.gguf (Q4_K, Q5_0, Q6_K, Q8_0), a GGUF holding
SmolLM2's blk.0.ffn_down quantised by ggml's `ggml_quantize_chunk` to Q2_K, Q3_K, Q5_K,
Q5_1 and Q4_0, and SmolLM2-135M-Instruct.Q4_1.gguf (Q4_1); BF16 from SmolLM2 weights
rounded by the package's own BF16 quantiser.

usage: python3 make_vectors.py OUT_DIR FILE.gguf [FILE.gguf ...]
(run in a venv with `pip install gguf numpy`; the package is not vendored here)
"""
import sys
import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as Q, GGML_QUANT_SIZES
from gguf.quants import dequantize

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "BF16"]
# Byte offsets of the f16 scale fields in one block, and whether each may be negative.
SCALES = {
    "Q4_0": [(0, True)], "Q4_1": [(0, False), (2, True)], "Q5_0": [(0, True)],
    "Q5_1": [(0, False), (2, True)], "Q8_0": [(0, True)],
    "Q2_K": [(80, False), (82, False)], "Q3_K": [(108, True)],
    "Q4_K": [(0, False), (2, False)], "Q5_K": [(0, False), (2, False)], "Q6_K": [(208, True)],
    "BF16": [],
}
N = 256


def record(ty, raw):
    t = Q[ty]
    out = dequantize(np.frombuffer(raw, dtype=np.uint8).copy(), t).astype("<f4")
    assert out.size == N, (ty, out.size)
    return raw + out.tobytes()


def main():
    out_dir, files = sys.argv[1], sys.argv[2:]
    readers = [GGUFReader(f) for f in files]
    rng = np.random.default_rng(13)
    for ty in TYPES:
        t = Q[ty]
        bs, ts = GGML_QUANT_SIZES[t]
        nbytes = N // bs * ts
        recs = []
        src = next((x for r in readers for x in r.tensors if x.tensor_type == t), None)
        if src is not None:
            data = bytes(src.data.tobytes())
            mid = (len(data) // 2) // nbytes * nbytes
            recs += [data[:nbytes], data[mid:mid + nbytes]]
        elif ty == "BF16":
            # No BF16 tensor at hand: real f32 weights rounded to BF16 by the package.
            from gguf.quants import quantize
            f = next(x for r in readers for x in r.tensors if len(x.shape) == 2)
            w = dequantize(f.data, f.tensor_type).reshape(-1)
            for start in (0, w.size // 2):
                recs.append(bytes(quantize(w[start:start + N].astype(np.float32), t).tobytes()))
        else:
            sys.exit(f"no {ty} tensor in the given files")
        for _ in range(2):
            raw = bytearray(rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes())
            for b in range(N // bs):
                for off, signed in SCALES[ty]:
                    v = rng.uniform(-0.05 if signed else 0.0, 0.05)
                    raw[b * ts + off:b * ts + off + 2] = np.float16(v).tobytes()
            recs.append(bytes(raw))
        with open(f"{out_dir}/{ty}.bin", "wb") as fh:
            for r in recs:
                fh.write(record(ty, r))
        print(ty, "from", src.name if src is not None else "rounded f32", len(recs), "records")


if __name__ == "__main__":
    main()
