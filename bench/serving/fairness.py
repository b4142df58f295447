#!/usr/bin/env python3
"""A victim's latency beside hostile clients of another tenant (bench/serving/fairness.sh runs it
against `tandem up`). The victim connects from 127.0.0.2, the hostile clients from 127.0.0.1, so
the router sees two tenants. The hostile clients run in a separate process (the `flood` and
`hogs` subcommands, started by the measuring ones), so the victim's event loop is not shared
with theirs. Standard library only (asyncio, raw sockets).

  fairness.py flooding --url http://127.0.0.1:PORT [--metrics http://127.0.0.1:PORT]
                       [--flood 1000] [--victim 100] [--rounds 3] [--out row.json]
    Flooding tenant: per round, the victim's TTFT alone, then beside a flood. The victim sends
    --victim streaming /v1/completions (max_tokens 8, greedy) one after another, 50 ms apart,
    and times connect to the first SSE event with text. The flood keeps --flood non-streaming
    requests of 200 tokens (ignore_eos) open at all times; the victim starts 3 s after it.
    Reports p50/p90/p99/max per round, and the pooled p50/p99 with the ratio beside/alone.

  fairness.py slow-readers --url URL [--metrics URL] [--never 100] [--slow 70] [--victim 20]
                           [--out row.json]
    Slow readers: --never streaming requests (n 8, max_tokens 400, ignore_eos) whose client
    never reads and --slow that read 64 bytes every 5 s; 2 s later the victim sends --victim
    non-streaming requests (max_tokens 8) one by one and records each one's status and time.

  fairness.py flood --url URL --clients N      (the hostile process of the first row)
  fairness.py hogs --url URL --never N --slow M (the hostile process of the second row)
    Print "ready" once their clients are under way; on SIGTERM they close every connection,
    print one line of JSON (what their clients got) and exit.

Each measuring subcommand first waits until the router holds no request (its /metrics at
--metrics: no request waiting or running; 3 s without --metrics), as the flooding row does
before each alone run; it prints one line of figures and writes its row as JSON (--out)."""
import argparse
import asyncio
import json
import os
import resource
import signal
import socket
import statistics
import sys
import time
import urllib.parse

VICTIM_SOURCE = "127.0.0.2"
HOSTILE_SOURCE = "127.0.0.1"
MODEL = "stories260K"


def percentile(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def summary(xs):
    """Count and p50/p90/p99/max of a list of seconds (rounded to 0.1 ms)."""
    r = {"n": len(xs)}
    for name, p in (("p50_s", 50), ("p90_s", 90), ("p99_s", 99), ("max_s", 100)):
        v = percentile(xs, p)
        r[name] = None if v is None else round(v, 4)
    return r


def count(d, key):
    d[key] = d.get(key, 0) + 1


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def post(url, body):
    """The bytes of POST /v1/completions with BODY (a dict), Connection: close."""
    u = urllib.parse.urlparse(url)
    data = json.dumps(body).encode()
    return (f"POST /v1/completions HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            f"Connection: close\r\n\r\n").encode() + data


async def connect(url, source, limit=1 << 16, rcvbuf=0):
    """A connection to URL's host from SOURCE; RCVBUF, when set, shrinks the kernel's receive
    buffer before connecting, so a client that does not read stops the sender sooner."""
    u = urllib.parse.urlparse(url)
    if not rcvbuf:
        return await asyncio.open_connection(u.hostname, u.port, local_addr=(source, 0),
                                             limit=limit)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((source, 0))
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, (u.hostname, u.port))
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock, limit=limit)


async def read_status(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1])


async def drain_to_end(reader):
    while await reader.read(65536):
        pass


# ---- the victim ---------------------------------------------------------------------------------

async def victim_stream(url, timeout):
    """One streaming request from the victim: (status, seconds from connect to the first SSE event
    with text, or None). The stream is read to its end."""
    request = post(url, {"model": MODEL, "prompt": "Once", "max_tokens": 8, "stream": True,
                         "temperature": 0})

    async def go():
        t0 = time.perf_counter()
        reader, writer = await connect(url, VICTIM_SOURCE)
        try:
            writer.write(request)
            await writer.drain()
            status = await read_status(reader)
            if status != 200:
                await drain_to_end(reader)
                return str(status), None
            ttft, buf = None, b""
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                if ttft is None:
                    buf += chunk
                    if b'"text"' in buf:
                        ttft = time.perf_counter() - t0
                        buf = b""
            return ("200" if ttft is not None else "200 without text"), ttft
        finally:
            writer.close()

    try:
        return await asyncio.wait_for(go(), timeout)
    except asyncio.TimeoutError:
        return "timeout", None
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        return type(e).__name__, None


async def victim_plain(url, timeout):
    """One non-streaming request from the victim, read to its end: (status, seconds)."""
    request = post(url, {"model": MODEL, "prompt": "Once", "max_tokens": 8, "temperature": 0})

    async def go():
        reader, writer = await connect(url, VICTIM_SOURCE)
        try:
            writer.write(request)
            await writer.drain()
            status = await read_status(reader)
            await drain_to_end(reader)
            return str(status)
        finally:
            writer.close()

    t0 = time.perf_counter()
    try:
        status = await asyncio.wait_for(go(), timeout)
    except asyncio.TimeoutError:
        status = "timeout"
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        status = type(e).__name__
    return status, time.perf_counter() - t0


async def victim_series(url, n, timeout):
    """N streaming victim requests one after another, 50 ms apart: (TTFTs, statuses)."""
    ttfts, statuses = [], {}
    for _ in range(n):
        status, ttft = await victim_stream(url, timeout)
        count(statuses, status)
        if ttft is not None:
            ttfts.append(ttft)
        await asyncio.sleep(0.05)
    return ttfts, statuses


# ---- the hostile processes ----------------------------------------------------------------------

async def flood_client(url, request, stats, deadline_s, stop):
    """Loops until STOP: send, read to the end, send again. After a refusal or a failure it waits
    100 ms, so the flood tests the router rather than the client machine's spare CPU."""
    while not stop.is_set():
        writer = None
        try:
            reader, writer = await connect(url, HOSTILE_SOURCE)
            writer.write(request)
            await writer.drain()
            count(stats, "sent")
            status = await asyncio.wait_for(read_status(reader), deadline_s)
            await asyncio.wait_for(drain_to_end(reader), deadline_s)
            count(stats, str(status))
            if status == 200:
                continue
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a closed connection, a timeout: counted, never a crash
            count(stats, type(e).__name__)
        finally:
            if writer is not None:
                writer.close()
        await asyncio.sleep(0.1)


async def run_until_term(tasks, stats, stop):
    """Prints "ready", waits for SIGTERM or SIGINT (which set STOP), cancels TASKS, prints STATS
    as JSON and exits. A task that outlives its cancellation (asyncio.wait_for can swallow one
    before Python 3.12) is given 5 s; the process then exits without it, the kernel closing its
    connection."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    await stop.wait()
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=5)
    print(json.dumps(stats), flush=True)
    os._exit(0)


async def flood_main(a):
    raise_fd_limit()
    request = post(a.url, {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 200,
                           "ignore_eos": True})
    stats, stop = {}, asyncio.Event()
    tasks = [asyncio.create_task(flood_client(a.url, request, stats, 600, stop))
             for _ in range(a.clients)]
    await run_until_term(tasks, stats, stop)


async def hog(url, request, stats, reads):
    """One streaming request that is never read (READS false) or read 64 bytes every 5 s."""
    try:
        reader, writer = await connect(url, HOSTILE_SOURCE, limit=64, rcvbuf=4096)
        writer.write(request)
        await writer.drain()
        count(stats, "sent")
    except Exception as e:
        count(stats, "not sent: " + type(e).__name__)
        return None
    return asyncio.create_task(hog_hold(reader, writer, stats, reads))


async def hog_hold(reader, writer, stats, reads):
    try:
        if not reads:
            await asyncio.Event().wait()
        while True:
            data = await reader.read(64)
            if not data:
                count(stats, "closed by the router")
                return
            stats["bytes read by the slow readers"] += len(data)
            await asyncio.sleep(5)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        count(stats, "failed: " + type(e).__name__)
    finally:
        writer.close()


async def hogs_main(a):
    raise_fd_limit()
    request = post(a.url, {"model": MODEL, "prompt": "Once upon a time", "n": 8,
                           "max_tokens": 400, "stream": True, "ignore_eos": True})
    stats = {"bytes read by the slow readers": 0}
    held = await asyncio.gather(*([hog(a.url, request, stats, False) for _ in range(a.never)] +
                                  [hog(a.url, request, stats, True) for _ in range(a.slow)]))
    await run_until_term([t for t in held if t is not None], stats, asyncio.Event())


class Hostile:
    """A hostile subcommand of this script in its own process."""

    def __init__(self, *argv):
        self.argv, self.proc = argv, None

    async def __aenter__(self):
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, os.path.abspath(__file__), *self.argv, stdout=asyncio.subprocess.PIPE)
        self.stats = {}
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), 300)
            if line.strip() != b"ready":
                raise RuntimeError(f"{self.argv[0]} did not start")
        except BaseException:
            if self.proc.returncode is None:
                self.proc.kill()
            await self.proc.wait()
            raise
        return self

    async def stop(self):
        """Ends the process; its clients' statistics land in self.stats."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            out = await asyncio.wait_for(self.proc.stdout.read(), 60)
            lines = out.decode().strip().splitlines()
            self.stats = json.loads(lines[-1]) if lines else {"no report": 1}
        except (asyncio.TimeoutError, ValueError) as e:
            self.stats = {"killed: " + type(e).__name__: 1}
            self.proc.kill()
        await self.proc.wait()

    async def __aexit__(self, *exc):
        await self.stop()


# ---- the router's queue -------------------------------------------------------------------------

async def router_busy(url):
    """Requests the router holds (waiting plus running, from /metrics at URL), or None."""
    u = urllib.parse.urlparse(url)
    try:
        reader, writer = await asyncio.open_connection(u.hostname, u.port)
        writer.write(f"GET /metrics HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
                     f"Connection: close\r\n\r\n".encode())
        text = (await asyncio.wait_for(reader.read(-1), 10)).decode(errors="replace")
        writer.close()
    except (OSError, asyncio.TimeoutError):
        return None
    busy, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(("tandem_num_requests_waiting", "tandem_num_requests_running")):
            busy += float(line.rsplit(" ", 1)[1])
            seen = True
    return busy if seen else None


async def settle(url, limit_s=120):
    """Waits until the router, whose metrics listener is URL, holds no request (at most LIMIT_S);
    3 s where URL is empty or serves no such figures."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit_s:
        busy = await router_busy(url) if url else None
        if busy is None:
            await asyncio.sleep(3)
            return
        if busy == 0:
            return
        await asyncio.sleep(0.5)


# ---- the rows -----------------------------------------------------------------------------------

def fmt(s):
    return f"{s['p50_s'] or 0:.3f}/{s['p99_s'] or 0:.3f}"


async def flooding_main(a):
    raise_fd_limit()
    rounds, alone_all, beside_all = [], [], []
    for i in range(a.rounds):
        await settle(a.metrics)
        alone, alone_statuses = await victim_series(a.url, a.victim, a.timeout)
        async with Hostile("flood", "--url", a.url, "--clients", str(a.flood)) as flood:
            await asyncio.sleep(3)
            beside, beside_statuses = await victim_series(a.url, a.victim, a.timeout)
            await flood.stop()
        alone_all += alone
        beside_all += beside
        rounds.append({"round": i + 1, "alone": summary(alone), "beside": summary(beside),
                       "alone_statuses": alone_statuses, "beside_statuses": beside_statuses,
                       "flood_requests": flood.stats})
    pooled_alone, pooled_beside = summary(alone_all), summary(beside_all)

    def ratio(key):
        lo, hi = pooled_alone[key], pooled_beside[key]
        return round(hi / lo, 2) if lo and hi is not None else None

    row = {"row": "flooding tenant", "flood_clients": a.flood, "victim_requests": a.victim,
           "rounds": rounds,
           "pooled": {"alone_p50_s": pooled_alone["p50_s"], "alone_p99_s": pooled_alone["p99_s"],
                      "beside_p50_s": pooled_beside["p50_s"],
                      "beside_p99_s": pooled_beside["p99_s"],
                      "ratio_p50": ratio("p50_s"), "ratio_p99": ratio("p99_s")}}
    per_round = "; ".join(f"{r['round']}: {fmt(r['alone'])} -> {fmt(r['beside'])}"
                          for r in rounds)
    failed = sum(n for r in rounds for key in ("alone_statuses", "beside_statuses")
                 for s, n in r[key].items() if s != "200")
    p = row["pooled"]
    print(f"flooding tenant ({a.flood} clients): victim TTFT p50/p99 alone "
          f"{p['alone_p50_s'] or 0:.3f}/{p['alone_p99_s'] or 0:.3f}s, beside "
          f"{p['beside_p50_s'] or 0:.3f}/{p['beside_p99_s'] or 0:.3f}s "
          f"(x{p['ratio_p50']}/x{p['ratio_p99']}); victim requests not served {failed}; "
          f"per round {per_round}")
    return row


async def slow_readers_main(a):
    raise_fd_limit()
    await settle(a.metrics)
    statuses, times = {}, []
    async with Hostile("hogs", "--url", a.url, "--never", str(a.never),
                       "--slow", str(a.slow)) as hogs:
        await asyncio.sleep(2)
        for _ in range(a.victim):
            status, seconds = await victim_plain(a.url, a.timeout)
            count(statuses, status)
            times.append(seconds)
        await hogs.stop()
    row = {"row": "slow readers", "never_reading": a.never, "reading_64_bytes_per_5s": a.slow,
           "victim_requests": a.victim, "victim_statuses": statuses,
           "min_s": round(min(times), 4), "p50_s": round(statistics.median(times), 4),
           "max_s": round(max(times), 4), "hog_requests": hogs.stats}
    print(f"slow readers ({a.never} never reading, {a.slow} reading 64 B every 5 s): victim "
          f"{a.victim} requests, statuses {statuses}, min/p50/max "
          f"{row['min_s']:.3f}/{row['p50_s']:.3f}/{row['max_s']:.3f}s")
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("flooding")
    p.add_argument("--flood", type=int, default=1000)
    p.add_argument("--victim", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p = sub.add_parser("slow-readers")
    p.add_argument("--never", type=int, default=100)
    p.add_argument("--slow", type=int, default=70)
    p.add_argument("--victim", type=int, default=20)
    p = sub.add_parser("flood")
    p.add_argument("--clients", type=int, default=1000)
    p = sub.add_parser("hogs")
    p.add_argument("--never", type=int, default=100)
    p.add_argument("--slow", type=int, default=70)
    for p in sub.choices.values():
        p.add_argument("--url", required=True)
    for name in ("flooding", "slow-readers"):
        sub.choices[name].add_argument("--timeout", type=float, default=120)
        sub.choices[name].add_argument("--out", default="")
        sub.choices[name].add_argument("--metrics", default="",
                                       help="the router's metrics listener, http://HOST:PORT")
    a = ap.parse_args()
    if a.command == "flood":
        asyncio.run(flood_main(a))
    elif a.command == "hogs":
        asyncio.run(hogs_main(a))
    else:
        row = asyncio.run((flooding_main if a.command == "flooding" else slow_readers_main)(a))
        if a.out:
            with open(a.out, "w") as f:
                json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
