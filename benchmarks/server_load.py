"""Server under load: `care-retriever serve` throughput and latency at 1/8/32/64
concurrent clients, micro-batching on vs off, side by side in one run.

The server is the real CLI in a subprocess (uvicorn on loopback) with the ``base`` preset's random-weight
query tower (a ~278M BERT, gte-multilingual-base shape) and a FAISS store of the 300 sample documents
whose vectors are random unit vectors: the document tower is never run, since only the query side is
measured (a 300-row flat search costs microseconds next to the forward pass). Queries are the dev
kuake-qtr-retrieval questions (``$CARE_SHARED_DATA/tasks/kuake-qtr-retrieval/queries.jsonl``; the
shipped sample's queries when absent). Clients are closed-loop (each sends its next request when the
last one is answered), all in one asyncio process (httpx), whose CPU share is reported: on a 2-core
machine the load generator competes with the server for the same cores.

Configurations (see ``CONFIGS``): batching on (``--max-batch-size 32``) and off (``--max-batch-size 1``),
both two forwards at once with one thread each (``--threads 1``, for every backend), and the server as it
was before batching (4 forwards at once, 2 threads each). Targets: at 32
clients, throughput batching on >= 2.5x off; p99 <= 3x the single-client p50. The table goes into
``docs/benchmarks.md`` (its own section) unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.core_common import CLI, REPO, SAMPLE, machine_line, model_dir, table
from benchmarks.marked_sections import write_marked

SHARED = Path(os.environ.get("CARE_SHARED_DATA", REPO.parent / "shared" / "data"))
KUAKE_QUERIES = SHARED / "tasks" / "kuake-qtr-retrieval" / "queries.jsonl"
DOC = REPO / "docs" / "benchmarks.md"
SECTION = "server_load"
# (options, environment): one thread per forward (`serve --threads`: torch, ONNX Runtime or OpenVINO) and
# two forwards at once use both cores without pool threads spinning against each other (on a shared,
# loaded machine two threads per forward made one query ~10x slower here); the last row is the server
# as it was before batching.
ON, OFF, OLD = "batching on (batch <= 32)", "batching off", "before batching (4 at once, 2 threads each)"
CONFIGS: dict[str, tuple[list[str], dict[str, str]]] = {
    ON: (["--max-batch-size", "32", "--max-wait-ms", "5", "--max-concurrency", "2", "--threads", "1"], {}),
    OFF: (["--max-batch-size", "1", "--max-concurrency", "2", "--threads", "1"], {}),
    OLD: (["--max-batch-size", "1", "--max-concurrency", "4", "--threads", "2"], {}),
}


def load_queries(limit: int = 2000) -> tuple[list[str], str]:
    path = KUAKE_QUERIES if KUAKE_QUERIES.is_file() else SAMPLE / "queries.jsonl"
    texts = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                text = json.loads(line)["text"].strip().strip('"').strip()
                if text:
                    texts.append(text)
            if len(texts) == limit:
                break
    return texts, str(path.relative_to(SHARED.parent) if path.is_relative_to(SHARED.parent) else path)


def build_store(model: Path, folder: Path) -> str:
    """A FAISS store for ``model`` over the sample documents, with random unit vectors (no document tower)."""
    import numpy as np

    from care_retriever import AsymmetricEmbedder, DocumentStoreWriter, read_corpus

    embedder = AsymmetricEmbedder.from_pretrained(model, load="query")
    rng = np.random.default_rng(0)

    def random_vectors(texts: list[str]) -> np.ndarray:
        vectors = rng.standard_normal((len(texts), embedder.dim)).astype(np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    spec = f"faiss:{folder / 'store'}"
    DocumentStoreWriter(embedder, spec, show_progress=False, encoder=random_vectors).write(
        read_corpus(SAMPLE / "corpus.jsonl")
    )
    return spec


class Server:
    def __init__(
        self, model: Path, store: str, options: list[str], env_extra: dict[str, str], backend: str = "torch"
    ) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **env_extra}
        env.pop("CARE_API_TOKEN", None)
        cmd = [
            *CLI,
            "serve",
            "--model",
            str(model),
            "--store",
            store,
            "--port",
            "0",
            "--max-queue",
            "1024",
            "--max-connections",
            "512",
            "--backend",
            backend,
            *options,
        ]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []

        def drain() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log.append(line)
                lines.put(line)

        threading.Thread(target=drain, daemon=True).start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", lines.get(timeout=1))
            except queue.Empty:
                continue
            if found:
                self.url = f"http://127.0.0.1:{found.group(1)}"
                return
        self.proc.kill()
        raise RuntimeError(f"server did not start: {''.join(self.log)[-2000:]}")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def scrape(url: str) -> dict[str, float]:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        for sample in family.samples:
            if not sample.labels or sample.name.startswith("care_requests_total"):
                key = sample.name + "".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[key] = sample.value
    return out


async def drive(url: str, queries: list[str], clients: int, warmup: float, duration: float) -> dict[str, float]:
    """``clients`` closed-loop clients for ``warmup + duration`` s; stats over requests answered after warmup."""
    import httpx

    latencies: list[float] = []
    failures = 0
    start = time.perf_counter()
    measure_from, stop_at = start + warmup, start + warmup + duration
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client(worker: int, http: httpx.AsyncClient) -> None:
        nonlocal failures
        i = worker * 7919
        while time.perf_counter() < stop_at:
            query = queries[i % len(queries)]
            i += 1
            sent = time.perf_counter()
            response = await http.post("/search", json={"query": query, "top_k": 10})
            done = time.perf_counter()
            if measure_from <= done <= stop_at:  # answered in the window (a slow one may predate it)
                latencies.append(done - sent)
                if response.status_code != 200:
                    failures += 1

    cpu0 = time.process_time()
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        await asyncio.gather(*(client(w, http) for w in range(clients)))
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - start
    latencies.sort()

    def pct(p: float) -> float:
        if not latencies:
            return float("nan")
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    return {
        "requests": len(latencies),
        "qps": len(latencies) / duration,
        "p50": pct(0.50),
        "p99": pct(0.99),
        "failures": failures,
        "loadgen_cpu": cpu / wall,
    }


def measure(server: Server, queries: list[str], clients: int, warmup: float, duration: float) -> dict[str, float]:
    before, cpu_before = scrape(server.url), server.cpu_seconds()
    stats = asyncio.run(drive(server.url, queries, clients, warmup, duration))
    after = scrape(server.url)
    stats["server_cpu"] = (server.cpu_seconds() - cpu_before) / (warmup + duration)

    def delta(name: str) -> float:
        return after[name] - before[name]

    batches = max(delta("care_batch_queries_count"), 1)
    stats["batch"] = delta("care_batch_queries_sum") / batches
    stats["forward_ms"] = 1000 * delta("care_batch_duration_seconds_sum") / batches
    stats["wait_ms"] = 1000 * delta("care_queue_wait_seconds_sum") / max(delta("care_queue_wait_seconds_count"), 1)
    stats["5xx"] = sum(v - before.get(k, 0) for k, v in after.items() if re.search(r"status=5\d\d", k))
    return stats


def run(levels: list[int], warmup: float, duration: float, backend: str = "torch") -> tuple[str, dict]:
    queries, source = load_queries()
    model = model_dir("base")
    if backend != "torch" and not (model / "query_0_Transformer" / backend).is_dir():
        print(f"exporting the query tower ({backend}, int8) ...", file=sys.stderr, flush=True)
        subprocess.run([*CLI, "export", "--model", str(model), "--backend", backend, "--quantize", "int8"], check=True)
    results: dict[str, dict[int, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="care-server-load-") as tmp:
        store = build_store(model, Path(tmp))
        # All servers up at once, measured in turns at each level: load from other processes on a shared
        # machine then falls on every configuration alike, not on whichever ran during a busy minute.
        servers = {label: Server(model, store, *config, backend=backend) for label, config in CONFIGS.items()}
        try:
            for server in servers.values():
                asyncio.run(drive(server.url, queries, 4, 0, 3))  # page the weights in, warm the allocator
            results = {label: {} for label in servers}
            for clients in levels:
                for label, server in servers.items():
                    results[label][clients] = measure(server, queries, clients, warmup, duration)
                    stats = results[label][clients]
                    print(
                        f"{label:40s} {clients:3d} clients: {stats['qps']:6.1f} q/s p50 {stats['p50']:7.1f} "
                        f"p99 {stats['p99']:7.1f} ms, batch {stats['batch']:.1f}",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            for server in servers.values():
                server.stop()
    return report(results, levels, source, len(queries), warmup, duration, backend), results


def report(
    results: dict, levels: list[int], source: str, n_queries: int, warmup: float, duration: float, backend: str
) -> str:
    rows = []
    for label, by_level in results.items():
        for clients in levels:
            s = by_level[clients]
            rows.append(
                [
                    label,
                    clients,
                    f"{s['qps']:.1f}",
                    f"{s['p50']:.0f}",
                    f"{s['p99']:.0f}",
                    f"{s['batch']:.1f}",
                    f"{s['forward_ms']:.0f}",
                    f"{s['wait_ms']:.0f}",
                    f"{s['server_cpu']:.2f}",
                    f"{s['loadgen_cpu']:.2f}",
                    int(s["failures"] + s["5xx"]),
                ]
            )
    on, off = results[ON], results[OFF]
    base_p50 = on[1]["p50"]
    lines = [
        f"### (i{'' if backend == 'torch' else ', ' + backend}) Server under load "
        f"(`python -m benchmarks.server_load --backend {backend}`, base preset query tower)",
        "",
        f"`care-retriever serve` in a subprocess on loopback, FAISS flat store of 300 documents, top_k 10, "
        f"{n_queries} queries from `{source}` (one per request), closed-loop clients in one asyncio+httpx "
        f"process, {warmup:g} s warm-up then {duration:g} s measured per row. `forward ms`: one batch through "
        "the query tower and the store, `wait ms`: a request's time in the queue before its batch starts "
        "(both from the server's /metrics); `server CPU` / `loadgen CPU`: cores used by each process.",
        "",
        table(
            [
                "server",
                "clients",
                "q/s",
                "p50 ms",
                "p99 ms",
                "mean batch",
                "forward ms",
                "wait ms",
                "server CPU",
                "loadgen CPU",
                "errors",
            ],
            rows,
        ),
        "",
    ]
    if 32 in on and 32 in off:
        ratio = on[32]["qps"] / off[32]["qps"]
        lines.append(
            f"- Throughput at 32 clients, batching on / off: **{ratio:.2f}x** (target >= 2.5x: "
            f"**{'met' if ratio >= 2.5 else 'missed'}**); against the server before batching: "
            f"{on[32]['qps'] / results[OLD][32]['qps']:.2f}x."
        )
    for clients in levels:
        p99 = on[clients]["p99"]
        # Closed-loop clients: mean latency = clients / throughput (Little's law), so p99 <= 3x the
        # single-client p50 needs at least this throughput, whatever the batching does.
        needed = clients / (3 * base_p50 / 1000)
        lines.append(
            f"- Batching on, {clients} clients: p99 {p99:.0f} ms = **{p99 / base_p50:.1f}x** the "
            f"single-client p50 ({base_p50:.0f} ms); target <= 3x: "
            f"**{'met' if p99 <= 3 * base_p50 else 'missed'}**. Little's law: it needs >= {needed:.0f} q/s "
            f"at {clients} clients; measured {on[clients]['qps']:.1f} q/s, batches of "
            f"{on[clients]['batch']:.1f} queries taking {on[clients]['forward_ms']:.0f} ms "
            f"({on[clients]['forward_ms'] / max(on[clients]['batch'], 1):.0f} ms per query), "
            f"{on[clients]['wait_ms']:.0f} ms queued."
        )
    lines.append("")
    lines.append(f"Machine: {machine_line()}.")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    parser.add_argument(
        "--backend", default="torch", help="torch | onnx | openvino: the query tower's runtime (`serve --backend`)"
    )
    args = parser.parse_args()
    text, results = run(sorted(set(args.clients) | {1}), args.warmup, args.duration, args.backend)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if not args.no_write:
        # one section per query backend, replaced on a re-run: torch keeps the original markers, another
        # backend's section is added right after torch's
        section = SECTION if args.backend == "torch" else f"{SECTION}:{args.backend}"
        write_marked(DOC, section, text, add=True, after=SECTION, title="# Benchmarks\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
