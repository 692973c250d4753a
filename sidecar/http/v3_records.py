"""Confluent REST Proxy v3's produce API and the cluster routes its clients look up.

=====================================================  =========================================
route                                                  answer
=====================================================  =========================================
``GET /v3/clusters``                                   ``{"kind": "KafkaClusterList", "data"}``
``GET /v3/clusters/{cluster_id}``                      ``{"kind": "KafkaCluster", "cluster_id"}``
``POST /v3/clusters/{cluster_id}/topics/{topic_name}   one result per record (``v3_codec``)
/records``
=====================================================  =========================================

The cluster id is the one Kafka's metadata reports; any other is 404 in v3's error
shape. Records go through the same service call as a v2 produce (``ProduceService.produce``),
in runs (``_Producer``): the same routing, holds, fencing (``Ordered-Expected-Generation``
and ``Ordered-Expected-Count`` request headers, applied to every record), sidecar
headers and acknowledgement (a managed record is answered once its transaction
commits), and unmanaged topics pass through with Kafka's default partitioner.

Two modes, as REST Proxy v3 has them:

* **One record** (a body with ``Content-Length`` holding one JSON object): the HTTP
  status is the record's (200 with its result, or the error's status with the error).
  A body that is not well-formed is answered 4xx and nothing is written.
* **Streaming** (``Transfer-Encoding: chunked``, or a body with several objects): HTTP
  200 at once, then one line of JSON per record in request order, each with its own
  ``error_code``; a record that fails does not end the stream. Records are handed to the
  service as they arrive (whatever arrived while the previous run was in flight goes as
  the next run; nothing waits to fill a batch), at most ``produce.stream_max_in_flight``
  read and unanswered at once: the request is read further as the oldest are answered.
  Bytes that cannot start a JSON object end the stream with a last 400 entry (nothing
  after them can be framed); so does a record over ``http.max_body_bytes`` (413), and a
  stream that sends nothing for ``produce.stream_idle_timeout_s`` ends with a 408 entry.
  When the server shuts down, streams stop reading, answer what they read, and end with
  a 503 entry (50301, retriable).
* A body with ``Content-Length`` and several records is checked whole first: any
  malformed record is 4xx for the request and nothing is written; otherwise it is
  answered as a stream.

Records of one stream are handed to the service in order, each run queued for the
writer before the next is placed (``_Producer``), so records of one key keep the
stream's order in their partition, as within one v2 request. As within a v2 request, a
record that fails does not stop the ones after it: a client that needs strict order
resends from the first failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

from aiohttp import web

from sidecar.core import names
from sidecar.core.errors import (
    BadRequest,
    RequestTimeout,
    ShuttingDown,
    SidecarError,
    UnknownCluster,
)
from sidecar.core.produce import EmbeddedFormat, ProduceRequest, RecordWritten
from sidecar.http import v3_codec
from sidecar.http.connections import streams_body
from sidecar.http.produce_codec import (
    EXPECTED_COUNT_HEADER,
    EXPECTED_GENERATION_HEADER,
    IDEMPOTENCY_KEY_HEADER,
    MAX_GENERATION,
    MAX_PARTITION,
    request_header_int,
)
from sidecar.http.topic_routes import TOPICS_KEY
from sidecar.metrics import SidecarMetrics
from sidecar.service.produce import ProduceService

_log = logging.getLogger(__name__)

RECORDS_PATH: Final = "/v3/clusters/{cluster_id}/topics/{topic_name}/records"

_V3_PRODUCE_KEY: Final = web.AppKey("v3_produce", ProduceService)
_V3_METRICS_KEY: Final = web.AppKey("v3_metrics", SidecarMetrics)
_V3_CLOSING_KEY: Final = web.AppKey("v3_closing", asyncio.Event)
"""Set when the server shuts down: open streams stop reading and end."""
_READ_SIZE: Final = 2**16

V3Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def add_routes(
    app: web.Application, produce_service: ProduceService, metrics: SidecarMetrics
) -> None:
    """Serve the v3 routes on ``app`` (after ``topic_routes.add_routes``)."""
    app[_V3_PRODUCE_KEY] = produce_service
    app[_V3_METRICS_KEY] = metrics
    app[_V3_CLOSING_KEY] = asyncio.Event()
    app.on_shutdown.append(_close_streams)
    app.router.add_get("/v3/clusters", list_clusters)
    app.router.add_get("/v3/clusters/{cluster_id}", get_cluster)
    app.router.add_post(RECORDS_PATH, produce_records)


async def _close_streams(app: web.Application) -> None:
    # Runs before the server waits for its handlers: without it an open stream would
    # keep a stopping sidecar up for the whole shutdown grace, then be cut off.
    app[_V3_CLOSING_KEY].set()


def _v3_errors(handler: V3Handler) -> V3Handler:
    """Answer what ``handler`` raises in v3's error shape (the v2 routes' middleware
    answers errors raised before it, in v2's)."""

    async def answered(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except SidecarError as exc:
            if exc.http_status >= 500:
                _log.warning("%s %s failed: %s", request.method, request.path, exc.message)
            return _error_response(exc)
        except Exception:
            # A bug: answered in this API's shape and content type all the same.
            _log.exception("unexpected error serving %s %s", request.method, request.path)
            return _error_response(SidecarError())

    answered.__name__ = handler.__name__
    answered.__doc__ = handler.__doc__
    return answered


def _error_response(exc: SidecarError) -> web.Response:
    return web.json_response(
        v3_codec.error_body(exc),
        status=exc.http_status,
        headers=dict(exc.headers),
        content_type=v3_codec.V3_CONTENT_TYPE,
    )


def _base_url(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


async def _checked_cluster(request: web.Request) -> str:
    """The cluster id of the path. Raises UnknownCluster if it is not Kafka's."""
    cluster_id = await request.app[TOPICS_KEY].cluster_id()
    asked = request.match_info["cluster_id"]
    if asked != cluster_id:
        raise UnknownCluster(
            f"cluster {asked[:100]!r} not found; this sidecar writes to {cluster_id}"
        )
    return cluster_id


@_v3_errors
async def list_clusters(request: web.Request) -> web.StreamResponse:
    cluster_id = await request.app[TOPICS_KEY].cluster_id()
    return web.json_response(v3_codec.cluster_list_body(cluster_id, _base_url(request)))


@_v3_errors
async def get_cluster(request: web.Request) -> web.StreamResponse:
    cluster_id = await _checked_cluster(request)
    return web.json_response(v3_codec.cluster_body(cluster_id, _base_url(request)))


# Produce ------------------------------------------------------------------------------------


Answer = dict[str, object]


class _Producer:
    """One v3 request's records, produced through the service and answered.

    Records are handed to the service in runs, each ``ProduceService.produce`` call with every
    record that arrived while the previous run was being placed. One call places and
    queues its records in order in one synchronous step, and the next run starts only
    once the previous one's records are queued for the writer (``on_sent``; for an
    unmanaged topic, once it is answered), so the stream's order is the order Kafka
    appends them. Calls of one stream made freely could pass each other: one released
    from a hold a moment after a later one arrived. Runs overlap while the writer commits,
    so what arrives meanwhile joins the next transaction. A run never waits to fill up: a
    record that arrives while nothing is being placed goes out at once, alone.
    """

    def __init__(self, request: web.Request, cluster_id: str, topic: str) -> None:
        app = request.app
        self.service = app[_V3_PRODUCE_KEY]
        self.metrics = app[_V3_METRICS_KEY]
        self.settings = self.service.settings
        self.cluster_id = cluster_id
        self.topic = topic
        self.max_record_bytes = self.settings.http.max_body_bytes
        self.expected_generation = request_header_int(
            request.headers, EXPECTED_GENERATION_HEADER, 0, MAX_GENERATION
        )
        self.expected_count = request_header_int(
            request.headers, EXPECTED_COUNT_HEADER, 1, MAX_PARTITION
        )
        self._waiting: list[tuple[v3_codec.V3Record, asyncio.Future[Answer]]] = []
        self._wakeup = asyncio.Event()
        self._closed = False

    def submit(self, item: v3_codec.Framed | v3_codec.V3Record) -> asyncio.Future[Answer]:
        """Queue one record (as the splitter cut it, or decoded) for the next run; its
        answer, when known. One that is not a record is answered at once, not written."""
        answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        try:
            if isinstance(item, SidecarError):
                raise item
            decoded = (
                item if isinstance(item, v3_codec.V3Record) else v3_codec.decode_document(item)
            )
        except SidecarError as exc:
            self._count_request(str(exc.error_code), 0.0)
            answer.set_result(v3_codec.error_body(exc))
            return answer
        self._waiting.append((decoded, answer))
        self._wakeup.set()
        return answer

    def close(self) -> None:
        """No more records: ``run`` returns once the queued ones are answered."""
        self._closed = True
        self._wakeup.set()

    async def run(self) -> None:
        """Produce the queued records in runs until ``close``; the next run starts once
        the previous one's records are queued for the writer (or it has ended)."""
        runs: set[asyncio.Task[None]] = set()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if self._waiting:
                run, self._waiting = self._waiting, []
                sent = asyncio.Event()
                task = asyncio.ensure_future(self._answer(run, sent))
                runs.add(task)
                task.add_done_callback(runs.discard)
                sending = asyncio.ensure_future(sent.wait())
                await asyncio.wait({task, sending}, return_when=asyncio.FIRST_COMPLETED)
                sending.cancel()
                self._wakeup.set()
            elif self._closed:
                break
        if runs:
            await asyncio.wait(runs)

    async def _answer(
        self, run: list[tuple[v3_codec.V3Record, asyncio.Future[Answer]]], sent: asyncio.Event
    ) -> None:
        answers = await self.produce([decoded for decoded, _ in run], on_sent=sent.set)
        for (_, future), answer in zip(run, answers, strict=True):
            future.set_result(answer)

    async def produce(
        self, records: list[v3_codec.V3Record], on_sent: Callable[[], None] | None = None
    ) -> list[Answer]:
        """Write ``records`` in one service call; one answer each, success or error."""
        began = time.monotonic()
        outcome = "error"
        try:
            request = ProduceRequest(
                records=tuple(decoded.record for decoded in records),
                expected_generation=self.expected_generation,
                expected_count=self.expected_count,
                idempotency_key=None,
                format=EmbeddedFormat.BINARY,
            )
            produced = await self.service.produce(self.topic, request, on_sent=on_sent)
            answers: list[Answer] = []
            written = 0
            for decoded, result in zip(records, produced.results, strict=True):
                if isinstance(result, RecordWritten):
                    written += 1
                    answers.append(
                        v3_codec.written_body(
                            result, decoded, cluster_id=self.cluster_id, topic=self.topic
                        )
                    )
                else:
                    answers.append(v3_codec.failed_body(result))
            failed = len(records) - written
            outcome = "ok" if failed == 0 else ("partial" if written else "failed")
            label = self.metrics.topic_label(self.topic, exists=True)
            self.metrics.produce_records.labels(label, "written").inc(written)
            self.metrics.produce_records.labels(label, "failed").inc(failed)
            self.metrics.produce_bytes.labels(label).inc(
                sum(len(d.record.key or b"") + len(d.record.value or b"") for d in records)
            )
            return answers
        except SidecarError as exc:
            outcome = str(exc.error_code)
            return [v3_codec.error_body(exc)] * len(records)
        except Exception:
            # A bug: these records are answered 500, the stream goes on.
            _log.exception("unexpected error producing v3 records to %s", self.topic)
            internal: Answer = {"error_code": 500, "message": SidecarError.default_message}
            return [internal] * len(records)
        finally:
            self._count_request(outcome, time.monotonic() - began)

    def _count_request(self, outcome: str, seconds: float) -> None:
        # Labelled only with a topic known to exist, so invented names add no series.
        known = self.topic in self.service.registry.topics
        label = self.metrics.topic_label(self.topic, exists=known)
        self.metrics.produce_requests.labels(label, outcome).inc()
        self.metrics.produce_latency.labels(label, outcome).observe(seconds)


@streams_body
@_v3_errors
async def produce_records(request: web.Request) -> web.StreamResponse:
    """Produce one record, or stream records in and results out (module docstring)."""
    # The name first: a name that cannot be a topic reaches nothing, not even Kafka.
    topic = names.topic_name(request.match_info["topic_name"], "topic_name in the path")
    cluster_id = await _checked_cluster(request)
    v3_codec.check_content_type(request.headers.get("Content-Type"))
    if IDEMPOTENCY_KEY_HEADER.lower() in {name.lower() for name in request.headers}:
        raise BadRequest(
            f"{IDEMPOTENCY_KEY_HEADER} is served by the v2 produce route only; a v3 stream "
            "has no single body to repeat"
        )
    producer = _Producer(request, cluster_id, topic)
    if request.content_length is not None:
        body = await request.read()
        records = v3_codec.split_body(body, max_record_bytes=producer.max_record_bytes)
        if not records:
            raise BadRequest("the request holds no record; send one JSON object per record")
        # All checked before any is written: a malformed body is refused whole.
        decoded = [v3_codec.decode_document(document) for document in records]
        if len(decoded) == 1:
            (answer,) = await producer.produce(decoded)
            status = answer["error_code"]
            assert isinstance(status, int)
            return web.Response(
                body=v3_codec.encode(answer), status=status, content_type=v3_codec.V3_CONTENT_TYPE
            )
        return await _stream(request, producer, _listed(decoded))
    return await _stream(request, producer, _read_records(request, producer))


class _StreamEnded:
    """The stream cannot be read further: ``error`` is its last answer."""

    def __init__(self, error: SidecarError) -> None:
        self.error = error


_Item = v3_codec.Framed | v3_codec.V3Record | _StreamEnded


async def _listed(records: list[v3_codec.V3Record]) -> AsyncIterator[_Item]:
    for record in records:
        yield record


async def _read_records(request: web.Request, producer: _Producer) -> AsyncIterator[_Item]:
    """Records of a chunked body as they arrive; what ends the stream (bytes that are
    not a record, idleness) comes last, as ``_StreamEnded``."""
    splitter = v3_codec.ObjectSplitter(producer.max_record_bytes)
    idle_s = producer.settings.produce.stream_idle_timeout_s
    closing = request.app[_V3_CLOSING_KEY]
    while True:
        if closing.is_set():
            yield _StreamEnded(_shutting_down())
            return
        reading = asyncio.ensure_future(request.content.readany())
        # A lost connection fails it after the handler may have been cancelled: seen.
        reading.add_done_callback(_seen)
        stopping = asyncio.ensure_future(closing.wait())
        try:
            done, _ = await asyncio.wait(
                {reading, stopping}, timeout=idle_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopping.cancel()
            if not reading.done():
                reading.cancel()
        if reading not in done:
            yield _StreamEnded(
                _shutting_down()
                if closing.is_set()
                else RequestTimeout(f"the stream sent nothing for {idle_s:g} s")
            )
            return
        try:
            chunk = reading.result()
        except ConnectionError:
            return  # the client went away: what it sent is answered to nobody, and settles
        if not chunk:
            break
        try:
            records = splitter.feed(chunk)
        except SidecarError as exc:
            yield _StreamEnded(exc)
            return
        for record in records:
            yield record
    try:
        splitter.finish()
    except SidecarError as exc:
        yield _StreamEnded(exc)


def _seen(future: asyncio.Future[bytes]) -> None:
    if not future.cancelled():
        future.exception()


def _shutting_down() -> ShuttingDown:
    return ShuttingDown("the sidecar is shutting down: send the rest again elsewhere")


async def _stream(
    request: web.Request,
    producer: _Producer,
    records: AsyncIterator[_Item],
) -> web.StreamResponse:
    """Answer 200 now, then each record's result as a line, in order."""
    response = web.StreamResponse(status=200)
    response.content_type = v3_codec.V3_CONTENT_TYPE
    response.enable_chunked_encoding()
    await response.prepare(request)
    slots = asyncio.Semaphore(producer.settings.produce.stream_max_in_flight)
    answers: asyncio.Queue[asyncio.Future[Answer] | None] = asyncio.Queue()
    writer = _AnswerWriter(response, answers, slots)
    writing = asyncio.create_task(writer.run())
    producing = asyncio.create_task(producer.run())
    ended_early = False
    try:
        async for item in records:
            await slots.acquire()
            if writer.gone:
                ended_early = True
                break
            if isinstance(item, _StreamEnded):
                ended = asyncio.get_running_loop().create_future()
                ended.set_result(v3_codec.error_body(item.error))
                answers.put_nowait(ended)
                ended_early = True
                break
            answers.put_nowait(producer.submit(item))
    finally:
        producer.close()
        answers.put_nowait(None)
        # Every record handed over is answered (or, the client gone, settled) first.
        await producing
        await writing
    if ended_early:
        # The rest of the body is unread: the connection cannot carry another request.
        response.force_close()
    if not writer.gone:
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
    return response


class _AnswerWriter:
    """Writes the answers in the order their records came, each once it is known."""

    def __init__(
        self,
        response: web.StreamResponse,
        answers: asyncio.Queue[asyncio.Future[Answer] | None],
        slots: asyncio.Semaphore,
    ) -> None:
        self._response = response
        self._answers = answers
        self._slots = slots
        self.gone = False
        """The client went away: answers are awaited (the records still settle) but
        no longer written."""

    async def run(self) -> None:
        closed = False
        while not closed:
            pending = await self._answers.get()
            if pending is None:
                return
            ready = [await pending]
            # Answers already known go out in one write (a run settles together).
            while not self._answers.empty():
                following = self._answers.get_nowait()
                if following is None:
                    closed = True
                    break
                if not following.done():
                    ready.append(await following)
                    break
                ready.append(following.result())
            for _ in ready:
                self._slots.release()
            if self.gone:
                continue
            try:
                await self._response.write(b"".join(v3_codec.encode(answer) for answer in ready))
            except ConnectionError:
                self.gone = True
