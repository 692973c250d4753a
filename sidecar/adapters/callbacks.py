"""The hand-off callback client: POST to the app's callback URL until a 2xx.

One ``aiohttp.ClientSession`` per consumer instance, opened on the first call. The
body is encoded by the function the client is given (the HTTP layer's callback codec),
so the wire format lives with the other wire formats; this module only sends it and
retries.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp

from sidecar.core.errors import SidecarError
from sidecar.core.handoff import AssignmentCallback, HandoffCallback

CallbackMessage = HandoffCallback | AssignmentCallback
Encode = Callable[[CallbackMessage], bytes]
Observe = Callable[[CallbackMessage, float, bool], None]
"""Told of every attempt: the message, how long it took, whether the app answered 2xx."""


class CallbackClient:
    def __init__(
        self, url: str, *, timeout_s: float, retry_s: float, encode: Encode, observe: Observe
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._encode = encode
        self._observe = observe
        self._http: aiohttp.ClientSession | None = None

    async def post(
        self,
        message: CallbackMessage,
        *,
        within_s: float,
        still_needed: Callable[[], Awaitable[bool]] | None = None,
    ) -> str | None:
        """POST ``message`` until a 2xx, retrying for ``within_s``; None, or the last
        failure. ``still_needed`` is asked before every attempt (False: done without
        calling; a SidecarError from it counts as a failed attempt)."""
        if self._http is None:
            self._http = aiohttp.ClientSession()
        body = self._encode(message)
        deadline = time.monotonic() + within_s
        while True:
            try:
                if still_needed is not None and not await still_needed():
                    return None
            except SidecarError as exc:
                if time.monotonic() >= deadline:
                    return exc.message
                await asyncio.sleep(self.retry_s)
                continue
            began = time.monotonic()
            try:
                async with self._http.post(
                    self.url,
                    data=body,
                    headers={"Content-Type": "application/json"},
                    timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                ) as response:
                    ok = 200 <= response.status < 300
                    reason = f"status {response.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                ok, reason = False, repr(exc)
            self._observe(message, time.monotonic() - began, ok)
            if ok:
                return None
            if time.monotonic() >= deadline:
                return reason
            await asyncio.sleep(self.retry_s)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
