"""Property-based fuzzing of the gateway's OpenAPI schema (schemathesis + hypothesis):
whatever a caller sends, the gateway never answers 500 and every answer (status,
content type, body) is one its schema declares. In process over ASGI, as the system
admin (every route reachable), a bounded number of examples per operation."""

from __future__ import annotations

import pytest
from gatewaytest import BASE_URL, tenancy_for

schemathesis = pytest.importorskip("schemathesis")

import hypothesis  # noqa: E402  (schemathesis brings it)
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.generation import GenerationMode  # noqa: E402

#: examples per operation and mode: ~25 routes x 2 x 25 stays well under a minute here
MAX_EXAMPLES = 25
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def test_the_gateway_answers_every_request_within_its_schema(tmp_path):
    tenancy = tenancy_for(tmp_path)
    tenancy.submit("owner")  # something to find, besides all the ids that are not there
    headers = {"Authorization": f"Bearer {tenancy.tokens['sysadmin']}", "Host": "127.0.0.1"}
    schema = schemathesis.openapi.from_asgi("/v1/openapi.json", tenancy.app, headers=headers)
    auth = {"Authorization": headers["Authorization"]}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            @hypothesis.settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                suppress_health_check=list(hypothesis.HealthCheck),
                derandomize=True,
                database=None,
            )
            def fuzz(case) -> None:
                case.call_and_validate(base_url=BASE_URL, headers=auth, checks=CHECKS)

            try:
                fuzz()
            except Unsatisfiable:
                continue  # e.g. no invalid value exists for a parameterless route
            except BaseException as exc:
                exc.add_note(f"while fuzzing {operation.label} ({mode.value} data)")
                raise
