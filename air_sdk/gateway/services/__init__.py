"""The gateway's work behind its routes: bundles, submit decisions, worker reports and
output serving (STYLE.md, "Thin routes").

A route parses HTTP, calls one function here and returns what it gives. A service
knows no HTTP: it raises `air_sdk.errors` classes (an `ApiError` with the status to
answer, a `SpecError`, a `BundleError`, ...), and `air_sdk.gateway.translate` turns
every `AirError` into the answer's status and `{"detail": ...}` body in one place.

    bundles.py   PUT /v1/bundles/{sha256}: hash, size cap, trial unpack, store
    submit.py    POST /v1/jobs: spec checks, fit, idempotency
    reports.py   worker reports: fencing, scrubbing secrets, storing
    outputs.py   a job's output directory: which one is served, listing, files by fd
"""
