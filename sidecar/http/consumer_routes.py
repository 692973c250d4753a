"""HTTP handlers of the consumer API (REST Proxy v2 plus hand-off events).

Decoding lives in ``consumer_codec`` and ``create_consumer_codec``, encoding in
``consumer_response_codec`` and ``records_codec``; the behaviour in
``sidecar.service.consumers``. Calls on one instance are serialized (its lock), as
REST Proxy serializes them: a commit waits for a long poll of the same instance.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from sidecar.core.consume import TopicPartition
from sidecar.core.handoff import TruncationNotice
from sidecar.core.produce import EmbeddedFormat
from sidecar.http.consumer_codec import (
    SeekOffset,
    SubscribeTopics,
    decode_assignments,
    decode_commit_offsets,
    decode_committed_request,
    decode_event_ack,
    decode_records_query,
    decode_seek,
    decode_seek_partitions,
    decode_subscription,
)
from sidecar.http.consumer_response_codec import (
    CommittedOffset,
    assignments_body,
    committed_offsets_body,
    create_consumer_body,
    subscription_body,
)
from sidecar.http.create_consumer_codec import decode_create_consumer
from sidecar.http.error_map import client_went_away
from sidecar.http.produce_codec import V2_RESPONSE_CONTENT_TYPE
from sidecar.http.records_codec import (
    KeyEvent,
    PartitionRef,
    RebalanceNotice,
    RecordHeaders,
    RecordToDeliver,
    encode_records_response,
    encode_response,
    records_content_type,
)
from sidecar.http.topic_routes import TOPICS_KEY
from sidecar.service.consumers import Consumers, new_instance_name
from sidecar.service.instance import ConsumerInstance, InstanceConfig

CONSUMERS_KEY: Final = web.AppKey("consumers", Consumers)

_DEFAULTS: Final = InstanceConfig(group="", name="", format="binary")
"""What an instance gets for a setting its creation request leaves out."""


def add_routes(app: web.Application, consumers: Consumers) -> None:
    app[CONSUMERS_KEY] = consumers
    instance = "/consumers/{group}/instances/{name}"
    app.router.add_post("/consumers/{group}", create)
    app.router.add_delete(instance, delete)
    app.router.add_post(f"{instance}/subscription", subscribe)
    app.router.add_get(f"{instance}/subscription", get_subscription)
    app.router.add_delete(f"{instance}/subscription", unsubscribe)
    app.router.add_post(f"{instance}/assignments", assign)
    app.router.add_get(f"{instance}/assignments", get_assignments)
    app.router.add_get(f"{instance}/records", records)
    app.router.add_post(f"{instance}/offsets", commit)
    app.router.add_get(f"{instance}/offsets", committed)
    app.router.add_post(f"{instance}/positions", seek)
    app.router.add_post(f"{instance}/positions/beginning", seek_to_beginning)
    app.router.add_post(f"{instance}/positions/end", seek_to_end)
    app.router.add_post(f"{instance}/events/ack", acknowledge_events)


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(
        body=encode_response(body), status=status, content_type=V2_RESPONSE_CONTENT_TYPE
    )


def _instance(request: web.Request) -> ConsumerInstance:
    return request.app[CONSUMERS_KEY].get(request.match_info["group"], request.match_info["name"])


async def _check_exist(request: web.Request, partitions: list[TopicPartition]) -> None:
    """Raises UnknownTopic or UnknownPartition (404) for a partition Kafka does not have."""
    if partitions:
        await request.app[TOPICS_KEY].check_partitions_exist(
            (tp.topic, tp.partition) for tp in partitions
        )


async def create(request: web.Request) -> web.Response:
    group = request.match_info["group"]  # checked by the path names middleware
    decoded = decode_create_consumer(
        await request.read(), content_type=request.headers.get("Content-Type")
    )
    config = InstanceConfig(
        group=group,
        name=decoded.name or new_instance_name(),
        format=decoded.format.value,
        auto_offset_reset=decoded.auto_offset_reset or _DEFAULTS.auto_offset_reset,
        auto_commit=bool(decoded.auto_commit),
        callback_url=decoded.callback_url,
        callback_timeout_s=(
            _DEFAULTS.callback_timeout_s
            if decoded.callback_timeout_ms is None
            else decoded.callback_timeout_ms / 1000
        ),
        poll_timeout_ms=decoded.request_timeout_ms or _DEFAULTS.poll_timeout_ms,
        fetch_min_bytes=(
            _DEFAULTS.fetch_min_bytes
            if decoded.fetch_min_bytes is None
            else decoded.fetch_min_bytes
        ),
        assignment_events=decoded.assignment_events,
        record_headers=decoded.record_headers.value,
    )
    await request.app[CONSUMERS_KEY].create(config)
    base_url = f"{request.scheme}://{request.host}"
    return _json(create_consumer_body(config.name, base_url=base_url, group=group))


async def delete(request: web.Request) -> web.Response:
    await request.app[CONSUMERS_KEY].delete(request.match_info["group"], request.match_info["name"])
    return web.Response(status=204)


async def subscribe(request: web.Request) -> web.Response:
    instance = _instance(request)
    decoded = decode_subscription(
        await request.read(), content_type=request.headers.get("Content-Type")
    )
    if isinstance(decoded, SubscribeTopics):
        await instance.subscribe(decoded.topics, None)
    else:
        await instance.subscribe(None, decoded.pattern)
    return web.Response(status=204)


async def get_subscription(request: web.Request) -> web.Response:
    return _json(subscription_body(_instance(request).subscribed_topics()))


async def unsubscribe(request: web.Request) -> web.Response:
    await _instance(request).unsubscribe()
    return web.Response(status=204)


async def assign(request: web.Request) -> web.Response:
    instance = _instance(request)
    partitions = decode_assignments(
        await request.read(), content_type=request.headers.get("Content-Type")
    )
    # A partition that does not exist is the caller's mistake (404), not a consumer that
    # waits for metadata forever.
    await _check_exist(request, [TopicPartition(p.topic, p.partition) for p in partitions])
    await instance.assign_manually([TopicPartition(p.topic, p.partition) for p in partitions])
    return web.Response(status=204)


async def get_assignments(request: web.Request) -> web.Response:
    partitions = [PartitionRef(tp.topic, tp.partition) for tp in _instance(request).assignment()]
    return _json(assignments_body(partitions))


async def records(request: web.Request) -> web.StreamResponse:
    instance = _instance(request)
    fmt = EmbeddedFormat(instance.config.format)
    kept_headers = RecordHeaders(instance.config.record_headers)
    content_type = records_content_type(request.headers.get("Accept"), fmt)
    query = decode_records_query(
        request.query,
        default_timeout_ms=instance.config.poll_timeout_ms,
        max_bytes_limit=request.app[CONSUMERS_KEY].context.settings.max_poll_bytes,
    )
    # Sent inside the delivery, not after the handler returns: a client that went away
    # while the poll waited (its timeout passed, its sidecar was paused) would otherwise
    # lose the records, and a commit of everything delivered would skip them for the
    # whole group. Whatever is not sent is put back by ``delivery``.
    async with instance.delivery(query.timeout_ms / 1000, query.max_bytes) as result:
        items: list[RecordToDeliver | KeyEvent | RebalanceNotice | TruncationNotice] = [
            n
            if isinstance(n, TruncationNotice)
            else RebalanceNotice(
                n.kind, tuple(PartitionRef(tp.topic, tp.partition) for tp in n.partitions)
            )
            for n in result.notices
        ]
        items += [
            KeyEvent(e.kind, e.topic, e.partition, e.generation, e.event_id) for e in result.events
        ]
        items += result.records
        body = encode_records_response(items, fmt, kept_headers)
        response = web.StreamResponse(headers={"Content-Type": content_type})
        response.content_length = len(body)
        if client_went_away(request):
            raise ConnectionResetError("the client closed the connection")
        await response.prepare(request)
        await response.write(body)
        await response.write_eof()
    return response


async def commit(request: web.Request) -> web.Response:
    instance = _instance(request)
    offsets = decode_commit_offsets(
        await request.read(), content_type=request.headers.get("Content-Type")
    )
    if offsets is None:
        await instance.commit(None)
    else:
        await instance.commit(
            {TopicPartition(o.topic, o.partition): o.next_offset for o in offsets}
        )
    return web.Response(status=204)


async def committed(request: web.Request) -> web.Response:
    instance = _instance(request)
    partitions = decode_committed_request(
        await request.read(), content_type=request.headers.get("Content-Type")
    )
    found = await instance.committed([TopicPartition(p.topic, p.partition) for p in partitions])
    return _json(
        committed_offsets_body(
            [CommittedOffset(tp.topic, tp.partition, offset, "") for tp, offset in found.items()]
        )
    )


async def seek(request: web.Request) -> web.Response:
    instance = _instance(request)
    decoded = decode_seek(await request.read(), content_type=request.headers.get("Content-Type"))
    named = [TopicPartition(o.topic, o.partition) for o in decoded.offsets] + [
        TopicPartition(t.topic, t.partition) for t in decoded.timestamps
    ]
    # Every partition is checked before any position moves: it exists (404 at once, not
    # a lookup that waits for metadata), and it is assigned to this instance.
    await _check_exist(request, named)
    await instance.seek_positions(
        {
            TopicPartition(o.topic, o.partition): o.offset
            for o in decoded.offsets
            if isinstance(o, SeekOffset)
        },
        {TopicPartition(t.topic, t.partition): t.timestamp_ms for t in decoded.timestamps},
    )
    return web.Response(status=204)


async def seek_to_beginning(request: web.Request) -> web.Response:
    return await _seek_to(request, beginning=True)


async def seek_to_end(request: web.Request) -> web.Response:
    return await _seek_to(request, beginning=False)


async def _seek_to(request: web.Request, *, beginning: bool) -> web.Response:
    instance = _instance(request)
    partitions = decode_seek_partitions(
        await request.read(), content_type=request.headers.get("Content-Type")
    )
    await _check_exist(request, [TopicPartition(p.topic, p.partition) for p in partitions])
    await instance.seek_to(
        [TopicPartition(p.topic, p.partition) for p in partitions], beginning=beginning
    )
    return web.Response(status=204)


async def acknowledge_events(request: web.Request) -> web.Response:
    instance = _instance(request)
    event_ids = decode_event_ack(
        await request.read(), content_type=request.headers.get("Content-Type")
    )
    await instance.acknowledge_events(event_ids)
    return web.Response(status=204)
