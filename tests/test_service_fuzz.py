"""Property-based fuzzing of every endpoint from the service's OpenAPI schema
(schemathesis 4 strategies driven by hypothesis) against a real uvicorn
server with real LMDB state: no schema-valid input may produce a 5xx, every
answer to one must match the documented schema, and every schema-invalid
input is refused with a 4xx and a message.

(schemathesis's own pytest-fixture loader does not run under pytest 9, so the
schema is loaded from the app object itself and each operation's strategy is
driven by ``@given`` directly.)"""
from __future__ import annotations

import os
import tempfile

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from kvtier.tiering.service.app import create_app
from kvtier.tiering.service.server import ServiceServer
from kvtier.tiering.service.app import ServiceConfig

TOKEN = "fuzz-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

# The schema is a pure function of the app's routes: build it without serving.
_SCHEMA = schemathesis.openapi.from_dict(
    create_app(ServiceConfig.make(tempfile.gettempdir(), token=TOKEN)).openapi())
_OPS = {op.label: op for op in (r.ok() for r in _SCHEMA.get_all_operations())}
# Bounded so the suite stays fast; KVTIER_FUZZ_EXAMPLES=200 for a deeper run.
FUZZ = settings(max_examples=int(os.environ.get("KVTIER_FUZZ_EXAMPLES", "15")), deadline=None, database=None,
                derandomize=True, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def live_url(tmp_path_factory):
    cfg = ServiceConfig.make(tmp_path_factory.mktemp("fuzz") / "data", token=TOKEN)
    with ServiceServer(create_app(cfg), token=TOKEN) as srv:
        yield srv.url


def test_every_route_is_fuzzed():
    # The fuzzing below covers the whole DESIGN.md surface.
    for label in ("POST /v1/tools/{tool}/observations", "GET /v1/tools/{tool}/forecast", "POST /v1/decisions",
                  "POST /v1/trajectories/{trajectory_id}/pause", "POST /v1/trajectories/{trajectory_id}/resume",
                  "POST /v1/trajectories/{trajectory_id}/lease",
                  "GET /v1/stats", "GET /metrics", "GET /healthz"):
        assert label in _OPS, label


@pytest.mark.parametrize("label", sorted(_OPS))
def test_schema_valid_requests_never_5xx_and_match_schema(live_url, label):
    op = _OPS[label]

    @FUZZ
    @given(case=op.as_strategy(GenerationMode.POSITIVE))
    def run(case):
        r = case.call(base_url=live_url, headers=AUTH)
        assert r.status_code < 500, f"{case.method} {case.formatted_path}: {r.status_code} {r.text}"
        if r.status_code < 300:
            case.validate_response(r, checks=[schemathesis.checks.response_schema_conformance])

    run()


@pytest.mark.parametrize("label", sorted(k for k, op in _OPS.items()
                                          if op.path_parameters or op.body or op.query))
def test_schema_invalid_requests_are_4xx(live_url, label):
    op = _OPS[label]

    @FUZZ
    @given(case=op.as_strategy(GenerationMode.NEGATIVE))
    def run(case):
        # a case whose invalid part is the Authorization header keeps it (ours would repair it)
        own_auth = any(k.lower() == "authorization" for k in (case.headers or {}))
        r = case.call(base_url=live_url, headers=None if own_auth else AUTH)
        # refused as the client's fault: a 2xx (accepted invalid input) or a 5xx fails
        assert 400 <= r.status_code < 500, f"{case.method} {case.formatted_path}: {r.status_code} {r.text}"
        assert isinstance(r.json().get("detail"), (str, list)), r.text   # with a message

    run()
