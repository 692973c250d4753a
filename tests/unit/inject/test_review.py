"""``sidecar.inject.review``: AdmissionReview v1 in, AdmissionReview v1 out. Only pod
CREATE requests are patched; anything else, and a pod of the wrong shapes, is allowed
unchanged; what is not an AdmissionReview v1 request is BadReview."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.inject.patch import INJECT_ANNOTATION, InjectConfig, patch_for
from sidecar.inject.review import BadReview, admit
from tests.unit.inject.support import opted_in_pod, pod

CONFIG = InjectConfig(image="registry.example.com/ordered-sidecar:0.1.0")


def review(obj: dict[str, Any], *, operation: str = "CREATE", kind: str = "Pod") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": operation,
            "object": obj,
        },
    }


def test_admit_returns_the_patch_base64_encoded_with_the_request_uid() -> None:
    answer = admit(review(opted_in_pod()), CONFIG)
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == patch_for(opted_in_pod(), CONFIG)


@pytest.mark.parametrize(
    "request_review",
    [
        review(pod()),
        review(opted_in_pod(), operation="UPDATE"),
        review(opted_in_pod(), kind="Deployment"),
    ],
)
def test_admit_allows_everything_else_unchanged(request_review: dict[str, Any]) -> None:
    response = admit(request_review, CONFIG)["response"]
    assert response == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_admit_denies_a_pod_it_cannot_inject_with_the_reason() -> None:
    bad = pod({INJECT_ANNOTATION: "true", "ordered-sidecar.io/config-map": "-bad-"})
    response = admit(review(bad), CONFIG)["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert "ordered-sidecar.io/config-map" in response["status"]["message"]
    assert "patch" not in response


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}},
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}},
    ],
)
def test_admit_rejects_what_is_not_an_admission_review_v1(body: Any) -> None:
    with pytest.raises(BadReview):
        admit(body, CONFIG)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("metadata",), "a string"),
        (("metadata", "annotations"), ["a", "list"]),
        (("spec",), 7),
        (("spec", "containers"), "a string"),
        (("spec", "initContainers"), {"name": "an object"}),
        (("spec", "initContainers"), ["not an object"]),
        (("spec", "volumes"), [None]),
    ],
)
def test_a_pod_of_the_wrong_shapes_is_allowed_unchanged_with_the_reason(
    path: tuple[str, ...], value: Any
) -> None:
    bad = opted_in_pod()
    target = bad
    for field in path[:-1]:
        target = target[field]
    target[path[-1]] = value
    response = admit(review(bad), CONFIG)["response"]
    assert response["allowed"] is True
    assert "patch" not in response
    assert "not injected" in response["status"]["message"]
    assert response["warnings"] == [response["status"]["message"]]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=30,
)
POD_PARTS = st.sampled_from(
    [
        ("metadata",),
        ("metadata", "annotations"),
        ("metadata", "annotations", INJECT_ANNOTATION),
        ("metadata", "annotations", "ordered-sidecar.io/config-map"),
        ("spec",),
        ("spec", "containers"),
        ("spec", "initContainers"),
        ("spec", "volumes"),
        ("spec", "containers", 0),
        ("spec", "containers", 0, "name"),
    ]
)


@given(st.lists(st.tuples(POD_PARTS, JSON), max_size=4), st.sampled_from(["CREATE", "UPDATE"]))
def test_any_pod_gets_an_admission_response_never_an_exception(
    changes: list[tuple[tuple[str | int, ...], Any]], operation: str
) -> None:
    document = opted_in_pod()
    for path, value in changes:
        target: Any = document
        for step in path[:-1]:
            try:
                target = target[step]
            except (KeyError, IndexError, TypeError):
                break
        else:
            settable = (isinstance(target, dict) and isinstance(path[-1], str)) or (
                isinstance(target, list) and isinstance(path[-1], int) and target
            )
            if settable:
                target[path[-1]] = value
    answer = admit(review(document, operation=operation), CONFIG)
    response = answer["response"]
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert isinstance(response["allowed"], bool)
    json.dumps(answer)  # what the server sends


@given(JSON)
def test_any_json_body_is_a_review_or_bad_review(body: Any) -> None:
    try:
        answer = admit(body, CONFIG)
    except BadReview:
        return
    assert answer["kind"] == "AdmissionReview"
