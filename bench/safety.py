"""Output filter: how much of a banned match reaches the client (goal: nothing), and what it costs.

One real Daemon in this process serves a simulated model (real time). For each of N prompts the
greedy output is generated once without a policy; a word from its middle becomes the banned word of
the tenant's output policy (set by reload); then the same request is streamed again and the bench
counts the characters and tokens of the match (and after it) that reached the client, and the time
from the banned token's generation to the stream's end (the stop latency the client sees).
It also compares stream throughput with and without the filter on unbanned output.

    python bench/safety.py [--prompts 40] [--max-tokens 120]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time

import aiohttp

from in_process import daemon_in_process  # noqa: E402 (bench/ is this script's own directory)

CONFIG = """
[server]
port = 0
log_level = "error"
state_dir = "{state}"
[models.llama]
backend = "sim"
max_batch_size = 64
[models.llama.sim]
profile = "llama3-8b-h100"
"""


async def stream_text(http, url: str, body: dict) -> tuple[str, str | None, list[tuple[float, str]]]:
    """The streamed text, the finish reason and (arrival time, text) per chunk."""
    chunks, finish = [], None
    async with http.post(url, json={**body, "stream": True}) as resp:
        async for line in resp.content:
            if line.startswith(b"data: {"):
                event = json.loads(line[6:])
                for choice in event.get("choices", []):
                    chunks.append((time.perf_counter(), choice["text"]))
                    finish = choice["finish_reason"] or finish
    return "".join(t for _, t in chunks), finish, chunks


async def main(args) -> None:
    leaked_chars = leaked_tokens = stopped = 0
    tails = []
    async with daemon_in_process(lambda state: CONFIG.format(state=state), "inferd-safety-bench-") as \
            (daemon, base, path), aiohttp.ClientSession() as http:
        url = base + "/v1/completions"
        bodies = [{"model": "llama", "prompt": f"prompt number {i}", "max_tokens": args.max_tokens,
                   "temperature": 0, "ignore_eos": True} for i in range(args.prompts)]
        fulls = [await stream_text(http, url, b) for b in bodies]
        start = time.perf_counter()
        await asyncio.gather(*(stream_text(http, url, b) for b in bodies))
        plain_s = time.perf_counter() - start
        banned = []
        for text, _, _ in fulls:
            words = text.split()
            banned.append(words[len(words) // 2])
        patterns = ", ".join(json.dumps(r"\b" + re.escape(w) + r"\b") for w in banned)
        path.write_text(path.read_text() + f'[tenants.local]\npolicy = "p"\n[policies.p.output]\n'
                                           f"patterns = [{patterns}]\nhold_back_chars = 32\n")
        assert (await daemon.reload()).ok
        start = time.perf_counter()
        results = await asyncio.gather(*(stream_text(http, url, b) for b in bodies))
        filtered_s = time.perf_counter() - start
        path.write_text(path.read_text().replace(f"patterns = [{patterns}]", 'patterns = ["\\\\bzzqq\\\\b"]'))
        assert (await daemon.reload()).ok         # a policy that never matches: the filter's own cost
        start = time.perf_counter()
        await asyncio.gather(*(stream_text(http, url, b) for b in bodies))
        unmatched_s = time.perf_counter() - start
        for (full, _, _), (sent, finish, chunks) in zip(fulls, results):
            first = min(m.start() for w in banned if (m := re.search(r"\b" + re.escape(w) + r"\b", full)))
            stopped += finish == "content_filter"
            leaked_chars += max(0, len(sent) - first)
            leaked_tokens += len(sent[first:].split()) if len(sent) > first else 0
            if len(chunks) >= 2:
                tails.append(chunks[-1][0] - chunks[-2][0])
    print(f"streams stopped by the output filter: {stopped} of {args.prompts}")
    print(f"characters of the match or after it that reached the client: {leaked_chars}; tokens: {leaked_tokens}")
    if tails:
        print(f"gap before the final (content_filter) chunk: p50 {statistics.median(tails) * 1000:.2f} ms")
    print(f"{args.prompts} concurrent streams of {args.max_tokens} tokens: {plain_s:.2f} s without a policy, "
          f"{unmatched_s:.2f} s through an output filter that never matches; {filtered_s:.2f} s when each stops "
          f"at its match")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=120)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(parser.parse_args()))
