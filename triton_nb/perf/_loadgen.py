"""The network load generator: a process of its own, so it never competes for the GIL of a server
running in the same kernel.

Runs as a script (``python _loadgen.py ...``, started by :class:`triton_nb.perf.load.NetworkLoad`),
importing only the standard library (and grpc for gRPC): it starts in a fraction of a second. It
reads pre-encoded requests from a file, keeps ``--concurrency`` requests in flight (closed loop) or
sends ``--rate`` requests per second (open loop, constant or Poisson arrivals), and writes
completions to stdout every 50 ms as frames: ``<I`` count, then count records ``<qqB`` (sent ns,
answered ns, ok) on the host's monotonic clock. It stops when its stdin closes. HTTP requests go
over keep-alive connections with a minimal HTTP/1.1 exchange (see ``_HttpConnection``).
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


class _HttpConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection that sends pre-encoded requests and reads the status and
    the body (by Content-Length) of each answer: a fraction of a general client's cost per request,
    so the generator measures the server rather than itself."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.waiter: asyncio.Future | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("the server closed the connection"))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.waiter is None or self.waiter.done():
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        total = end + 4 + length
        if len(self.buffer) < total:
            return
        del self.buffer[:total]
        self.waiter.set_result(int(head[9:12]))

    async def request(self, data: bytes) -> int:
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self.waiter


class _HttpPool:
    """Idle connections reused; a new one when all are busy (an open loop may need many)."""

    def __init__(self, url: str) -> None:
        host, _, port = url.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.idle: list[_HttpConnection] = []
        self.all: list[_HttpConnection] = []

    async def send(self, data: bytes) -> int:
        connection = self.idle.pop() if self.idle else None
        if connection is None or connection.closed:
            _, connection = await asyncio.get_running_loop().create_connection(_HttpConnection, self.host, self.port)
            self.all.append(connection)
        status = await connection.request(data)
        self.idle.append(connection)
        return status

    def close(self) -> None:
        for connection in self.all:
            if connection.transport is not None:
                connection.transport.close()


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
            pool = _HttpPool(self.args.url)
            host = self.args.url.encode()
            path = f"/v2/models/{self.args.model}/infer".encode()
            requests = [b"POST " + path + b" HTTP/1.1\r\nHost: " + host + b"\r\nContent-Type: application/octet-stream"
                        b"\r\nInference-Header-Content-Length: " + str(header).encode() + b"\r\nContent-Length: "
                        + str(len(body)).encode() + b"\r\n\r\n" + body for body, header in self.payloads]
            self.payloads = [(request, 0) for request in requests]

            async def send() -> bool:
                return await pool.send(self.payload()[0]) == 200

            try:
                await self._drive(send, stdin_closed)
            finally:
                pool.close()
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
