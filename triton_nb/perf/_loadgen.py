"""The network load generator: a process of its own, so it never competes for the GIL of a server
running in the same kernel.

Runs as a script (``python _loadgen.py ...``, started by :class:`triton_nb.perf.load.NetworkLoad`),
importing only the standard library, numpy-free, with aiohttp or grpc: it starts in a fraction of a
second. It reads pre-encoded requests from a file, keeps ``--concurrency`` requests in flight (closed
loop) or sends ``--rate`` requests per second (open loop, constant or Poisson arrivals), and writes
completions to stdout every 50 ms as frames: ``<I`` count, then count records ``<qqB`` (sent ns,
answered ns, ok) on the host's monotonic clock. It stops when its stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import struct
import sys
import time

RECORD = struct.Struct("<qqB")
COUNT = struct.Struct("<I")
GRPC_METHOD = "/inference.GRPCInferenceService/ModelInfer"


def _read_payloads(path: str) -> list[tuple[bytes, int]]:
    payloads = []
    with open(path, "rb") as stream:
        (count,) = COUNT.unpack(stream.read(4))
        for _ in range(count):
            size, header = struct.unpack("<II", stream.read(8))
            payloads.append((stream.read(size), header))
    return payloads


class _Generator:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.payloads = _read_payloads(args.payloads)
        self.records: list[tuple[int, int, int]] = []
        self.stopping = False
        self.next_payload = 0

    def payload(self) -> tuple[bytes, int]:
        self.next_payload = (self.next_payload + 1) % len(self.payloads)
        return self.payloads[self.next_payload]

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        stdin_closed = loop.run_in_executor(None, sys.stdin.buffer.read)
        if self.args.protocol == "http":
            import aiohttp

            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as session:
                url = f"http://{self.args.url}/v2/models/{self.args.model}/infer"

                async def send() -> bool:
                    body, header = self.payload()
                    headers = {"Content-Type": "application/octet-stream",
                               "Inference-Header-Content-Length": str(header)}
                    async with session.post(url, data=body, headers=headers) as response:
                        await response.read()
                        return response.status == 200

                await self._drive(send, stdin_closed)
        else:
            import grpc

            async with grpc.aio.insecure_channel(self.args.url, options=[
                    ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]) as channel:
                call = channel.unary_unary(GRPC_METHOD)

                async def send() -> bool:
                    try:
                        await call(self.payload()[0], timeout=60)
                    except grpc.RpcError:
                        return False
                    return True

                await self._drive(send, stdin_closed)

    async def _one(self, send) -> None:
        started = time.monotonic_ns()
        try:
            ok = await send()
        except Exception:  # a refused connection is a failed request, not the generator's end
            ok = False
        self.records.append((started, time.monotonic_ns(), 1 if ok else 0))

    async def _drive(self, send, stdin_closed) -> None:
        flusher = asyncio.ensure_future(self._flush_forever())
        workers = []
        if self.args.concurrency:
            async def closed_loop() -> None:
                while not self.stopping:
                    await self._one(send)

            workers = [asyncio.ensure_future(closed_loop()) for _ in range(self.args.concurrency)]
        else:
            workers = [asyncio.ensure_future(self._open_loop(send))]
        await stdin_closed
        self.stopping = True
        await asyncio.gather(*workers, return_exceptions=True)
        flusher.cancel()
        self._flush()

    async def _open_loop(self, send) -> None:
        rate = self.args.rate
        rng = random.Random(self.args.seed)
        in_flight = set()
        due = time.monotonic()
        while not self.stopping:
            due += rng.expovariate(rate) if self.args.distribution == "poisson" else 1.0 / rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.ensure_future(self._one(send))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        await asyncio.gather(*in_flight, return_exceptions=True)

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            self._flush()

    def _flush(self) -> None:
        records, self.records = self.records, []
        out = sys.stdout.buffer
        out.write(COUNT.pack(len(records)) + b"".join(RECORD.pack(*r) for r in records))
        out.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description="triton_nb's network load generator (started by triton_nb.perf)")
    parser.add_argument("--protocol", choices=("http", "grpc"), required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--payloads", required=True)
    parser.add_argument("--concurrency", type=int, default=0)
    parser.add_argument("--rate", type=float, default=0.0)
    parser.add_argument("--distribution", choices=("constant", "poisson"), default="constant")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if (args.concurrency > 0) == (args.rate > 0):
        parser.error("give --concurrency or --rate")
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        asyncio.run(_Generator(args).run())
    else:
        uvloop.run(_Generator(args).run())


if __name__ == "__main__":
    main()
