"""Fair share in the API: each tenant's weight and unfinished work (any role), and changing
a weight (operator role). A weight takes effect at the timers' next pass."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from dashboard import models
from dashboard.api import ERRORS, Operator, Read, Viewer
from dashboard.bodies import StrictJsonRoute
from shared.client import Client
from shared.runtime.logs import emit

log = logging.getLogger("tock.dashboard")

router = APIRouter(prefix="/api/tenants", responses=ERRORS, tags=["tenants"],
                   route_class=StrictJsonRoute)


class WeightIn(models.StrictIn):
    tenant: models.Tenant | None = Field(
        description="the tenant; null for the jobs enqueued without one")
    weight: models.TenantWeight | None = Field(
        description="1..1000; null resets to the default of 1")


class WeightOut(BaseModel):
    tenant: str | None
    weight: int


@router.get("", response_model=list[models.TenantOut],
            summary="Tenants with unfinished work or a weight, busiest first")
def list_tenants(who: Viewer, store: Read) -> list[models.TenantOut]:
    return [models.TenantOut.of(t) for t in store.tenant_stats()]


@router.put("/weight", response_model=WeightOut, summary="Set or reset a tenant's weight")
def set_weight(body: WeightIn, who: Operator, request: Request) -> WeightOut:
    client: Client = request.app.state.client
    if body.weight is None:
        client.reset_tenant_weight(body.tenant)
    else:
        client.set_tenant_weight(body.tenant, body.weight)
    weight = body.weight or 1
    emit(log, "tenant_weight_set", tenant=body.tenant, weight=weight, role=who.role)
    return WeightOut(tenant=body.tenant, weight=weight)
