"""AdmissionReview v1 in, AdmissionReview v1 out: pure, no I/O.

Only pod CREATE requests are mutated; anything else the API server sends (an UPDATE,
another kind, a namespace without opted-in pods) is allowed unchanged, so a too-wide
webhook registration cannot break other objects. A pod that cannot be patched (its
parts are not a Pod's shapes) is allowed unchanged too, with the reason as the status
message and a warning: the webhook never stands between the API server and a pod it
does not understand. Any JSON that is not an AdmissionReview v1 request is BadReview.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any, Final

from sidecar.inject.patch import InjectConfig, InjectionError, UnpatchablePod, patch_for

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"


class BadReview(ValueError):
    """The body is not an AdmissionReview v1 request (the server answers 400)."""


def admit(review: Any, config: InjectConfig) -> dict[str, Any]:
    """The AdmissionReview response for ``review`` (a decoded JSON document).

    Raises BadReview when ``review`` is not an AdmissionReview v1 with a request uid.
    """
    if not isinstance(review, Mapping):
        raise BadReview("the body must be a JSON object")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != KIND:
        raise BadReview(f"expected apiVersion {API_VERSION} and kind {KIND}")
    request = review.get("request")
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        raise BadReview("the AdmissionReview has no request uid")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    pod = request.get("object")
    if request.get("operation") == "CREATE" and _is_pod(request) and isinstance(pod, Mapping):
        try:
            operations = patch_for(pod, config)
        except InjectionError as exc:
            response["allowed"] = False
            response["status"] = {"code": 400, "reason": "BadRequest", "message": str(exc)}
            operations = []
        except UnpatchablePod as exc:
            message = f"ordered-sidecar not injected: {exc}"
            response["status"] = {"message": message}
            response["warnings"] = [message]
            operations = []
        if operations:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(operations).encode()).decode()
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def _is_pod(request: Mapping[str, Any]) -> bool:
    kind = request.get("kind")
    return isinstance(kind, Mapping) and kind.get("group", "") == "" and kind.get("kind") == "Pod"
