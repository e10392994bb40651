"""The delivery stand-in of the Ray-free session tests: a ``deliver(job)`` callable that keeps every
:class:`~runtime.delivery.job.DeliveryJob` a :class:`~runtime.session.core.SessionCore` hands over."""

from __future__ import annotations

from runtime.delivery.job import DeliveryJob


class Recorder:
    """Keeps the jobs it is called with, in order (:attr:`jobs`)."""

    def __init__(self) -> None:
        self.jobs: list[DeliveryJob] = []

    async def __call__(self, job: DeliveryJob) -> None:
        self.jobs.append(job)

    def texts(self) -> list[str]:
        """Each job's reply as plain text (``Reply.preview_text``), in order."""
        return [j.reply.preview_text() for j in self.jobs]
