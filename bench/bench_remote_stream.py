"""Streaming from S3-compatible object storage against a local directory: tokens/s of the batch reader.

    .venv/bin/python bench/bench_remote_stream.py --data DIR [--latency-ms 0,20,50] [--steps 400] [--order global]

DIR is a prepared data directory (e.g. `roformer data prepare --default-corpus en --out runs/demo-data`). It is
uploaded to moto's S3 server (its own process on 127.0.0.1, tests/support/s3_server.py) behind a TCP proxy
that holds every request for the given latency before passing it on (no change to the machine's network).
For each latency, fresh processes read `--steps` batches of the demo shape (seq 128 x 16, one rank):
  local  the directory itself
  cold   s3:// with an empty cache (every shard downloaded on its first read, the rest fetched ahead)
  warm   s3:// again, the cache now full
and the time of the first batch (start-up: manifest, tokenizer and .idx files, the first shard). Writes
bench/results/remote_stream.json. Run it on a quiet machine: the three readers are timed one after the other.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

READER = r"""
import json, sys, time
sys.path.insert(0, {repo!r})
t0 = time.perf_counter()
from data_pipeline import PretrainBatches, open_corpus
from data_pipeline.remote.client import RemoteOptions
corpus = open_corpus({location!r}, "train", remote_options=RemoteOptions(cache_dir={cache!r}, retries=5, timeout=30))
batches = PretrainBatches(corpus, seed=1, order={order!r}, shard_window=8)
batches.next_batch(128, 16)
first = time.perf_counter() - t0
t1 = time.perf_counter()
for _ in range({steps}):
    batches.next_batch(128, 16)
seconds = time.perf_counter() - t1
print(json.dumps({{"first_batch_s": first, "seconds": seconds, "tokens_per_s": {steps} * 16 * 128 / seconds}}))
"""


class DelayingProxy:
    """127.0.0.1:PORT -> the server; each chunk from the client waits `latency` seconds before it is passed on
    (one wait per request on a kept-alive connection: a request is one chunk or a few)."""

    def __init__(self, target_port: int, latency: float):
        self.target_port, self.latency = target_port, latency
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        self.ready.wait()

    def _run(self):
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    async def _handle(self, reader, writer):
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pipe(src, dst, delay):
            try:
                while data := await src.read(1 << 16):
                    if delay:
                        await asyncio.sleep(delay)
                    dst.write(data)
                    await dst.drain()
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer, self.latency), pipe(up_reader, writer, 0.0),
                             return_exceptions=True)


def read(location: str, cache: Path, env: dict, steps: int, order: str) -> dict:
    code = READER.format(repo=str(REPO), location=location, cache=str(cache), steps=steps, order=order)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="prepared data directory")
    parser.add_argument("--latency-ms", default="0,20,50", help="added latency per request, comma-separated")
    parser.add_argument("--steps", type=int, default=400, help="batches read after the first")
    parser.add_argument("--order", default="global", choices=["global", "shard_window"])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "remote_stream.json")
    args = parser.parse_args()

    from data_pipeline.remote.upload import upload_directory
    from tests.support.s3_server import start_s3_server

    work = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    server = start_s3_server(work)
    try:
        server.client().create_bucket(Bucket="bench")
        env = dict(os.environ, **server.env())
        os.environ.update(server.env())
        upload_directory(args.data, "s3://bench/data")
        port = int(server.endpoint.rsplit(":", 1)[1])
        rows = []
        for latency_ms in (float(x) for x in args.latency_ms.split(",")):
            proxy = DelayingProxy(port, latency_ms / 1000)
            proxied = dict(env, AWS_ENDPOINT_URL=f"http://127.0.0.1:{proxy.port}")
            cache = work / f"cache-{latency_ms:g}"
            local = read(str(args.data), cache, env, args.steps, args.order)
            cold = read("s3://bench/data", cache, proxied, args.steps, args.order)
            warm = read("s3://bench/data", cache, proxied, args.steps, args.order)
            rows.append({"latency_ms": latency_ms, "local": local, "cold": cold, "warm": warm,
                         "warm_over_local": warm["tokens_per_s"] / local["tokens_per_s"]})
            print(json.dumps(rows[-1]), flush=True)
            shutil.rmtree(cache, ignore_errors=True)
        result = {"date": time.strftime("%Y-%m-%d"), "machine": platform.node(), "cpus": os.cpu_count(),
                  "load_average": os.getloadavg(), "data": str(args.data), "order": args.order,
                  "shape": "seq 128 x 16, one rank", "steps": args.steps, "rows": rows,
                  "median_warm_over_local": statistics.median(r["warm_over_local"] for r in rows)}
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
