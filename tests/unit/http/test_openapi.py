"""The served OpenAPI document: it matches the registered routes and is a valid OpenAPI 3.1.

The application is built with the same functions the server uses (``build_app``, then the
consumer routes), on stand-ins for the services: registering routes touches none of them,
so nothing connects to Kafka or ZooKeeper.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from importlib.resources import files
from typing import Any, Final, NoReturn, TypeVar, cast

import pytest
from aiohttp import web
from openapi_spec_validator import validate

from sidecar.adapters.kafka import KafkaGateway
from sidecar.config import Settings
from sidecar.http.app import build_app
from sidecar.http.consumer_routes import add_routes as add_consumer_routes
from sidecar.metrics import SidecarMetrics
from sidecar.service.admin import TopicAdmin
from sidecar.service.changes import ChangeRunner
from sidecar.service.compaction import Compactor
from sidecar.service.consumers import Consumers
from sidecar.service.produce import ProduceService
from sidecar.service.registry import TopicRegistry

HTTP_METHODS: Final = frozenset(
    {"get", "put", "post", "delete", "patch", "head", "options", "trace"}
)
# aiohttp adds HEAD to every GET; neither it nor OPTIONS is part of the API.
IGNORED_METHODS: Final = frozenset({"HEAD", "OPTIONS"})
ERROR_MEDIA_TYPE: Final = "application/vnd.kafka.v2+json"
ERROR_SCHEMA: Final = {"$ref": "#/components/schemas/Error"}
V3_ERROR_MEDIA_TYPE: Final = "application/json"
V3_ERROR_SCHEMA: Final = {"$ref": "#/components/schemas/V3Error"}

Route = tuple[str, str]
_Service = TypeVar("_Service")


class _NotAService:
    """Stands in for a service object; any use means routes were not only registered."""

    def __getattr__(self, name: str) -> NoReturn:
        raise AssertionError(f"building the routes used the service ({name})")


def _stand_in(kind: type[_Service]) -> _Service:
    return cast(_Service, _NotAService())


def _document() -> dict[str, Any]:
    text = (files("sidecar.http") / "openapi.json").read_text(encoding="utf-8")
    document = json.loads(text)
    assert isinstance(document, dict)
    return document


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return _document()


@pytest.fixture(scope="module")
def app() -> web.Application:
    application = build_app(
        Settings(sidecar_id="openapi-test"),
        _stand_in(TopicRegistry),
        _stand_in(ProduceService),
        _stand_in(TopicAdmin),
        _stand_in(ChangeRunner),
        _stand_in(Compactor),
        SidecarMetrics(),
        _stand_in(KafkaGateway),
    )
    add_consumer_routes(application, _stand_in(Consumers))
    return application


def registered_routes(app: web.Application) -> set[Route]:
    return {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None and route.method not in IGNORED_METHODS
    }


def documented_routes(document: dict[str, Any]) -> set[Route]:
    return {
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method in HTTP_METHODS and method.upper() not in IGNORED_METHODS
    }


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method in HTTP_METHODS:
                yield method.upper(), path, operation


def test_every_registered_route_is_documented(
    app: web.Application, document: dict[str, Any]
) -> None:
    assert sorted(registered_routes(app) - documented_routes(document)) == []


def test_every_documented_route_is_registered(
    app: web.Application, document: dict[str, Any]
) -> None:
    assert sorted(documented_routes(document) - registered_routes(app)) == []


def test_the_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1.")
    validate(document)


def _references(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _references(value)
    elif isinstance(node, list):
        for value in node:
            yield from _references(value)


def _resolve(document: dict[str, Any], reference: str) -> object:
    assert reference.startswith("#/"), f"{reference} is not a reference inside the document"
    node: object = document
    for token in reference[2:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict), f"{reference}: {token} is not in an object"
        assert token in node, f"{reference} does not resolve ({token} is missing)"
        node = node[token]
    return node


def test_every_reference_resolves(document: dict[str, Any]) -> None:
    references = set(_references(document))
    assert references
    for reference in sorted(references):
        _resolve(document, reference)


def test_every_schema_component_is_used(document: dict[str, Any]) -> None:
    references = set(_references(document))
    unused = [
        name
        for name in document["components"]["schemas"]
        if f"#/components/schemas/{name}" not in references
    ]
    assert unused == []


def test_every_operation_has_a_summary_and_responses(document: dict[str, Any]) -> None:
    for method, path, operation in operations(document):
        assert operation.get("summary"), f"{method} {path} has no summary"
        responses = operation.get("responses")
        assert isinstance(responses, dict), f"{method} {path} has no responses"
        assert any(code.startswith("2") for code in responses), f"{method} {path}: no 2xx"
        for code, response in responses.items():
            assert response.get("description"), f"{method} {path} {code} has no description"


def test_error_responses_have_the_error_body(document: dict[str, Any]) -> None:
    # Every HTTP error is {"error_code", "message"} as application/vnd.kafka.v2+json
    # (sidecar.http.error_map), or as application/json under /v3/; /readyz's 503 is a
    # readiness answer and has no content.
    for method, path, operation in operations(document):
        for code, response in operation["responses"].items():
            if code[0] not in "45" or "content" not in response:
                continue
            # REST Proxy v3's routes answer errors in v3's shape (sidecar.http.v3_records).
            expected = (
                {V3_ERROR_MEDIA_TYPE: {"schema": V3_ERROR_SCHEMA}}
                if path.startswith("/v3/")
                else {ERROR_MEDIA_TYPE: {"schema": ERROR_SCHEMA}}
            )
            assert response["content"] == expected, f"{method} {path} {code}"


def test_path_parameters_match_the_path_templates(document: dict[str, Any]) -> None:
    for path, item in document["paths"].items():
        in_template = set(re.findall(r"\{([^}/]+)\}", path))
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            parameters = item.get("parameters", []) + operation.get("parameters", [])
            declared = {p["name"] for p in parameters if p["in"] == "path"}
            assert declared == in_template, f"{method.upper()} {path}"
            assert all(p["required"] for p in parameters if p["in"] == "path")


def test_name_schemas_are_the_rules_the_server_applies(document: dict[str, Any]) -> None:
    from sidecar.core import names

    schemas = document["components"]["schemas"]
    for schema, pattern in [
        ("TopicName", names.TOPIC_NAME_PATTERN),
        ("GroupName", names.GROUP_NAME_PATTERN),
        ("InstanceName", names.INSTANCE_NAME_PATTERN),
    ]:
        assert schemas[schema]["pattern"] == f"^{pattern}$"
        assert schemas[schema]["not"] == {"enum": [".", ".."]}
    expected = {"topic": "TopicName", "group": "GroupName", "name": "InstanceName"}
    for path, item in document["paths"].items():
        for parameter in item.get("parameters", []):
            if parameter["in"] == "path" and parameter["name"] in expected:
                reference = f"#/components/schemas/{expected[parameter['name']]}"
                assert parameter["schema"] == {"$ref": reference}, path


def test_every_operation_with_a_name_in_its_path_documents_the_400(
    document: dict[str, Any],
) -> None:
    for method, path, operation in operations(document):
        if re.search(r"\{(topic|group|name)\}", path):
            assert "40003" in operation["responses"]["400"]["description"], (method, path)


def test_links_name_existing_operations_and_fill_their_path_parameters(
    document: dict[str, Any],
) -> None:
    by_id = {
        operation["operationId"]: (path, operation) for _, path, operation in operations(document)
    }
    assert len(by_id) == len(list(operations(document))), "operationIds must be unique"
    links = [
        (method, path, name, link)
        for method, path, operation in operations(document)
        for response in operation["responses"].values()
        for name, link in response.get("links", {}).items()
    ]
    assert {link["operationId"] for *_, link in links} >= {
        "subscribe",
        "poll",
        "commitOffsets",
        "deleteConsumer",
    }
    for method, path, name, link in links:
        target_path, _ = by_id[link["operationId"]]
        wanted = set(re.findall(r"\{([^}/]+)\}", target_path))
        assert set(link["parameters"]) == wanted, (method, path, name)
        for expression in link["parameters"].values():
            assert expression.startswith(("$request.path.", "$response.body#/"))
            if expression.startswith("$request.path."):
                assert "{" + expression.removeprefix("$request.path.") + "}" in path
