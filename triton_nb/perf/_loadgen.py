"""The network load generator: a process of its own, so it never competes for the GIL of a server
running in the same kernel.

Runs as a script (``python _loadgen.py ...``, started by :class:`triton_nb.perf.load.NetworkLoad`),
importing only the standard library (and grpc for gRPC): it starts in a fraction of a second. It
reads pre-encoded requests from a file, keeps ``--concurrency`` requests in flight (closed loop) or
sends ``--rate`` requests per second (open loop, constant or Poisson arrivals), and writes
completions to stdout every 50 ms as frames: ``<I`` count, then count records ``<qqBII`` (sent ns,
answered ns, ok, request bytes, response bytes) on the host's monotonic clock; once, before the
records of the first failed request, an error frame: the count :data:`ERROR_FRAME`, then ``<I``
length and the server's message in UTF-8 (what perf_analyzer prints of a failed request). It stops
when its stdin closes. HTTP requests go over keep-alive connections with a minimal HTTP/1.1 exchange (see
``_HttpConnection``).

Bytes on the wire: over HTTP, the whole request and response as sent and read — request line or
status line, headers and body (compressed when it is). Over gRPC, the messages: the serialized
request and response with gRPC's 5-byte length prefix (HTTP/2 frames and headers not counted); with
``--grpc-compression`` gRPC compresses each request itself, and the request's size is that of the
same algorithm's output, computed once per distinct payload (gRPC sends a message uncompressed when
compressing does not make it smaller, and so is it counted).

Compression (``--request-compression``, ``--response-compression``; HTTP): each distinct request
body is compressed once, before the load, and sent with ``Content-Encoding``; a compressed
response (``Accept-Encoding``) is decompressed, as tritonclient does, so the client's cost of it is
in the latency. With sequences the body changes per request, and each one is compressed as it is sent.

For a sequence (stateful) model, ``--sequence-length`` makes it run perf_analyzer's sequences
(:class:`SequencePlan`, which the in-process load uses too): each closed-loop worker, or each of
``--num-of-sequences`` sequences at a request rate, sends one sequence after another, each request
after the previous one of its sequence was answered. The sequence id and flags are patched into the
pre-encoded requests (a JSON header's parameters, a protobuf map entry appended), so no request is
encoded from scratch. On stop, each sequence left open gets one last request with the END flag (not
recorded), so the server frees its slot before the next measurement.

With system shared memory (``measure(..., shared_memory="system")``) the pre-encoded requests refer
to registered regions instead of carrying tensors (an HTTP body is then its JSON header alone); the
generator sends them as any others, sequence patching included, and never reads the outputs the
server writes into the regions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import struct
import sys
import threading
import time
import zlib

RECORD = struct.Struct("<qqBII")
COUNT = struct.Struct("<I")
ERROR_FRAME = 0xFFFFFFFF  # a count that says: a message follows, not records
GRPC_METHOD = "/inference.GRPCInferenceService/ModelInfer"
#: zlib's window bits per content coding: gzip's header and trailer, or deflate's zlib wrapper.
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_GRPC_PREFIX_BYTES = 5  # a gRPC message's compressed flag and 4-byte length


def compress(body: bytes, algorithm: str) -> bytes:
    """``body`` as ``Content-Encoding: gzip`` or ``deflate`` (zlib's default level, as tritonclient's
    ``gzip.compress``/``zlib.compress`` and gRPC's message compression use)."""
    packer = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, _WBITS[algorithm])
    return packer.compress(body) + packer.flush()


def grpc_message_bytes(message: bytes, algorithm: str = "none") -> int:
    """The bytes of one gRPC message on the wire: the length prefix and the message, compressed with
    ``algorithm`` when that makes it smaller (gRPC sends it uncompressed otherwise)."""
    if algorithm == "none":
        return len(message) + _GRPC_PREFIX_BYTES
    return min(len(message), len(compress(message, algorithm))) + _GRPC_PREFIX_BYTES

#: Unbounded sequence ids (perf_analyzer's default --sequence-id-range end) stay within int64: gRPC
#: carries them as int64_param.
MAX_SEQUENCE_ID = (1 << 63) - 1


class SequencePlan:
    """perf_analyzer's sequences (its ``SequenceManager``) over ``streams`` independent streams — the
    closed-loop slots, or the sequences a request rate keeps active. Each stream runs one sequence
    after another; :meth:`next` gives the (id, start, end) of a stream's next request.

    A sequence's length is ``length`` plus a uniform offset of up to ``variation_pct`` percent,
    truncated toward zero, at least 1 — perf_analyzer's draw, from a generator per stream seeded by
    ``seed``, so each stream's lengths do not depend on how the streams interleave. A new sequence
    takes the next id of ``id_start`` up to ``id_end`` (excluded; None: unbounded), wrapping; an id
    another stream's sequence still holds is skipped in favour of the id this stream just released,
    as perf_analyzer does, so two active sequences never share an id (which needs at least
    ``streams`` ids in the range: the caller checks it). Thread-safe: in-process completions of
    different slots come from different threads."""

    def __init__(self, streams: int, length: int, variation_pct: float = 20.0, id_start: int = 1,
                 id_end: int | None = None, seed: int = 0, string_ids: bool = False) -> None:
        if streams < 1 or length < 1 or id_start < 1:
            raise ValueError("a sequence plan needs streams >= 1, length >= 1 and id_start >= 1")
        id_stop = MAX_SEQUENCE_ID + 1 if id_end is None else id_end
        if id_stop - id_start < streams:
            raise ValueError(f"sequence ids {id_start}..{id_stop - 1} are fewer than the {streams} active sequences")
        self.length = length
        self.variation = variation_pct / 100.0
        self.id_start = id_start
        self.id_count = id_stop - id_start
        self.string_ids = string_ids  # a model whose CORRID is TYPE_STRING takes the ids as text
        self._issued = 0  # sequences started so far: the next id is id_start + issued % id_count
        self._ids = [0] * streams  # each stream's current (or last) sequence id; 0: none yet
        self._left = [0] * streams  # requests its current sequence still has to send
        self._rngs = [random.Random(f"{seed}:{stream}") for stream in range(streams)]
        self._lock = threading.Lock()

    def draw_length(self, stream: int) -> int:
        offset = int((2.0 * self._rngs[stream].random() - 1.0) * self.variation * self.length)
        return max(1, self.length + offset)

    def _new_id(self, stream: int) -> int:
        held = {number for other, number in enumerate(self._ids) if other != stream}
        candidate = self.id_start + self._issued % self.id_count
        self._issued += 1
        if candidate not in held:
            return candidate
        if self._ids[stream]:
            return self._ids[stream]  # perf_analyzer's way: reuse the id this stream's ended sequence released
        while candidate in held:  # a stream's first sequence after the ids wrapped: the next free one
            candidate = self.id_start + self._issued % self.id_count
            self._issued += 1
        return candidate

    def sequence_id(self, number: int) -> int | str:
        return str(number) if self.string_ids else number

    def next(self, stream: int) -> tuple[int | str, bool, bool]:
        """The id, start and end flags of ``stream``'s next request (a new sequence when the last ended)."""
        with self._lock:
            start = self._left[stream] == 0
            if start:
                self._ids[stream] = self._new_id(stream)
                self._left[stream] = self.draw_length(stream)
            self._left[stream] -= 1
            return self.sequence_id(self._ids[stream]), start, self._left[stream] == 0

    def close(self, stream: int) -> int | str | None:
        """The id of ``stream``'s unfinished sequence, now marked ended (None when it has none open):
        the caller sends it one request with the END flag."""
        with self._lock:
            if self._left[stream] == 0:
                return None
            self._left[stream] = 0
            return self.sequence_id(self._ids[stream])

    @property
    def streams(self) -> int:
        return len(self._ids)


def http_sequence_parameters(sequence_id: int | str, start: bool, end: bool) -> bytes:
    """The sequence parameters as members of a KServe v2 JSON header's ``parameters`` object, each
    preceded by a comma (they follow the members already there)."""
    return (f',"sequence_id":{json.dumps(sequence_id)},"sequence_start":{"true" if start else "false"}'
            f',"sequence_end":{"true" if end else "false"}').encode()


def http_request(url: str, model: str, body: bytes, header: int, request_compression: str = "none",
                 response_compression: str = "none", sagemaker: bool = False) -> bytes:
    """One whole HTTP infer request as it goes on the wire: the request line, the headers and the
    body (compressed with ``request_compression``; ``header`` is its JSON header's length before
    that). A body that is all JSON (JSON tensors, or shared memory) goes without
    Inference-Header-Content-Length, as tritonclient sends it. ``sagemaker``: to SageMaker's
    ``/invocations`` instead, the JSON header's size in a binary+json Content-Type."""
    if sagemaker:
        content_type = (b"application/json" if header == len(body)
                        else b"application/vnd.sagemaker-triton.binary+json;json-header-size=%d" % header)
        head = [b"POST /invocations HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\n" % (url.encode(), content_type)]
    else:
        head = [b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: %s\r\nContent-Type: application/octet-stream\r\n"
                % (model.encode(), url.encode())]
    if header != len(body) and not sagemaker:
        head.append(b"Inference-Header-Content-Length: %d\r\n" % header)
    if request_compression != "none":
        body = compress(body, request_compression)
        head.append(b"Content-Encoding: %s\r\n" % request_compression.encode())
    if response_compression != "none":
        head.append(b"Accept-Encoding: %s\r\n" % response_compression.encode())
    head.append(b"Content-Length: %d\r\n\r\n" % len(body))
    return b"".join(head) + body


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _length_delimited(field_number: int, payload: bytes) -> bytes:
    return _varint(field_number << 3 | 2) + _varint(len(payload)) + payload


def grpc_parameter(key: str, value: bool | int | str) -> bytes:
    """One entry of ``ModelInferRequest.parameters`` (field 4, a map of ``InferParameter``) as
    protobuf bytes: appended to a serialized request it adds that parameter, since protobuf merges
    the fields it reads in any order. ``InferParameter``: bool_param 1, int64_param 2, string_param 3."""
    if isinstance(value, bool):
        parameter = _varint(1 << 3) + _varint(int(value))
    elif isinstance(value, int):
        parameter = _varint(2 << 3) + _varint(value & ((1 << 64) - 1))  # int64: two's complement
    else:
        parameter = _length_delimited(3, value.encode())
    return _length_delimited(4, _length_delimited(1, key.encode()) + _length_delimited(2, parameter))


# The four flag entries are the same in every request: encoded once.
_GRPC_FLAGS = {(start, end): grpc_parameter("sequence_start", start) + grpc_parameter("sequence_end", end)
               for start in (False, True) for end in (False, True)}


def grpc_sequence_parameters(sequence_id: int | str, start: bool, end: bool) -> bytes:
    """The sequence parameters as protobuf map entries to append to a serialized ``ModelInferRequest``."""
    return grpc_parameter("sequence_id", sequence_id) + _GRPC_FLAGS[start, end]


def _read_payloads(path: str) -> list[tuple[bytes, int]]:
    payloads = []
    with open(path, "rb") as stream:
        (count,) = COUNT.unpack(stream.read(4))
        for _ in range(count):
            size, header = struct.unpack("<II", stream.read(8))
            payloads.append((stream.read(size), header))
    return payloads


def _http_error(status: int, body: bytes) -> str:
    """A failed HTTP answer's message: the ``error`` of Triton's JSON body, else the body's text."""
    try:
        message = json.loads(body).get("error")
    except (ValueError, AttributeError):
        message = None
    return message if isinstance(message, str) else f"HTTP {status}: {body[:500].decode('utf-8', 'replace')}"


class _HttpConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection that sends pre-encoded requests and reads the status and
    the body (by Content-Length) of each answer: a fraction of a general client's cost per request,
    so the generator measures the server rather than itself."""

    def __init__(self, decompress: bool = False) -> None:
        self.buffer = bytearray()
        self.waiter: asyncio.Future | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.decompress = decompress  # answers may come compressed (the request sent Accept-Encoding)

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
        coding = None
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif self.decompress and name == b"content-encoding":
                coding = value.strip().lower().decode()
        total = end + 4 + length
        if len(self.buffer) < total:
            return
        status = int(head[9:12])
        error = None
        if coding in _WBITS or status != 200:  # (a success's body is otherwise not looked at)
            body = bytes(self.buffer[end + 4:total])
            if coding in _WBITS:  # the client's work, as tritonclient decompresses an answer
                body = zlib.decompress(body, _WBITS[coding])
            if status != 200:
                error = _http_error(status, body)
        del self.buffer[:total]
        self.waiter.set_result((status, total, error))

    async def request(self, data: bytes) -> tuple[int, int, str | None]:
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self.waiter


class _HttpPool:
    """Idle connections reused; a new one when all are busy (an open loop may need many)."""

    def __init__(self, url: str, decompress: bool = False) -> None:
        host, _, port = url.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.idle: list[_HttpConnection] = []
        self.all: list[_HttpConnection] = []
        self.decompress = decompress

    async def send(self, data: bytes) -> tuple[int, int, str | None]:
        """The answer's status, its bytes on the wire (status line, headers and body) and, for a
        failure, the server's message."""
        connection = self.idle.pop() if self.idle else None
        if connection is None or connection.closed:
            _, connection = await asyncio.get_running_loop().create_connection(
                lambda: _HttpConnection(self.decompress), self.host, self.port)
            self.all.append(connection)
        answer = await connection.request(data)
        self.idle.append(connection)
        return answer

    def close(self) -> None:
        for connection in self.all:
            if connection.transport is not None:
                connection.transport.close()


class _Generator:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.payloads = _read_payloads(args.payloads)
        self.records: list[tuple[int, int, int]] = []
        self.first_error: str | None = None  # the first failed request's message, until it is written
        self._error_written = False
        self.stopping = False
        self.next_payload = 0
        self.plan: SequencePlan | None = None
        self._close_request = None  # with sequences: a sequence id -> the request that ends it
        if args.sequence_length:
            streams = args.concurrency or args.num_of_sequences
            self.plan = SequencePlan(streams, args.sequence_length, args.sequence_length_variation,
                                     args.sequence_id_start, args.sequence_id_end or None, args.seed,
                                     args.string_sequence_ids)

    def payload(self) -> tuple[bytes, int]:
        return self.payloads[self._next_index()]

    def _http_request(self, body: bytes, header: int) -> bytes:
        args = self.args
        return http_request(args.url, args.model, body, header, args.request_compression, args.response_compression,
                            sagemaker=args.protocol == "sagemaker")

    def _http_requests(self):
        """The function that gives a stream's next HTTP request and its size: pre-encoded whole, or
        for sequences a template whose JSON header gets the sequence parameters patched in."""
        if self.plan is None:
            whole = [self._http_request(body, header) for body, header in self.payloads]
            self.payloads = [(request, len(request)) for request in whole]
            return lambda stream: self.payload()
        # encode_http writes the header's "parameters" object last: its closing "}}" ends the JSON,
        # and the sequence parameters go just before it.
        templates = []
        for body, header in self.payloads:
            if body[header - 2:header] != b"}}":
                raise ValueError("an HTTP payload's JSON header does not end with its parameters object")
            templates.append((body[:header - 2], body[header - 2:], header))
        plan = self.plan

        def patched(index: int, extra: bytes) -> bytes:
            json_head, rest, header = templates[index]
            # a body that was all JSON stays so (its header length follows the body's)
            return self._http_request(json_head + extra + rest, header + len(extra))

        def sized(request: bytes) -> tuple[bytes, int]:
            return request, len(request)

        self._close_request = lambda sequence_id: patched(0, http_sequence_parameters(sequence_id, False, True))
        return lambda stream: sized(patched(self._next_index(), http_sequence_parameters(*plan.next(stream))))

    def _grpc_requests(self):
        """The function that gives a stream's next serialized gRPC request and its size: for
        sequences, the pre-encoded request with the sequence parameters' map entries appended."""
        algorithm = self.args.grpc_compression
        if self.plan is None:
            self.payloads = [(body, grpc_message_bytes(body, algorithm)) for body, _ in self.payloads]
            return lambda stream: self.payload()
        plan = self.plan

        def request(stream: int) -> tuple[bytes, int]:
            message = self.payloads[self._next_index()][0] + grpc_sequence_parameters(*plan.next(stream))
            return message, grpc_message_bytes(message, algorithm)

        self._close_request = lambda sequence_id: self.payloads[0][0] + grpc_sequence_parameters(
            sequence_id, False, True)
        return request

    def _next_index(self) -> int:
        self.next_payload = (self.next_payload + 1) % len(self.payloads)
        return self.next_payload

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        stdin_closed = loop.run_in_executor(None, sys.stdin.buffer.read)
        if self.args.protocol in ("http", "sagemaker"):
            pool = _HttpPool(self.args.url, decompress=self.args.response_compression != "none")
            build = self._http_requests()

            async def send(data: bytes) -> tuple[bool, int, str | None]:
                status, received, error = await pool.send(data)
                return status == 200, received, error

            try:
                await self._drive(send, build, stdin_closed)
            finally:
                pool.close()
        else:
            import grpc

            compression = {"none": grpc.Compression.NoCompression, "gzip": grpc.Compression.Gzip,
                           "deflate": grpc.Compression.Deflate}[self.args.grpc_compression]
            async with grpc.aio.insecure_channel(self.args.url, options=[
                    ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
                    compression=compression) as channel:
                call = channel.unary_unary(GRPC_METHOD)
                build = self._grpc_requests()

                async def send(data: bytes) -> tuple[bool, int, str | None]:
                    try:
                        answer = await call(data, timeout=60)
                    except grpc.RpcError as exc:
                        return False, 0, f"{exc.code().name}: {exc.details()}"
                    return True, len(answer) + _GRPC_PREFIX_BYTES, None

                await self._drive(send, build, stdin_closed)

    async def _one(self, send, build, stream: int) -> None:
        started = time.monotonic_ns()
        try:
            data, sent = build(stream)
            ok, received, error = await send(data)
        except Exception as exc:  # a refused connection is a failed request, not the generator's end
            ok, sent, received, error = False, 0, 0, f"{type(exc).__name__}: {exc}"
        if not ok and self.first_error is None:
            self.first_error = error or "failed"
        self.records.append((started, time.monotonic_ns(), 1 if ok else 0, sent, received))

    async def _drive(self, send, build, stdin_closed) -> None:
        flusher = asyncio.ensure_future(self._flush_forever())
        workers = []
        if self.args.concurrency:
            async def closed_loop(stream: int) -> None:
                while not self.stopping:
                    await self._one(send, build, stream)

            workers = [asyncio.ensure_future(closed_loop(stream)) for stream in range(self.args.concurrency)]
        else:
            workers = [asyncio.ensure_future(self._open_loop(send, build))]
        await stdin_closed
        self.stopping = True
        await asyncio.gather(*workers, return_exceptions=True)
        await self._close_sequences(send)
        flusher.cancel()
        self._flush()

    async def _close_sequences(self, send) -> None:
        """End every sequence the stop cut short (answers not recorded: they are outside the measurement)."""
        if self.plan is None:
            return
        ids = [self.plan.close(stream) for stream in range(self.plan.streams)]
        closing = [send(self._close_request(sequence_id)) for sequence_id in ids if sequence_id is not None]
        await asyncio.gather(*closing, return_exceptions=True)

    async def _open_loop(self, send, build) -> None:
        rate = self.args.rate
        rng = random.Random(self.args.seed)
        in_flight = set()
        # With sequences, arrivals go round-robin to the active sequences; a sequence sends a request
        # only after its previous one was answered (its lock), so a request may leave late.
        turns = [asyncio.Lock() for _ in range(self.plan.streams)] if self.plan is not None else None

        async def in_turn(stream: int) -> None:
            async with turns[stream]:
                if not self.stopping:
                    await self._one(send, build, stream)

        due = time.monotonic()
        arrival = 0
        while not self.stopping:
            due += rng.expovariate(rate) if self.args.distribution == "poisson" else 1.0 / rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if turns is None:
                task = asyncio.ensure_future(self._one(send, build, 0))
            else:
                task = asyncio.ensure_future(in_turn(arrival % len(turns)))
            arrival += 1
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
        if self.first_error is not None and not self._error_written:
            message = self.first_error.encode("utf-8", "replace")
            out.write(COUNT.pack(ERROR_FRAME) + COUNT.pack(len(message)) + message)
            self._error_written = True
        out.write(COUNT.pack(len(records)) + b"".join(RECORD.pack(*r) for r in records))
        out.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description="triton_nb's network load generator (started by triton_nb.perf)")
    parser.add_argument("--protocol", choices=("http", "grpc", "sagemaker"), required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--payloads", required=True)
    parser.add_argument("--concurrency", type=int, default=0)
    parser.add_argument("--rate", type=float, default=0.0)
    parser.add_argument("--distribution", choices=("constant", "poisson"), default="constant")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sequence-length", type=int, default=0, help="run sequences of about this many requests")
    parser.add_argument("--sequence-length-variation", type=float, default=20.0)
    parser.add_argument("--sequence-id-start", type=int, default=1)
    parser.add_argument("--sequence-id-end", type=int, default=0, help="excluded; 0: unbounded")
    parser.add_argument("--num-of-sequences", type=int, default=4, help="active sequences at a request rate")
    parser.add_argument("--string-sequence-ids", action="store_true", help="send the ids as strings")
    parser.add_argument("--request-compression", choices=("none", *_WBITS), default="none", help="HTTP bodies")
    parser.add_argument("--response-compression", choices=("none", *_WBITS), default="none",
                        help="HTTP: ask for compressed answers (Accept-Encoding) and decompress them")
    parser.add_argument("--grpc-compression", choices=("none", *_WBITS), default="none")
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
