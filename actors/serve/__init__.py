"""Running the service: ``sessionray serve`` (:mod:`~actors.serve.main`: pre-flight, local Ray,
runtime, ingress under uvicorn), its readiness gate (:mod:`~actors.serve.gate`), graceful
shutdown (:mod:`~actors.serve.shutdown`), start-up banner (:mod:`~actors.serve.banner`), the
checks run before Ray starts and ``sessionray check`` (:mod:`~actors.serve.preflight`), and the
same ingress as a Ray Serve deployment for KubeRay (:mod:`~actors.serve.app`,
``actors.serve.app:app``). It assembles every wing below it and is imported only by
:mod:`actors.cli`. Nothing is re-exported here (import the module you need).
"""

__all__ = ["banner"]
"""The modules other wings import."""
