"""Schemathesis hooks for fuzzing a sidecar on a shared cluster (``SCHEMATHESIS_HOOKS``).

The admin API really creates topics and changes partition counts, and the fuzzer would
ask for up to 10 000 partitions with a replication factor of 32 767: refused by Kafka
(a 400 with Kafka's message, which is what is tested) or, worse, granted. And the
fuzzer learns topic names from ``GET /topics``, which on a shared cluster lists other
people's topics. So before a request is sent:

* counts above ``MAX_COUNT`` become ``MAX_COUNT``;
* a topic the admin API would create gets the run's prefix (``FUZZ_TOPIC_PREFIX``), so
  the run can delete what it made;
* a request that writes to a topic (produce, adopt, change the partition count) and
  names one that is neither the run's own (``FUZZ_OWN_TOPICS``, comma-separated) nor
  prefixed gets the prefix too: it then names a topic that does not exist (a 404,
  still tested) instead of someone else's;
* a hand-off callback URL the sidecar would call (http or https on a loopback host) is
  replaced by the run's own sink (``FUZZ_CALLBACK_URL``), so no other local service
  gets the sidecar's POSTs.

Values that must be refused (negative, zero, the wrong type, a name that is not one)
are left as generated.

Three kinds of check failure are dropped (counted as "filtered" in the report), each
a heuristic of schemathesis that does not fit REST Proxy's API:

* a request whose only fault is an extra, undeclared header, "accepted" by the
  sidecar: HTTP lets a server ignore headers it does not know (RFC 9110 §5.1), and
  every proxy on the way adds some, so this is what the sidecar must do;
* "created resource not found" where the 404 is about another resource: a consumer
  instance just created, asked to assign a partition of a topic that does not exist,
  answers 404 40401 (REST Proxy's unknown topic), not 40403 (unknown instance);
* "deleted resource still available" after ``DELETE .../subscription``: a
  subscription is a part of its instance, not a resource of its own, and after an
  unsubscribe ``GET .../subscription`` answers ``{"topics": []}``, as REST Proxy does.
"""

from __future__ import annotations

import json
import os
from typing import Any, Final
from urllib.parse import urlsplit

import schemathesis
from schemathesis.core.failures import Failure
from schemathesis.core.transport import Response
from schemathesis.generation.meta import CoverageScenario

from sidecar.core import names

MAX_COUNT: Final = 6
"""Largest partition count or replication factor the fuzzer may ask of the cluster."""
UNKNOWN_INSTANCE: Final = 40403
_COUNT_FIELDS: Final = ("partitions", "count", "replication_factor")


_WRITES: Final = {
    ("POST", "/topics/{topic}"): "topic",
    ("POST", "/topics/{topic}/partitions/{partition}"): "topic",
    ("POST", "/admin/topics/{topic}/adopt"): "topic",
    ("POST", "/admin/topics/{topic}/partition-count"): "topic",
    ("POST", "/v3/clusters/{cluster_id}/topics/{topic_name}/records"): "topic_name",
}
"""Operations that write to the topic their path names, and that path parameter."""


@schemathesis.hook
def before_call(
    context: schemathesis.HookContext, case: schemathesis.Case[Any], kwargs: Any
) -> None:
    prefix = os.environ.get("FUZZ_TOPIC_PREFIX", "fuzz-")
    parameter = _WRITES.get((case.method.upper(), case.path))
    topic = None if parameter is None else case.path_parameters.get(parameter)
    if parameter is not None and isinstance(topic, str):
        own = set(os.environ.get("FUZZ_OWN_TOPICS", "").split(","))
        if names.is_topic_name(topic) and topic not in own and not topic.startswith(prefix):
            case.path_parameters[parameter] = (prefix + topic)[: names.MAX_TOPIC_NAME_LENGTH]
    if case.path == "/consumers/{group}" and isinstance(case.body, dict):
        url = case.body.get("callback_url")
        sink = os.environ.get("FUZZ_CALLBACK_URL")
        if sink and isinstance(url, str) and _is_loopback_http(url):
            case.body["callback_url"] = sink
    if not case.path.startswith("/admin/") or not isinstance(case.body, dict):
        return
    body: dict[str, Any] = case.body
    for field in _COUNT_FIELDS:
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_COUNT:
            body[field] = MAX_COUNT
    name = body.get("name")
    if case.path == "/admin/topics" and isinstance(name, str) and names.is_topic_name(name):
        body["name"] = (prefix + name)[: names.MAX_TOPIC_NAME_LENGTH]


def _is_loopback_http(url: str) -> bool:
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return False
    return parts.scheme.lower() in ("http", "https") and (
        host == "localhost" or host.startswith("127.") or host == "::1"
    )


@schemathesis.hook
def filter_failure(
    context: schemathesis.HookContext,
    failure: Failure,
    case: schemathesis.Case[Any],
    response: Response,
) -> bool:
    """False (drop) for the two false positives above, True for every other failure."""
    if failure.code == "ST302":  # created resource not found
        return _error_code(response) == UNKNOWN_INSTANCE
    if failure.code == "ST301":  # deleted resource still available
        return "/subscription`" not in failure.message
    if failure.code != "ST201":  # schema-violating request accepted
        return True
    meta = case.meta
    if meta is None:
        return True
    negative = {
        location
        for location, info in meta.components.items()
        if info.mode is schemathesis.GenerationMode.NEGATIVE
    }
    scenario = getattr(meta.phase.data, "scenario", None)
    extra_header = scenario == CoverageScenario.OBJECT_UNEXPECTED_PROPERTIES
    return not (extra_header and {location.value for location in negative} == {"header"})


def _error_code(response: Response) -> object:
    try:
        body = json.loads(response.content)
    except ValueError:
        return None
    return body.get("error_code") if isinstance(body, dict) else None
