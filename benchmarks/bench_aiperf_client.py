"""The closed-loop client, measured: real aiperf against an engine whose step costs are
known, and servetune's replay of the same run (docs/closed-loop.md). Usage:

    python -m venv /tmp/aiperf && /tmp/aiperf/bin/pip install aiperf==0.4.0 'numpy>=2'
    .venv/bin/python benchmarks/bench_aiperf_client.py --aiperf /tmp/aiperf/bin/aiperf

The engine is a stand-in, not vLLM: an OpenAI-compatible streaming server (stdlib asyncio)
whose engine thread steps like vLLM V1 with synchronous scheduling (8,192-token budget,
running requests first, waiting prefills packed and the last one chunked, arrivals
admitted between steps) and sleeps each step for what `STEP` prices it at.
It adds 8 chat-template tokens to every prompt, as Qwen3's template does. aiperf runs
`--concurrency C`, 20 x C requests after 2 x C warm-ups, fixed lengths, ignore_eos,
streaming (the development runs had 10 x C requests and a C + isl + 1,500-token budget:
`--rounds` and `--budget` set them here) with its default worker count, against a
word-level tokenizer (no model download).

servetune replays each run with the same step costs through `optimizer.sim.simulate`
(the engine's costs are this script's, so the CLI's stored latency models do not apply),
with its aiperf client model and no API-server path (the stand-in's costs ~0.3 ms).

What it measures is the client alone: does the real client break the lock-step groups of
equal-length requests (docs/closed-loop.md), and how far is the replay of the client from
it. The server's log gives the prefill groups (prompts whose first token came in one step).
Columns: aiperf's mean and p50 TTFT and mean TPOT; `server`, mean TTFT from a request
reaching the stand-in (the rest of aiperf's TTFT is the client and the socket); the
replay's; the replay against aiperf. It needs a free port (8123 by default) and takes
about 1-4 minutes per case on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.latency.base import StepLoad

CASES = ((1024, 128, 8), (1024, 128, 32), (4096, 128, 8), (4096, 128, 32))  # isl, osl, C
TEMPLATE_TOKENS = 8  # Qwen3's chat template around one user message
HEAD = "{:>9s} {:>4s} | {:>11s} {:>6s} {:>6s} {:>6s} | {:>11s} {:>6s} {:>6s} | {:>7s} {:>6s}"
ROW = ("{:>9s} {:4d} | {:8.0f} ms {:6.0f} {:6.1f} {:6.0f} | {:8.0f} ms {:6.0f} {:6.1f} | "
       "{:+7.1%} {:+6.1%}")  # fmt: skip


# The stand-in's step cost, which also prices the replay: 15 ms + 50 us a token + 50 us a
# sampled row (a decode costs 100 us, a 1,032-token prefill 66.6 ms).
STEP = LinearLatency(base_s=0.015, per_token_s=5.0e-5, per_seq_s=5.0e-5)


class _Request:
    __slots__ = ("arrived", "done", "first", "max_out", "out", "prompt", "tokens")

    def __init__(self, prompt: int, max_out: int, tokens: asyncio.Queue) -> None:
        self.prompt, self.max_out, self.tokens = prompt, max_out, tokens
        self.done = self.out = 0
        self.arrived = time.monotonic()
        self.first = float("nan")


class StandInEngine:
    """The engine thread (vLLM V1's loop, synchronous scheduling) and its server."""

    def __init__(self, step: LinearLatency, budget: int) -> None:
        self.step, self.budget = step, budget
        self.inbox: queue.Queue[_Request] = queue.Queue()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.finished: list[_Request] = []
        self.warmups = 0  # requests the client sends first, left out of `groups`
        self.seen = 0
        self.groups: list[int] = []  # measured prompts whose first token came in each step
        self.stop = threading.Event()
        self.prompts: Counter[int] = Counter()  # prompt tokens seen (template included)

    def run_engine(self) -> None:
        waiting: list[_Request] = []
        running: list[_Request] = []
        while not self.stop.is_set():
            if not waiting and not running:
                try:
                    waiting.append(self.inbox.get(timeout=0.1))
                except queue.Empty:
                    continue
            while True:  # admitted between steps
                try:
                    waiting.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            budget, plan = self.budget, []
            for r in running:
                if budget <= 0:
                    break
                n = min(r.prompt - r.done, budget) if r.done < r.prompt else 1
                plan.append((r, n))
                budget -= n
            while waiting and budget > 0:
                r = waiting.pop(0)
                running.append(r)
                n = min(r.prompt, budget)
                plan.append((r, n))
                budget -= n
            chunks = [(r, n) for r, n in plan if r.done < r.prompt]  # prefill chunks
            decodes = len(plan) - len(chunks)
            sampled = decodes + sum(r.done + n >= r.prompt for r, n in chunks)
            load = StepLoad(
                num_tokens=sum(n for _, n in plan), num_logits=sampled,
                prefill_q=tuple(n for _, n in chunks),
                prefill_kv=tuple(r.done + n for r, n in chunks), num_decode_seqs=decodes,
            )  # fmt: skip
            time.sleep(self.step.step_time_s(load))
            now, firsts = time.monotonic(), 0
            for r, n in plan:
                if r.done < r.prompt:
                    r.done += n
                    if r.done < r.prompt:
                        continue
                    r.first, firsts = now, firsts + 1
                r.out += 1
                end = r.out >= r.max_out
                self.loop.call_soon_threadsafe(r.tokens.put_nowait, end)
                if end:
                    running.remove(r)
                    self.finished.append(r)
            self.seen += firsts
            if firsts and self.seen > self.warmups:
                self.groups.append(min(firsts, self.seen - self.warmups))

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        length = next((int(h.split(":", 1)[1]) for h in lines if h.lower().startswith(
            "content-length:")), 0)  # fmt: skip
        body = await reader.readexactly(length) if length else b""
        if not lines[0].startswith("POST"):
            data = json.dumps({"object": "list", "data": [{"id": "stand-in"}]}).encode()
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            writer.write(head + b"Content-Length: %d\r\n\r\n" % len(data) + data)
            await writer.drain()
            writer.close()
            return
        req = json.loads(body)
        content = req["messages"][-1]["content"]
        if isinstance(content, list):
            content = " ".join(part.get("text", "") for part in content)
        out = int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
        r = _Request(len(content.split()) + TEMPLATE_TOKENS, out, asyncio.Queue())
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Cache-Control: no-cache\r\nConnection: close\r\n\r\n")  # fmt: skip
        self.prompts[r.prompt] += 1
        self.inbox.put(r)
        first = True
        while True:
            end = await r.tokens.get()
            if first:
                writer.write(_chunk({"role": "assistant", "content": ""}))
                first = False
            writer.write(_chunk({"content": " the"}))
            if end:
                break
            await writer.drain()
        writer.write(_chunk({}, "length") + b"data: [DONE]\n\n")
        await writer.drain()
        writer.close()

    def serve(self, port: int, ready: threading.Event) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            server = await asyncio.start_server(self.handle, "127.0.0.1", port, backlog=1024)
            ready.set()
            while not self.stop.is_set():
                await asyncio.sleep(0.1)
            server.close()

        asyncio.run(main())


def _chunk(delta: dict, finish: str | None = None) -> bytes:
    body = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "stand-in",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _tokenizer(aiperf: str, where: Path) -> None:
    """A word-level tokenizer: every word of aiperf's prompt corpus is one token, so the
    stand-in counts a prompt's tokens by its words."""
    with open(shutil.which(aiperf) or aiperf, "rb") as f:
        python = f.readline().decode().removeprefix("#!").strip()
    found = subprocess.run(
        [python, "-c", "import aiperf, pathlib; print(next(pathlib.Path(aiperf.__file__)"
         ".parent.rglob('shakespeare.txt')))"], capture_output=True, text=True, check=False,
    )  # fmt: skip
    if found.returncode != 0:
        raise SystemExit(f"cannot find aiperf's prompt corpus with {python}: {found.stderr[-500:]}")
    words = sorted(set(Path(found.stdout.strip()).read_text().split()) - {"[UNK]"})
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    where.mkdir(parents=True, exist_ok=True)
    spec = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None, "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }  # fmt: skip
    (where / "tokenizer.json").write_text(json.dumps(spec))
    (where / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]",
        "model_max_length": 10**7}))  # fmt: skip


def measure(aiperf: str, isl: int, osl: int, c: int, step: LinearLatency, budget: int, port: int,
            rounds: int, tmp: Path) -> tuple[dict, StandInEngine]:  # fmt: skip
    """One aiperf run against a fresh stand-in engine: aiperf's summary and the engine."""
    engine = StandInEngine(step, budget)
    engine.warmups = 2 * c
    ready = threading.Event()
    server = threading.Thread(target=engine.serve, args=(port, ready), daemon=True)
    server.start()
    if not ready.wait(10):
        raise SystemExit(f"the stand-in server did not start on port {port}")
    stepping = threading.Thread(target=engine.run_engine, daemon=True)
    stepping.start()
    out = tmp / f"run_{isl}_{osl}_{c}"
    cmd = [aiperf, "profile", "-m", "stand-in", "--endpoint-type", "chat",
           "-u", f"http://127.0.0.1:{port}", "--tokenizer", str(tmp / "tokenizer"),
           "--isl", str(isl), "--isl-stddev", "0", "--osl", str(osl), "--osl-stddev", "0",
           "--extra-inputs", "ignore_eos:true", "--concurrency", str(c),
           "--request-count", str(rounds * c), "--warmup-request-count", str(2 * c),
           "--random-seed", "100", "--ui", "simple", "--streaming",
           "--artifact-dir", str(out)]  # fmt: skip
    env = {**os.environ, "AIPERF_SERVICE_PROFILE_START_TIMEOUT": "7200"}
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    finally:
        engine.stop.set()
        stepping.join(5)
        server.join(5)
    export = out / "profile_export_aiperf.json"
    if set(engine.prompts) != {isl + TEMPLATE_TOKENS}:
        print(f"  note: prompts of {dict(engine.prompts)} tokens, not {isl + TEMPLATE_TOKENS}")
    if done.returncode != 0 or not export.exists():
        raise SystemExit(
            f"aiperf failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}"
        )
    return json.loads(export.read_text()), engine


def replay(isl: int, osl: int, c: int, step: LinearLatency, budget: int, rounds: int):
    from optimizer.bench_serve import BenchServeSpec
    from optimizer.closed_loop_workload import NO_FRONTEND
    from optimizer.config import InstanceConfig, ServingConfig
    from optimizer.sim import simulate

    inst = InstanceConfig(accelerator="h100", tp=2, max_num_batched_tokens=budget,
                          max_num_seqs=1024)  # fmt: skip
    config = ServingConfig.colocated("Qwen/Qwen3-32B", inst, engine_version="0.12.0")
    spec = BenchServeSpec(random_input_len=isl, random_output_len=osl, num_prompts=rounds * c,
                          max_concurrency=c, num_warmups=2 * c,
                          chat_template_tokens=TEMPLATE_TOKENS, client="aiperf")  # fmt: skip
    spec = replace(spec, frontend=NO_FRONTEND)
    return simulate(spec.workload(), config, SingleLatencySource(step), seed=0)


def _groups(sizes: list[int]) -> str:
    return " ".join(f"{k}x{n}" for k, n in sorted(Counter(sizes).items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--aiperf", default="aiperf", help="the aiperf executable")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--rounds", type=int, default=20, help="requests per client (20)")
    parser.add_argument("--budget", type=int, default=8192, help="max_num_batched_tokens")
    parser.add_argument("--only", default=None, help="one case, ISL/OSL/C (e.g. 1024/128/8)")
    args = parser.parse_args()
    cases = CASES
    if args.only:
        cases = (tuple(int(x) for x in args.only.split("/")),)
    step = STEP
    print(f"stand-in engine: step = {step.base_s * 1e3:.0f} ms + {step.per_token_s * 1e6:.0f} "
          f"us/token + {step.per_seq_s * 1e6:.0f} us/sampled row, budget {args.budget}; "
          f"aiperf {args.aiperf}, {args.rounds} requests per client after 2")  # fmt: skip
    head = ("ISL/OSL", "C", "aiperf TTFT", "p50", "TPOT", "server", "replay TTFT", "p50", "TPOT",
            "TTFT", "TPOT")  # fmt: skip
    print("\n" + HEAD.format(*head) + " | prefill groups (size x steps): stand-in / replay")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        _tokenizer(args.aiperf, tmp / "tokenizer")
        for isl, osl, c in cases:
            summary, engine = measure(args.aiperf, isl, osl, c, step, args.budget, args.port,
                                      args.rounds, tmp)  # fmt: skip
            res = replay(isl, osl, c, step, args.budget, args.rounds)
            m_ttft = summary["time_to_first_token"]
            m_tpot = summary["inter_token_latency"]["avg"]
            # the stand-in's own share: from a request reaching it to its first token
            served = sorted(engine.finished, key=lambda r: r.arrived)[2 * c :]
            server_ttft = 1e3 * float(np.mean([r.first - r.arrived for r in served]))
            r_ttft = float(np.nanmean(res.ttft_s)) * 1e3
            r_p50 = float(np.nanmedian(res.ttft_s)) * 1e3
            r_tpot = float(np.nanmean(res.tpot_s)) * 1e3
            firsts = np.round(res.arrival_s + res.ttft_s, 9)  # the step each prefill ended
            replay_groups = list(Counter(firsts[~np.isnan(firsts)]).values())
            row = (f"{isl}/{osl}", c, m_ttft["avg"], m_ttft["p50"], m_tpot, server_ttft, r_ttft,
                   r_p50, r_tpot, r_ttft / m_ttft["avg"] - 1, r_tpot / m_tpot - 1)  # fmt: skip
            groups = f"{_groups(engine.groups)} / {_groups(replay_groups)}"
            print(ROW.format(*row) + " | " + groups, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
