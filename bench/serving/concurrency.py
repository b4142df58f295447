#!/usr/bin/env python3
"""Many concurrent streaming clients against one router (bench/serving/concurrency.sh runs it
against `tandem up`): N connections open at once, each sending one streaming /v1/completions
(greedy, ignore_eos, max_tokens T) and reading it to the end. Measures what each client got
(done: 200 and every token; refused: an HTTP status with Retry-After; failed: anything else,
a closed connection included), the streams in flight at once (first byte of the body seen, last
not yet), TTFT p50/p99 and the inter-token p99, and samples the router process (--router-pid)
every 100 ms: CPU seconds used, peak RSS and threads. Standard library only (asyncio).

  concurrency.py --url http://127.0.0.1:PORT --model NAME --clients 1000 --max-tokens 200
                 --router-pid PID [--source 127.0.0.1] [--out row.json]
Prints one line of figures; writes the JSON (the summary, and the statuses refused with)."""
import argparse
import asyncio
import json
import os
import resource
import statistics
import time
import urllib.parse


def proc_sample(pid):
    """(cpu seconds, rss bytes, threads) of a process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return cpu, rss, threads


def percentile(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


class Row:
    def __init__(self):
        self.done = self.refused = self.failed = 0
        self.in_flight = self.peak_in_flight = 0
        self.ttft, self.itl_p99 = [], []
        self.refusals, self.failures = {}, {}


async def one(url, body, row, timeout, source):
    u = urllib.parse.urlparse(url)
    t0 = time.perf_counter()
    streaming = False
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(u.hostname, u.port, local_addr=(source, 0) if source else None,
                                    limit=1 << 20), timeout)
        writer.write((f"POST /v1/completions HTTP/1.1\r\nHost: {u.hostname}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                      f"Connection: close\r\n\r\n").encode() + body)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            key = str(status) + (" retry-after" if b"retry-after:" in head.lower() else "")
            if b"retry-after:" in head.lower():
                row.refused += 1
                row.refusals[key] = row.refusals.get(key, 0) + 1
            else:
                row.failed += 1
                row.failures[key] = row.failures.get(key, 0) + 1
            writer.close()
            return
        streaming = True
        row.in_flight += 1
        row.peak_in_flight = max(row.peak_in_flight, row.in_flight)
        tokens, last, gaps, buf, finished = 0, None, [], b"", False
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), timeout)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if b"data: [DONE]" in event:
                    finished = True
                    continue
                if b'"text"' in event:
                    now = time.perf_counter()
                    if last is None:
                        row.ttft.append(now - t0)
                    else:
                        gaps.append(now - last)
                    last = now
                    tokens += 1
        writer.close()
        if finished and tokens > 0:
            row.done += 1
            if gaps:
                row.itl_p99.append(percentile(gaps, 99))
        else:
            row.failed += 1
            row.failures["stream cut short"] = row.failures.get("stream cut short", 0) + 1
    except Exception as e:  # a closed connection, a timeout: a failure, never a crash
        row.failed += 1
        key = type(e).__name__
        row.failures[key] = row.failures.get(key, 0) + 1
    finally:
        if streaming:
            row.in_flight -= 1


async def sampler(pid, stop, peaks):
    while not stop.is_set():
        try:
            _, rss, threads = proc_sample(pid)
            peaks["rss"] = max(peaks["rss"], rss)
            peaks["threads"] = max(peaks["threads"], threads)
        except OSError:
            pass
        await asyncio.sleep(0.1)


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--router-pid", type=int, required=True)
    ap.add_argument("--source", default="")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    cpu0, rss_idle, threads_idle = proc_sample(a.router_pid)
    body = json.dumps({"model": a.model, "prompt": "Once upon a time", "max_tokens": a.max_tokens,
                       "temperature": 0, "stream": True, "ignore_eos": True}).encode()
    row, peaks, stop = Row(), {"rss": rss_idle, "threads": threads_idle}, asyncio.Event()
    watch = asyncio.create_task(sampler(a.router_pid, stop, peaks))
    t0 = time.perf_counter()
    await asyncio.gather(*(one(a.url, body, row, a.timeout, a.source) for _ in range(a.clients)))
    seconds = time.perf_counter() - t0
    stop.set()
    await watch
    cpu1, _, threads_after = proc_sample(a.router_pid)
    r = {
        "clients": a.clients, "max_tokens": a.max_tokens, "seconds": round(seconds, 1),
        "done": row.done, "refused": row.refused, "failed": row.failed,
        "refusals": row.refusals, "failures": row.failures,
        "peak_streams_in_flight": row.peak_in_flight,
        "ttft_p50_s": percentile(row.ttft, 50), "ttft_p99_s": percentile(row.ttft, 99),
        "itl_p99_s": percentile(row.itl_p99, 99),
        "router_cpu_s": round(cpu1 - cpu0, 1), "router_rss_idle_mb": rss_idle >> 20,
        "router_rss_peak_mb": peaks["rss"] >> 20, "router_threads_idle": threads_idle,
        "router_threads_peak": peaks["threads"],
    }
    print(f"clients {a.clients}: done {row.done} refused {row.refused} failed {row.failed} "
          f"in {seconds:.0f}s; peak in flight {row.peak_in_flight}; TTFT p50/p99 "
          f"{r['ttft_p50_s'] or 0:.2f}/{r['ttft_p99_s'] or 0:.2f}s; ITL p99 {r['itl_p99_s'] or 0:.3f}s; "
          f"router CPU {r['router_cpu_s']}s RSS {rss_idle >> 20}->{peaks['rss'] >> 20} MB threads "
          f"{threads_idle}->{peaks['threads']}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(r, f, indent=1)


asyncio.run(main())
