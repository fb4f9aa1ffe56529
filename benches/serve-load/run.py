#!/usr/bin/env python3
"""Load test of `vkdecode serve` (how batching holds up under many clients): C concurrent streaming clients x T tokens
against --parallel N, all greedy (temperature 0, ignore_eos) so every answer can be
checked against the same prompt run alone.

Reports: every request completed; no token lost or duplicated (each streamed text equals
its solo run's text, and each usage says T tokens); aggregate decode tok/s of the
concurrent phase against a single stream's in the same run; the server's memory (peak
RSS, RssAnon, RssFile) after load, after the first solo half and at the end.

The machine's speed drifts with its load, so the solo runs are split around the
concurrent phase: the even-numbered prompts run alone before it, the odd ones after, and
the single-stream figure is the median of all of them (each half's median and the load
average at every phase are reported too).

Standard library only. Usage (from the repository root, after a release build):
    benches/serve-load/run.py [--parallel 8] [--clients 32] [--tokens 64] [--json FILE]
"""
import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SUBJECTS = [
    "a lighthouse keeper", "a lost robot", "a young baker", "an old sailor",
    "a curious cat", "a travelling musician", "a clever fox", "a retired astronaut",
    "a shy dragon", "a village teacher", "a night-shift nurse", "a chess prodigy",
    "a beekeeper", "a mountain guide", "a street painter", "a train conductor",
    "a marine biologist", "a clockmaker", "a forest ranger", "a librarian",
    "a tea farmer", "a stage magician", "a deep-sea diver", "a kite maker",
    "a night owl", "a polar explorer", "a glassblower", "a radio host",
    "a garden gnome", "a desert nomad", "a puppeteer", "a weather forecaster",
]


def prompt(i):
    return f"Write a short story about {SUBJECTS[i % len(SUBJECTS)]} (story {i}). Once upon a time,"


def mem(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) / 1024.0  # MiB
    return out


def stream_one(addr, text, tokens):
    """One streaming completion: (text, usage, t_first_token, t_end, n_chunks)."""
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=900)
    body = json.dumps({
        "prompt": text, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True},
    })
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"status {resp.status}: {resp.read()[:300]!r}")
    parts, usage, first, done, chunks = [], None, None, False, 0
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            break
        ev = json.loads(data)
        if "error" in ev:
            raise RuntimeError(ev["error"]["message"])
        if ev.get("usage"):
            usage = ev["usage"]
        for c in ev.get("choices", []):
            if c.get("text"):
                if first is None:
                    first = time.monotonic()
                parts.append(c["text"])
                chunks += 1
    end = time.monotonic()
    conn.close()
    if not done:
        raise RuntimeError("the stream ended without [DONE]")
    return "".join(parts), usage, first or end, end, chunks


def metrics(addr):
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(vkdecode_\w+) (\S+)$", text, re.M)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/vkdecode"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q8_0.gguf"))
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--ctx-size", type=int, default=512)
    ap.add_argument("--json", help="write every figure to this file")
    a = ap.parse_args()

    server = subprocess.Popen(
        [a.bin, "serve", "-m", a.model, "--port", "0", "--parallel", str(a.parallel),
         "-c", str(a.ctx_size), "--queue", str(max(64, a.clients))],
        stderr=subprocess.PIPE, text=True)
    addr, banner = None, []
    for line in server.stderr:
        banner.append(line.rstrip())
        m = re.search(r"listening on http://(\S+)", line)
        if m:
            addr = m.group(1)
            break
    if addr is None:
        sys.exit("the server did not start:\n" + "\n".join(banner))
    threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
    try:
        mem_loaded = mem(server.pid)
        prompts = [prompt(i) for i in range(a.clients)]

        loads = {"start": os.getloadavg()}

        def solo_runs(indices):
            rates = []
            for i in indices:
                text, usage, first, end, _ = stream_one(addr, prompts[i], a.tokens)
                solo[i] = (text, usage)
                if end > first:
                    rates.append((usage["completion_tokens"] - 1) / (end - first))
            return rates

        # solo: one request at a time, half before the concurrent phase, half after
        solo = [None] * a.clients
        t0 = time.monotonic()
        solo_before = solo_runs(range(0, a.clients, 2))
        solo_s = time.monotonic() - t0
        loads["after_solo_before"] = os.getloadavg()
        mem_solo = mem(server.pid)
        m_before = metrics(addr)

        # concurrent: every client at once
        results, errors = [None] * a.clients, []

        def client(i):
            try:
                results[i] = stream_one(addr, prompts[i], a.tokens)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(f"client {i}: {e}")

        threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
        t1 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        conc_s = time.monotonic() - t1
        m_after = metrics(addr)
        loads["after_concurrent"] = os.getloadavg()
        t2 = time.monotonic()
        solo_after = solo_runs(range(1, a.clients, 2))
        solo_s += time.monotonic() - t2
        loads["end"] = os.getloadavg()
        solo_rates = solo_before + solo_after
        mem_end = mem(server.pid)
    finally:
        server.terminate()
        rc = server.wait(timeout=120)

    completed = sum(r is not None for r in results)
    mismatched = [i for i, r in enumerate(results)
                  if r is not None and (solo[i] is None or r[0] != solo[i][0]
                                        or r[1]["completion_tokens"] != a.tokens)]
    total_tokens = sum(r[1]["completion_tokens"] for r in results if r is not None)
    firsts = [r[2] for r in results if r is not None]
    ends = [r[3] for r in results if r is not None]
    # aggregate: tokens after each stream's first, over the span from the first first
    # token to the last end (the same measure as a single stream's decode rate)
    agg = (total_tokens - completed) / (max(ends) - min(firsts)) if completed else 0.0
    single = statistics.median(solo_rates) if solo_rates else 0.0
    engine_decode = (m_after["vkdecode_decode_only_tokens_total"] - m_before["vkdecode_decode_only_tokens_total"]) / max(
        1e-9, m_after["vkdecode_decode_seconds_total"] - m_before["vkdecode_decode_seconds_total"])
    fig = {
        "parallel": a.parallel, "clients": a.clients, "tokens": a.tokens, "ctx_size": a.ctx_size,
        "banner": banner,
        "completed": completed, "errors": errors, "mismatched_vs_solo": mismatched,
        "total_tokens": total_tokens,
        "solo_phase_s": solo_s, "concurrent_phase_s": conc_s,
        "single_stream_decode_tok_s_median": single,
        "single_stream_decode_tok_s_median_before": statistics.median(solo_before) if solo_before else 0.0,
        "single_stream_decode_tok_s_median_after": statistics.median(solo_after) if solo_after else 0.0,
        "loadavg_1_5_15": loads,
        "aggregate_decode_tok_s": agg,
        "aggregate_over_single": agg / single if single else 0.0,
        "engine_decode_tok_s_concurrent": engine_decode,
        "busy_slots_peak": m_after.get("vkdecode_slots_busy_peak"),
        "mem_after_load_mib": mem_loaded, "mem_after_solo_half_mib": mem_solo, "mem_end_mib": mem_end,
        "server_exit_status_after_sigterm": rc,
    }
    print(f"| figure | value |\n|---|---|")
    print(f"| requests completed | {completed} / {a.clients} (errors: {len(errors)}) |")
    print(f"| streams equal to their solo run (text and {a.tokens} tokens) | {completed - len(mismatched)} / {a.clients} |")
    print(f"| single stream decode tok/s (median of {len(solo_rates)} solo runs) | {single:.1f} |")
    print(f"| ... median of the solo runs before / after the concurrent phase | "
          f"{fig['single_stream_decode_tok_s_median_before']:.1f} / {fig['single_stream_decode_tok_s_median_after']:.1f} |")
    print(f"| aggregate decode tok/s, {a.clients} clients on --parallel {a.parallel} | {agg:.1f} |")
    print(f"| aggregate / single | {fig['aggregate_over_single']:.2f}x |")
    print(f"| engine decode tok/s in the concurrent phase (/metrics) | {engine_decode:.1f} |")
    print(f"| busy slots, peak | {fig['busy_slots_peak']:.0f} |")
    print(f"| concurrent phase wall time | {conc_s:.1f} s |")
    print("| load average (1 min) at start / after the first solo half / after the concurrent phase / end | "
          + " / ".join(f"{loads[k][0]:.1f}" for k in ("start", "after_solo_before", "after_concurrent", "end")) + " |")
    for name, m in (("after load", mem_loaded), ("after the first solo half", mem_solo), ("at the end", mem_end)):
        print(f"| server memory {name}: VmHWM / RssAnon / RssFile MiB | "
              f"{m['VmHWM']:.1f} / {m['RssAnon']:.1f} / {m['RssFile']:.1f} |")
    print(f"| exit status after SIGTERM | {rc} |")
    for e in errors:
        print("error:", e, file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(fig, f, indent=2)
            f.write("\n")
    ok = completed == a.clients and not errors and not mismatched and rc == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
