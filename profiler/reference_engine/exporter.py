"""The reference engine serving open-loop traffic with vLLM's Prometheus metrics.

`VllmMetrics` holds the series vLLM V1's `PrometheusStatLogger` exports, with the
names, units and bucket boundaries `optimizer.telemetry` reads, labelled
`model_name` and `engine="0"`, and observes them when vLLM does: TTFT, the per-token
gaps (ITL) and the prompt/generation token counters as tokens are emitted; E2E, queue
time, the length histograms and `request_success_total{finished_reason="length"}`
when a request finishes; preemptions and the running/waiting/KV-usage gauges after
every step. The page is rendered by `prometheus_client`, the library vLLM exports
with; it keeps the `_created` series prometheus_client adds by default, which the
reader ignores. `serve_metrics` serves it over HTTP in the text format (see there why
not prometheus_client's own server).

`serve_open_loop` serves Poisson phases on one colocated CPU replica in real time
(`Clock.WALL`); the module is also a command that serves the page over HTTP:

    python -m profiler.reference_engine.exporter --config examples/reference-engine.yaml \\
        --port 8000 --phase 2:60 --phase 8:60 [--prompt-mean 200] [--output-mean 40] \\
        [--seed 0] [--linger-s 30]
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from optimizer.config import Role, ServingConfig, ServingMode
from optimizer.telemetry import vllm as names
from optimizer.telemetry.synthetic import (
    ITL_BUCKETS_S,
    REQUEST_LATENCY_BUCKETS_S,
    TTFT_BUCKETS_S,
    token_buckets,
)
from profiler.reference_engine.instance import InstanceSpec, open_engine
from profiler.reference_engine.realtime import (
    Clock,
    ReplayOptions,
    ReplayResult,
    check_fits,
    collect,
    instance_spec,
    make_requests,
    run_realtime,
)
from profiler.reference_engine.scheduler import EngineError, EngineRequest, Scheduler
from profiler.reference_engine.traffic import OpenLoopTraffic, TrafficPhase


class VllmMetrics:
    """vLLM's `/metrics` series for one engine instance, in its own registry.

    Not thread-safe beyond what prometheus_client guarantees: the `on_*` calls come
    from the engine's thread; an HTTP thread may render `registry` at any time."""

    def __init__(self, model_name: str, max_model_len: int) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        labels = ("model_name", "engine")
        values = (model_name, "0")  # vLLM V1 labels the engine core by its index

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            made = Histogram(name, doc, labels, buckets=buckets, registry=self.registry)
            return made.labels(*values)

        def counter(name: str, doc: str) -> Counter:
            made = Counter(name.removesuffix("_total"), doc, labels, registry=self.registry)
            return made.labels(*values)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=self.registry).labels(*values)

        tokens = token_buckets(max_model_len)
        self.ttft = histogram(names.TTFT, "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS_S)  # fmt: skip
        self.itl = histogram(names.ITL, "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS_S)  # fmt: skip
        self.e2e = histogram(names.E2E, "Histogram of e2e request latency in seconds.",
                             REQUEST_LATENCY_BUCKETS_S)  # fmt: skip
        self.queue = histogram(names.QUEUE, "Histogram of time spent in WAITING phase for "
                               "request.", REQUEST_LATENCY_BUCKETS_S)  # fmt: skip
        self.prompt_len = histogram(names.PROMPT_TOKENS, "Number of prefill tokens processed.",
                                    tokens)  # fmt: skip
        self.output_len = histogram(names.GENERATION_TOKENS,
                                    "Number of generation tokens processed.", tokens)  # fmt: skip
        success = Counter(names.REQUEST_SUCCESS.removesuffix("_total"),
                          "Count of successfully processed requests.",
                          (*labels, "finished_reason"), registry=self.registry)  # fmt: skip
        self.success = success.labels(*values, "length")  # every request stops at its length
        self.prompt_tokens = counter(names.PROMPT_TOKENS_TOTAL, "Number of prefill tokens "
                                     "processed.")  # fmt: skip
        self.generation_tokens = counter(names.GENERATION_TOKENS_TOTAL, "Number of generation "
                                         "tokens processed.")  # fmt: skip
        self.preemptions = counter(names.PREEMPTIONS, "Cumulative number of preemption from "
                                   "the engine.")  # fmt: skip
        self.running = gauge(names.RUNNING, "Number of requests in model execution batches.")
        self.waiting = gauge(names.WAITING, "Number of requests waiting to be processed.")
        self.kv_usage = gauge(names.KV_USAGE[0], "KV-cache usage. 1 means 100 percent usage.")
        self._num_seen: dict[int, int] = {}  # request id -> output tokens observed
        self._num_preemptions = 0  # the scheduler's count when last observed

    def on_tokens(self, r: EngineRequest, arrived_s: float) -> None:
        """Observe the output tokens `r` emitted since the last call: TTFT at the first
        (with its prompt tokens, as vLLM counts them), one ITL per gap between tokens.
        `arrived_s`: its arrival on the engine clock."""
        seen = self._num_seen.get(r.rid, 0)
        times = r.token_times_s
        if len(times) == seen:
            return
        if seen == 0:
            self.ttft.observe(times[0] - arrived_s)
            self.prompt_tokens.inc(r.num_prompt)
        for i in range(max(seen, 1), len(times)):
            self.itl.observe(times[i] - times[i - 1])
        self.generation_tokens.inc(len(times) - seen)
        self._num_seen[r.rid] = len(times)

    def on_finished(self, r: EngineRequest, arrived_s: float) -> None:
        """Observe a finished request: its last tokens, E2E, queue time, lengths."""
        self.on_tokens(r, arrived_s)
        del self._num_seen[r.rid]
        self.e2e.observe(r.token_times_s[-1] - arrived_s)
        if r.first_scheduled_s is not None:
            self.queue.observe(r.first_scheduled_s - arrived_s)
        self.prompt_len.observe(r.num_prompt)
        self.output_len.observe(r.num_generated)
        self.success.inc()

    def on_step(self, scheduler: Scheduler) -> None:
        """The gauges as the scheduler stands, and preemptions since the last call."""
        self.preemptions.inc(scheduler.num_preemptions - self._num_preemptions)
        self._num_preemptions = scheduler.num_preemptions
        self.running.set(len(scheduler.running))
        self.waiting.set(len(scheduler.waiting))
        pool = scheduler.pool
        self.kv_usage.set(1.0 - pool.num_free / pool.num_blocks)

    def render(self) -> str:
        """The `/metrics` page as it stands."""
        return generate_latest(self.registry).decode()


TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"


def serve_metrics(metrics: VllmMetrics, port: int) -> ThreadingHTTPServer:
    """Serve `metrics` at http://127.0.0.1:PORT/metrics (0: a free port, then
    `server.server_port`) from a daemon thread until `server.shutdown()`.

    Always in the text format 0.0.4. prometheus_client's own server negotiates
    OpenMetrics, and its releases from 0.22 on then write sample names with `:` turned
    into `_` (`vllm_request_success_total`, while `# TYPE` keeps `vllm:`) unless the
    scraper asks for `escaping=allow-utf-8`, which Prometheus 2.x does not
    (prometheus/client_python issue 1177): the series would lose vLLM's names."""
    registry = metrics.registry

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.partition("?")[0] != "/metrics":
                self.send_error(404, "only /metrics is served")
                return
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", TEXT_FORMAT)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


@dataclass(frozen=True, slots=True)
class OpenLoopRun:
    """What was served: the engine's requests (times on its clock, arrivals relative to
    `t0`) and the measured outcome."""

    t0: float
    requests: tuple[EngineRequest, ...]
    result: ReplayResult


def exporter_spec(config: ServingConfig, options: ReplayOptions) -> InstanceSpec:
    """The one colocated CPU replica `config` describes, refused otherwise."""
    if config.mode is not ServingMode.COLOCATED:
        raise EngineError("the exporter serves a colocated config (one replica), not "
                          f"{config.mode.value}")  # fmt: skip
    if config.replica is None or config.replica.accelerator != "cpu":
        raise EngineError("the exporter runs on this machine's CPU: the config's "
                          "accelerator must be cpu, so that observe prices it for one")  # fmt: skip
    return instance_spec(config, Role.REPLICA, options)


def max_request_tokens(config: ServingConfig, spec: InstanceSpec) -> int:
    """The longest prompt + output one request may have: KV capacity, max_model_len."""
    lim = spec.limits
    limit = lim.num_blocks * lim.block_size - lim.num_speculative_tokens
    if not lim.enable_chunked_prefill:
        limit = min(limit, lim.max_num_batched_tokens)
    return min(limit, config.max_model_len or limit)


def serve_open_loop(
    config: ServingConfig,
    traffic: OpenLoopTraffic,
    metrics: VllmMetrics,
    *,
    options: ReplayOptions | None = None,
    on_phase: Callable[[int, TrafficPhase], None] | None = None,
    on_ready: Callable[[], None] | None = None,
) -> OpenLoopRun:
    """Serve `traffic` in real time on the replica `config` describes, observing
    `metrics` as it goes. `on_ready()` runs after the engine's warm-up, just before
    the traffic starts; `on_phase(i, phase)` (i from 1) at each phase's start (at the
    first step or idle wake-up at or after it)."""
    options = options or ReplayOptions()
    if options.clock is not Clock.WALL:
        raise EngineError("the exporter serves on the wall clock (Prometheus scrapes in real time)")
    import torch

    from profiler.timing import fixed_threads

    spec = exporter_spec(config, options)
    requests = traffic.draw(max_request_tokens(config, spec))
    check_fits(requests, spec, prompt_only=False)
    with fixed_threads(options.num_threads), torch.inference_mode():
        engine = open_engine(spec)
        engine.warm_up()
        reqs = make_requests(requests, seed=options.seed, disaggregated=False)
        sched = engine.scheduler
        metrics.on_step(sched)
        if on_ready is not None:
            on_ready()
        t0 = engine.clock() + 0.01
        starts = traffic.starts_s()
        announced = 0

        def after_step() -> None:
            nonlocal announced
            for r in sched.running:
                metrics.on_tokens(r, t0 + r.arrival_s)
            metrics.on_step(sched)
            now = max(engine.clock(), t0)  # the first phase is announced at once
            while announced < len(starts) and t0 + starts[announced] <= now:
                announced += 1
                if on_phase is not None:
                    on_phase(announced, traffic.phases[announced - 1])

        after_step()
        run_realtime(
            engine, reqs, t0, on_finished=lambda r: metrics.on_finished(r, t0 + r.arrival_s),
            after_step=after_step,
        )  # fmt: skip
        for start in [*starts[announced:], traffic.duration_s]:  # idle phases at the end
            time.sleep(max(0.0, t0 + start - engine.clock()))
            after_step()
    result = collect(reqs, t0, (("replica", tuple(engine.steps)),))
    return OpenLoopRun(t0, tuple(reqs), result)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m profiler.reference_engine.exporter",
        description="Serve Poisson traffic on the reference engine (one CPU replica) in real "
        "time and export vLLM's Prometheus metrics at http://127.0.0.1:PORT/metrics.",
    )
    parser.add_argument("--config", type=Path, required=True, help="a ServingConfig YAML")
    parser.add_argument("--port", type=int, required=True, help="0: a free port (printed)")
    parser.add_argument("--phase", action="append", required=True, metavar="RATE:SECONDS",
                        help="Poisson arrivals at RATE requests/s for SECONDS; repeat for "
                        "phases one after another")  # fmt: skip
    parser.add_argument("--prompt-mean", type=float, default=200.0, help="tokens (lognormal)")
    parser.add_argument("--output-mean", type=float, default=40.0, help="tokens (lognormal)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--linger-s", type=float, default=30.0,
                        help="keep serving /metrics this long after the traffic ends")  # fmt: skip
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be 0-65535, got {args.port}")
    if not (math.isfinite(args.linger_s) and args.linger_s >= 0):
        parser.error(f"--linger-s must be >= 0 seconds, got {args.linger_s:g}")
    config = _load_config(parser, args.config)
    try:
        traffic = OpenLoopTraffic(
            tuple(TrafficPhase.parse(p) for p in args.phase),
            prompt_mean=args.prompt_mean, output_mean=args.output_mean, seed=args.seed,
        )  # fmt: skip
        spec = exporter_spec(config, ReplayOptions(seed=args.seed))
        max_tokens = max_request_tokens(config, spec)
        traffic.draw(max_tokens)  # refuses traffic the config cannot hold, before serving
    except EngineError as exc:
        parser.error(str(exc))
    metrics = VllmMetrics(config.model, config.max_model_len or max_tokens)
    try:
        server = serve_metrics(metrics, args.port)
    except OSError as exc:
        parser.error(f"--port {args.port}: cannot listen on 127.0.0.1: {exc.strerror or exc}")
    try:
        print(f"serving vLLM metrics on http://127.0.0.1:{server.server_port}/metrics",
              flush=True)  # fmt: skip
        run = serve_open_loop(
            config, traffic, metrics, options=ReplayOptions(seed=args.seed),
            on_phase=lambda i, p: print(
                f"phase {i}: {p.rate_rps:g} req/s for {p.duration_s:g} s", flush=True
            ),
        )  # fmt: skip
        lag = float(run.result.finish_s.max()) - traffic.duration_s
        print(f"traffic done: {len(run.requests)} requests, the last finished {lag:+.1f} s "
              f"from the traffic's end; serving /metrics {args.linger_s:g} s more",
              flush=True)  # fmt: skip
        time.sleep(args.linger_s)
    except KeyboardInterrupt:
        return 130
    finally:
        server.shutdown()
        server.server_close()
    return 0


def _load_config(parser: argparse.ArgumentParser, path: Path) -> ServingConfig:
    import yaml

    from optimizer.config import ConfigError

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        parser.error(f"--config {path}: cannot read YAML: {exc}")
    try:
        return ServingConfig.from_dict(data)
    except (ConfigError, ValueError, TypeError) as exc:
        parser.error(f"--config {path}: {exc}")


if __name__ == "__main__":
    sys.exit(main())
