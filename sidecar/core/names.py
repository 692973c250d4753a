"""The names a client chooses, checked in one place before any of them is used.

A topic, consumer group or consumer instance name from a request ends up in a Kafka
request, a ZooKeeper path (``<root>/topics/<t>``, ``<root>/groups/<g>``, the wait
nodes) and a Prometheus label; a sidecar id ends up in ZooKeeper paths too. So each
is checked against one rule here, at the HTTP edge before anything else runs, and
again by the ZooKeeper adapter before it builds a path (a name that reached it
unchecked is a bug, refused rather than stored).

=============  ==========================================  =================================
name           rule                                        why
=============  ==========================================  =================================
topic          1-249 of ``A-Z a-z 0-9 . _ -``, not ``.``   Kafka's own rule (``Topic.java``):
               or ``..``                                   a name Kafka refuses never reaches
                                                           it
group          1-249 of ``A-Z a-z 0-9 . _ - ~``, not       Kafka takes any non-empty group
               ``.`` or ``..``                             id, but a group is a URL path
                                                           segment, a znode and a label: the
                                                           URL-unreserved characters read the
                                                           same in all three and need no
                                                           percent-encoding in any client
instance       1-255 of ``A-Z a-z 0-9 . _ - ~``, not       a URL path segment and part of a
               ``.`` or ``..``                             znode name (never ``:``, which
                                                           separates a wait node's fields)
sidecar id     1-200 of ``A-Z a-z 0-9 . _ -``, not         a znode name (registration,
               ``.`` or ``..``                             barrier acks), part of wait nodes
                                                           and of Kafka transactional ids
                                                           (registered as znodes too)
=============  ==========================================  =================================

``.`` and ``..`` are refused everywhere: they are not valid znode names, and in a URL
they are path steps, not names.
"""

from __future__ import annotations

import re
from typing import Final

from sidecar.core.errors import InvalidName

MAX_TOPIC_NAME_LENGTH: Final = 249
MAX_GROUP_NAME_LENGTH: Final = 249
MAX_INSTANCE_NAME_LENGTH: Final = 255
MAX_SIDECAR_ID_LENGTH: Final = 200
MAX_NODE_NAME_LENGTH: Final = 1024

TOPIC_NAME_PATTERN: Final = rf"[A-Za-z0-9._-]{{1,{MAX_TOPIC_NAME_LENGTH}}}"
GROUP_NAME_PATTERN: Final = rf"[A-Za-z0-9._~-]{{1,{MAX_GROUP_NAME_LENGTH}}}"
INSTANCE_NAME_PATTERN: Final = rf"[A-Za-z0-9._~-]{{1,{MAX_INSTANCE_NAME_LENGTH}}}"
SIDECAR_ID_PATTERN: Final = rf"[A-Za-z0-9._-]{{1,{MAX_SIDECAR_ID_LENGTH}}}"
NODE_NAME_PATTERN: Final = rf"[A-Za-z0-9._~-]{{1,{MAX_NODE_NAME_LENGTH}}}"

_TOPIC: Final = re.compile(TOPIC_NAME_PATTERN)
_GROUP: Final = re.compile(GROUP_NAME_PATTERN)
_INSTANCE: Final = re.compile(INSTANCE_NAME_PATTERN)
_SIDECAR_ID: Final = re.compile(SIDECAR_ID_PATTERN)
_NODE_NAME: Final = re.compile(NODE_NAME_PATTERN)
_PATH_STEPS: Final = frozenset({".", ".."})
_SHOWN: Final = 80
"""How much of a refused name an error message repeats (a name may be megabytes)."""


def is_topic_name(raw: object) -> bool:
    """True when Kafka would accept ``raw`` as a topic name."""
    return _matches(_TOPIC, raw)


def topic_name(raw: object, where: str = "topic") -> str:
    """``raw`` if it is a topic name Kafka accepts; raises InvalidName (``where`` says
    which field, e.g. ``topics[2]``)."""
    if not _matches(_TOPIC, raw):
        raise InvalidName(
            f"{where} {_shown(raw)} is not a topic name: use 1 to {MAX_TOPIC_NAME_LENGTH} "
            "of A-Z a-z 0-9 . _ - (not '.' or '..')"
        )
    assert isinstance(raw, str)
    return raw


def group_name(raw: object, where: str = "group") -> str:
    """``raw`` if it is a consumer group name this sidecar serves; raises InvalidName."""
    if not _matches(_GROUP, raw):
        raise InvalidName(
            f"{where} {_shown(raw)} is not a consumer group name: use 1 to "
            f"{MAX_GROUP_NAME_LENGTH} of A-Z a-z 0-9 . _ - ~ (not '.' or '..')"
        )
    assert isinstance(raw, str)
    return raw


def instance_name(raw: object, where: str = "name") -> str:
    """``raw`` if it is a consumer instance name; raises InvalidName."""
    if not _matches(_INSTANCE, raw):
        raise InvalidName(
            f"{where} {_shown(raw)} is not a consumer instance name: use 1 to "
            f"{MAX_INSTANCE_NAME_LENGTH} of A-Z a-z 0-9 . _ - ~ (not '.' or '..')"
        )
    assert isinstance(raw, str)
    return raw


def sidecar_id(raw: object, where: str = "sidecar id") -> str:
    """``raw`` if it can name a sidecar in ZooKeeper; raises InvalidName."""
    if not _matches(_SIDECAR_ID, raw):
        raise InvalidName(
            f"{where} {_shown(raw)} is not a sidecar id: use 1 to {MAX_SIDECAR_ID_LENGTH} "
            "of A-Z a-z 0-9 . _ - (not '.' or '..')"
        )
    assert isinstance(raw, str)
    return raw


def node_name(raw: object, where: str) -> str:
    """``raw`` if it is made of name characters only, as a name the sidecar composes from
    checked names is (e.g. ``<sidecar id>-<instance>``); raises InvalidName."""
    if not _matches(_NODE_NAME, raw):
        raise InvalidName(f"{where} {_shown(raw)} cannot name a ZooKeeper node")
    assert isinstance(raw, str)
    return raw


def _matches(rule: re.Pattern[str], raw: object) -> bool:
    return isinstance(raw, str) and rule.fullmatch(raw) is not None and raw not in _PATH_STEPS


def _shown(raw: object) -> str:
    if not isinstance(raw, str):
        return f"({type(raw).__name__})"
    if len(raw) > _SHOWN:
        return f"{raw[:_SHOWN]!r}... ({len(raw)} characters)"
    return repr(raw)
