"""`GET /v1/protocol` publishes the heartbeat interval of the host's streams.

A client's stream reads must outlast the silence between two heartbeats (`runs.heartbeatS`),
which the protocol document did not say: a client made with a shorter `timeout` had its
streamed ingests and runs cut (a black-box test). The interval is in `limits.heartbeatS`,
with or without a retrieval service, and the OpenAPI document declares it.
"""

from __future__ import annotations

import httpx
import pytest

from retrieval_host.http.app import create_app
from retrieval_host_client.models import ProtocolInfo
from tests.support.host import World

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("with_driver", [True, False], ids=["retrieval", "discovery-only"])
async def test_the_protocol_document_publishes_the_heartbeat_interval(
    http_world: World, with_driver: bool
) -> None:
    settings = http_world.settings(runs={"heartbeatS": 42.5})
    app = create_app(settings, http_world.driver if with_driver else None)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="https://host.test"
    ) as client:
        protocol = await client.get("/v1/protocol")
        openapi = await client.get("/v1/openapi.json")
    assert protocol.status_code == 200
    assert protocol.json()["limits"]["heartbeatS"] == 42.5
    assert ProtocolInfo.model_validate(protocol.json()).limits.heartbeat_s == 42.5
    limits = openapi.json()["components"]["schemas"]["ProtocolLimits"]
    assert "heartbeatS" in limits["properties"]
    assert "heartbeatS" not in limits.get("required", [])  # an older host omits it
