"""The JSON nesting check's cost beside the decode it guards (inferd.api.wire.json_depth.depth_exceeds).

    .venv/bin/python bench/json_depth.py [--repeat 20]

For ~1 MiB bodies of different shapes (one long prompt full of brackets, many tools, token ids, 500,000 deep,
escape-heavy text) it prints `name: value` lines: the check's mean milliseconds, msgspec's decode of the same
bytes into Python objects, and their ratio, measured in this one run. Every body goes through both on the event
loop; the check must stay in the decode's range, never a Python loop over the bytes.
"""
from __future__ import annotations

import argparse
import time

import msgspec
import orjson

from inferd.api.wire.json_depth import depth_exceeds


def bodies() -> dict[str, bytes]:
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "enum": ["x", "y"]}}}}}
    return {
        "prompt_brackets": orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x[{" * 350_000}]}),
        "tools": orjson.dumps({"model": "m", "tools": [tool] * 6_000}),
        "token_ids": orjson.dumps({"model": "m", "prompt": [list(range(100))] * 2_500}),
        "deep_500000": b"[" * 500_000 + b"]" * 500_000,
        "escapes": orjson.dumps({"model": "m", "prompt": 'a\\"[' * 250_000}),
    }


def mean_ms(fn, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1e3


def decode(body: bytes) -> None:
    try:
        msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    for name, body in bodies().items():
        check = mean_ms(lambda: depth_exceeds(body), args.repeat)
        full = mean_ms(lambda: decode(body), args.repeat)
        print(f"{name}_bytes: {len(body)}")
        print(f"{name}_check_ms: {check:.2f}")
        print(f"{name}_decode_ms: {full:.2f}")
        print(f"{name}_check_over_decode: {check / full:.2f}")


if __name__ == "__main__":
    main()
