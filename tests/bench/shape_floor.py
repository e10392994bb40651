"""The floor of the message path's *shape*, measured in the benchmark's own run: what one message
costs with every leg sessionray's path has and none of its work.

The legs (docs/architecture.md, "The path of one message"): the platform's webhook over HTTP into
an ingress in this driver (starlette + uvicorn on uvloop, as ``sessionray serve``), one awaited
plain Ray call to a bare async actor (the session host's place), which calls a second bare async
actor without waiting (the delivery actor's place), which posts the reply over HTTP to the
load process's platform-API stand-in. No SQL, no agent loop, no checks: the p50 of this path, next
to the raw three-hop chain (tests/bench/ray_floor.py), says how much of the chain-relative target
the legs alone use and how many milliseconds are left for the runtime's work.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["shape_p50"]


def _actors(api_base: str) -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class Send:
        def __init__(self) -> None:
            self.http: Any = None

        async def send(self, user: int, text: str) -> None:
            import httpx

            if self.http is None:
                self.http = httpx.AsyncClient()
            body = {"user_id": user, "message": [{"type": "text", "data": {"text": f"re: {text}"}}]}
            await self.http.post(f"{api_base}/send_private_msg", json=body)

    @ray.remote(num_cpus=0)
    class Accept:
        def __init__(self, nxt: Any) -> None:
            self.nxt = nxt

        async def accept(self, user: int, text: str) -> dict[str, str]:
            self.nxt.send.remote(user, text)  # not awaited, as the host's notify of delivery
            return {"status": "accepted"}

    send = Send.remote()  # type: ignore[attr-defined]
    return send, Accept.remote(send)  # type: ignore[attr-defined]


def _app(accept: Any) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def webhook(request: Request) -> JSONResponse:
        event = json.loads(await request.body())
        text = "".join(s["data"].get("text", "") for s in event["message"] if s["type"] == "text")
        return JSONResponse(await accept.accept.remote(int(event["user_id"]), text))

    return Starlette(routes=[Route("/webhooks/onebot11/{bot}", webhook, methods=["POST"])])


def shape_p50(load: Any, base: int, n: int) -> float:
    """p50 in ms of ``n`` messages of one chat (user ``base``) over the bare path (module
    docstring), closed loop, from the load process ``load``
    (:class:`tests.bench.load_client.LoadProcess`) after 20 unmeasured ones. Ray must be
    initialized; the two actors are killed afterwards.

    Raises:
        RuntimeError: the load failed (a reply lost, a webhook not answered 200).
    """
    import ray

    from tests.actors.edge_support import serve_in_thread

    send, accept = _actors(load.api_base)
    try:
        with serve_in_thread(_app(accept), loop="uvloop") as url:
            load.run("closed", url=url, base=base, n=1, per_session=20, tag="shape-w", warm=False)
            res = load.run("closed", url=url, base=base, n=1, per_session=n, tag="shape", warm=False)
        if res["lost"]:
            raise RuntimeError(f"the bare path lost {res['lost']} replies")
        return float(res["p50_ms"])
    finally:
        for actor in (accept, send):
            ray.kill(actor)
