#!/usr/bin/env python3
"""An OpenAI-compatible streaming load client for bench/serving/run.sh: sends N requests to
/v1/completions with at most C in flight, each a prompt of about P tokens (a story text cut to
length) and max_tokens T, streaming; measures per request the time to the first token, every gap
between tokens (inter-token latency), the tokens received and the status. Standard library only
(threads and http.client), the same client for every server.

  client.py --url http://127.0.0.1:PORT --model NAME --requests 32 --concurrency 16
            --prompt-words 160 --max-tokens 128 --out result.json
Prints one line of figures; writes the JSON (per-request records and the summary)."""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse

WORDS = ("Once upon a time there was a little girl named Lily who loved to play outside in the "
         "sun with her dog Max and her friends from the village by the river where the old mill "
         "stood and the children ran through the tall grass every summer afternoon until the "
         "bells of the church rang for supper and their mothers called them home").split()


def prompt_of(words, i):
    # Distinct per request and, with --first, per row of a run (a server that kept an earlier
    # row's prompts in its prompt cache must not skip their compute), the same set for every
    # server. The number leads, so two prompts share at most a token or two of prefix.
    text = [f"{i}. Story:"] + [WORDS[(i * 7 + k) % len(WORDS)] for k in range(words)]
    return " ".join(text)


def one(url, model, prompt, max_tokens, timeout):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True, "ignore_eos": True})
    t0 = time.perf_counter()
    rec = {"status": None, "ttft": None, "gaps": [], "tokens": 0, "seconds": None, "error": None}
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        rec["status"] = resp.status
        if resp.status != 200:
            rec["error"] = resp.read()[:300].decode(errors="replace")
            return rec
        last = None
        for raw in resp:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                rec["error"] = str(chunk["error"])[:300]
                break
            text = "".join(c.get("text", "") for c in chunk.get("choices", []))
            if not text:
                continue
            now = time.perf_counter()
            if last is None:
                rec["ttft"] = now - t0
            else:
                rec["gaps"].append(now - last)
            last = now
            rec["tokens"] += 1  # one streamed chunk per token (both servers stream each token)
    except Exception as e:  # noqa: BLE001 - recorded as a failure
        rec["error"] = f"{type(e).__name__}: {e}"[:300]
    finally:
        rec["seconds"] = time.perf_counter() - t0
        conn.close()
    return rec


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="default")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--prompt-words", type=int, default=160)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--first", type=int, default=0,
                    help="index of the first prompt: rows of one run use disjoint ranges")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    records = [None] * a.requests
    next_i = [0]
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= a.requests:
                return
            records[i] = one(a.url, a.model, prompt_of(a.prompt_words, a.first + i), a.max_tokens,
                             a.timeout)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(a.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in records if r["status"] == 200 and not r["error"]]
    gaps = [g for r in ok for g in r["gaps"]]
    ttfts = [r["ttft"] for r in ok if r["ttft"] is not None]
    summary = {
        "requests": a.requests, "concurrency": a.concurrency, "prompt_words": a.prompt_words,
        "max_tokens": a.max_tokens, "ok": len(ok), "failed": a.requests - len(ok),
        "wall_seconds": wall, "tokens": sum(r["tokens"] for r in ok),
        "tokens_per_s": sum(r["tokens"] for r in ok) / wall,
        "ttft_p50": pct(ttfts, 50), "ttft_p90": pct(ttfts, 90), "ttft_p99": pct(ttfts, 99),
        "itl_p50": pct(gaps, 50), "itl_p90": pct(gaps, 90), "itl_p99": pct(gaps, 99),
        "errors": sorted({r["error"] for r in records if r["error"]})[:5],
    }
    json.dump({"summary": summary, "records": records}, open(a.out, "w"))
    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    print(f"{summary['tokens_per_s']:.1f} tok/s, {summary['failed']} failed, ttft p50 "
          f"{f(summary['ttft_p50'])} p90 {f(summary['ttft_p90'])} s, itl p50 "
          f"{f(summary['itl_p50'])} p90 {f(summary['itl_p90'])} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
