"""The submit decisions: is a JobSpec acceptable (its code is there, it could ever fit
this cluster, its model fits its accelerators), and is it new or a repeat of an
Idempotency-Key. Each refusal is an `AirError` whose message says what to change.

Example:
    >>> job, created = submit_job(ctx, principal, body, "application/json", None)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from air_sdk.errors import ApiError, IdempotencyError, SpecError
from air_sdk.gateway.bodies import parse_model
from air_sdk.planner.refusal import submit_refusal
from air_sdk.runner import job_paths
from air_sdk.runner.machine import never_fits
from air_sdk.runner.service import spec_request
from air_sdk.schema import JobRecord, JobSpec
from air_sdk.schema.names import IDEMPOTENCY_KEY, is_valid
from air_sdk.store import IdempotencyConflict

if TYPE_CHECKING:
    from air_sdk.gateway.app import GatewayContext, Principal

__all__ = ["check_idempotency_key", "refusal", "submit_job"]


def check_idempotency_key(key: str | None) -> None:
    """An `ApiError` (400) for a key that cannot be one.

    Example:
        >>> check_idempotency_key("7f1c-retry-1")
    """
    if key is not None and not is_valid(IDEMPOTENCY_KEY, key):
        raise ApiError(
            400, "Idempotency-Key must be 1-200 printable ASCII characters (a uuid4 is fine)"
        )


def refusal(ctx: GatewayContext, tenant: str, spec: JobSpec) -> str | None:
    """Why `spec` cannot run here at all, or None: its code is missing, no placement
    could ever hold it, its model would not fit its accelerators, it asks for more
    memory, processes or disk than the operator's caps (`air gateway start
    --max-job-memory` ...), or it names a directory outside the roots the operator lets
    jobs write (checked again at launch)."""
    if spec.entrypoint is not None and spec.bundle_sha256 is None:
        return "an entrypoint job needs its code: upload a bundle and set bundle_sha256"
    if spec.bundle_sha256 and ctx.store.get_bundle(tenant, spec.bundle_sha256) is None:
        return f"bundle {spec.bundle_sha256} was not uploaded: PUT it to /v1/bundles first"
    inventory = ctx.runner.backend.inventory()
    # the runner's own check: a job refused here would fail there, with this sentence
    never = never_fits(spec_request("new", spec), inventory)
    if never is not None:
        return never
    too_big = submit_refusal(spec, [n.accelerator for n in inventory if n.num_gpus])
    if too_big is not None:
        return too_big
    over_cap = spec.limits.over(ctx.runner.limit_caps)
    if over_cap is not None:
        return over_cap
    if spec.export:
        if ctx.exports is None:
            return "this gateway exports to no tracker: submit without --export"
        why = ctx.exports.refusal(spec)
        if why is not None:
            return why
    return job_paths.submit_refusal(spec, ctx.runner.backend, tenant)


def submit_job(
    ctx: GatewayContext,
    principal: Principal,
    body: bytes,
    content_type: str | None,
    idempotency_key: str | None,
) -> tuple[JobRecord, bool]:
    """Parse and accept the JobSpec in `body` for `principal`'s tenant: (the job, whether it is new;
    a repeated key with the same spec returns the first job). A `SpecError` (400) when
    `refusal` says why not, an `IdempotencyError` (422) for a key used with another
    spec. Blocking (parsing, SQL): call it from a worker thread."""
    check_idempotency_key(idempotency_key)
    from air_sdk.gateway.tenancy import check_submit

    tenant = principal.tenant
    spec = parse_model(JobSpec, body, content_type)
    why = refusal(ctx, tenant, spec)
    if why is not None:
        raise SpecError(why)
    check_submit(ctx, principal, spec)  # what this tenant may ask for: priority, grace, queue
    try:
        job, created = ctx.store.create_job(spec, tenant=tenant, idempotency_key=idempotency_key)
    except IdempotencyConflict as exc:
        raise IdempotencyError(
            422, "this Idempotency-Key was used with a different job spec: use a new key"
        ) from exc
    if created:
        ctx.runner.wake()
        if spec.export and ctx.exports is not None:
            ctx.exports.watch(job.id)
    return job, created
