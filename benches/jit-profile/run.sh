#!/usr/bin/env bash
# Where lavapipe's worker threads spend a decode token: samples a running greedy
# decode with perf, dumps the JIT-compiled shader code with gdb, and reports the share of
# samples per thread and object, and the share of JIT samples inside llvmpipe's out-of-line
# 16-byte texel fetch (the routine every `texelFetch` of a uvec4/vec4 texel buffer calls:
# eight 16-byte loads, one per lane, and a 4x4 transpose).
#
# Needs perf and gdb (Debian: linux-perf, gdb) and a release build. Not a test; figures for
# the notes. Usage, from the repository root:
#     benches/jit-profile/run.sh [MODEL.gguf] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
model=${1:-models/SmolLM2-135M-Instruct.Q8_0.gguf}
secs=${2:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

VKDECODE_WORKER=1 target/release/vkdecode -m "$model" -p "Write a long story about a dragon." \
    -n 2000 --ignore-eos --temp 0 > "$out/run.txt" 2>&1 &
pid=$!
sleep 6 # past load and prefill: what follows is decode
perf record -q -F 4000 -p "$pid" -o "$out/perf.data" -- sleep "$secs" 2> /dev/null
# the JIT code lives in anonymous executable mappings
grep -E ' r-xp 00000000 00:00 0 ' "/proc/$pid/maps" | awk '{print $1}' | while IFS=- read -r a b; do
    gdb -p "$pid" -batch -ex "dump binary memory $out/jit-$a.bin 0x$a 0x$b" > /dev/null 2>&1
done
kill "$pid"
wait "$pid" 2> /dev/null || true

perf script -i "$out/perf.data" -F tid,ip,dso 2> /dev/null | python3 -c '
import collections, glob, os, re, sys

out = sys.argv[1]
regions = []
for f in glob.glob(os.path.join(out, "jit-*.bin")):
    start = int(os.path.basename(f)[4:-4], 16)
    data = open(f, "rb").read()
    # the texel fetch: from its bounds check (vpcmpltd against the buffer size, EVEX
    # 62 f3 7d 38 1f 4f) to the ret after the masking vpand (c5 e5 db de c3)
    fetch = []
    for m in re.finditer(re.escape(bytes.fromhex("62f37d381f4f")), data):
        end = data.find(bytes.fromhex("c5e5dbdec3"), m.start())
        if 0 < end - m.start() < 400:
            fetch.append((m.start(), end + 5))
    regions.append((start, start + len(data), fetch))

per_thread = collections.Counter()
jit = in_fetch = 0
for line in sys.stdin:
    tid, ip, dso = line.split()[:3]
    what = "jit" if "perf-" in dso or "unknown" in dso else os.path.basename(dso.strip("()"))
    per_thread[(tid, what)] += 1
    if what != "jit":
        continue
    jit += 1
    ip = int(ip, 16)
    for a, b, fetch in regions:
        if a <= ip < b:
            in_fetch += any(s <= ip - a < e for s, e in fetch)
            break
threads = sorted({t for t, _ in per_thread})
for t in threads:
    total = sum(n for (tt, _), n in per_thread.items() if tt == t)
    parts = ", ".join(f"{w} {100 * n / total:.1f}%" for (tt, w), n in per_thread.most_common() if tt == t)
    print(f"thread {t}: {total} samples: {parts}")
print(f"JIT samples: {jit}, inside the 16-byte texel fetch: {in_fetch} ({100 * in_fetch / max(jit, 1):.1f}%)")
' "$out"
