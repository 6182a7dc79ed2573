"""Pure scheduling decisions: queue + inventory -> placements. No HTTP, SQL or torch."""

from air_sdk.scheduler.gang import (
    JobRequest,
    NodeSpec,
    fits_ever,
    free_capacity,
    place,
    schedule_fifo,
)

__all__ = ["JobRequest", "NodeSpec", "fits_ever", "free_capacity", "place", "schedule_fifo"]
