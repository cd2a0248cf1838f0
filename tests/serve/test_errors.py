"""Every error code of the server, against a small pipeline in each placement.

``fragile`` fails the input ``boom``; ``slow`` blocks on the input ``block``
until its request is aborted. ``max_in_flight=1`` makes the second request a 429.
"""

from __future__ import annotations

import functools

import attrs
import httpx
import trio

import omni_trio as ot
from tests.placement import build, stage

CHAT = "/v1/chat/completions"


def _config(placement: str) -> ot.PipelineConfig:
    return build(
        placement,
        stage("fragile", "create_fail_on", factory={"word": "boom"}, next="slow"),
        stage("slow", "create_block_until_aborted", terminal=True),
        max_in_flight=1,
        serve=ot.ServeConfig(model="toy", adapter="tests.serve.adapters.TrailAdapter", max_body_bytes=4096),
    )


def _chat(text: str, **extra: object) -> dict[str, object]:
    return {"model": "toy", "messages": [{"role": "user", "content": text}], **extra}


def _metric(text: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


async def _expect(client: httpx.AsyncClient, status: int, body: object, *, param: str | None = None,
                  content: bytes | None = None) -> httpx.Response:
    if content is not None:
        response = await client.post(CHAT, content=content, headers={"content-type": "application/json"})
    else:
        response = await client.post(CHAT, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    return response


async def test_every_error_code(placement: str) -> None:
    config = _config(placement)
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline, trio.open_nursery() as nursery:
            address = await nursery.start(ot.serve_http, pipeline, config, "127.0.0.1", 0)
            async with httpx.AsyncClient(base_url=address.url) as client:
                ok = await client.post(CHAT, json=_chat("hi"))
                assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "slow"

                await _expect(client, 400, None, content=b'{"model": ')
                missing = await _expect(client, 400, {"model": "toy"}, param="messages")
                assert "messages" in missing.json()["error"]["message"]
                await _expect(client, 400, _chat("hi", stream="yes"), param="stream")
                # Python's JSON reader takes NaN and Infinity, which JSON itself has not: no deadline of them.
                nan_deadline = b'{"model": "toy", "messages": [{"role": "user", "content": "hi"}], "deadline": NaN}'
                await _expect(client, 400, None, param="deadline", content=nan_deadline)
                await _expect(client, 404, {**_chat("hi"), "model": "gpt-4"}, param="model")
                await _expect(client, 413, _chat("x" * 5000))
                assert (await client.get("/v1/nowhere")).json()["error"]["code"] == "not_found"

                failed = await _expect(client, 500, _chat("boom"))
                assert "'fragile'" in failed.json()["error"]["message"]
                assert "cannot handle 'boom'" in failed.json()["error"]["message"]
                assert (await client.post(CHAT, json=_chat("again"))).status_code == 200  # still serving

                timed_out = await _expect(client, 504, _chat("block", deadline=0.2))
                assert timed_out.json()["error"]["code"] == "deadline_exceeded"

                # One request held in the slow stage fills max_in_flight: the next is refused at once.
                async with trio.open_nursery() as holder:
                    holder.start_soon(lambda: client.post(CHAT, json=_chat("block", stream=True), timeout=None))
                    with trio.fail_after(10):
                        while (await pipeline.stats()).live_requests == 0:
                            await trio.sleep(0.01)
                    full = await _expect(client, 429, _chat("hi"))
                    assert full.headers["retry-after"] == "1"
                    holder.cancel_scope.cancel()  # the held client hangs up
                # ... which aborted its request in every stage.
                with trio.fail_after(10):
                    while not (await pipeline.stats()).idle or _metric(
                        (await client.get("/metrics")).text, "omni_trio_requests_in_flight"
                    ):
                        await trio.sleep(0.01)

                metrics = (await client.get("/metrics")).text
                for outcome, count in [("ok", 2), ("bad_request", 4), ("not_found", 1), ("too_large", 1),
                                       ("failed", 1), ("timeout", 1), ("queue_full", 1), ("disconnected", 1)]:
                    assert _metric(metrics, f'omni_trio_requests_total{{outcome="{outcome}"}}') == count, outcome
                assert _metric(metrics, "omni_trio_requests_in_flight") == 0
            nursery.cancel_scope.cancel()


async def test_shutdown_lets_requests_finish_within_the_grace_period_then_aborts_them(placement: str) -> None:
    config = attrs.evolve(_config(placement), max_in_flight=None,
                          serve=ot.ServeConfig(model="toy", adapter="tests.serve.adapters.TrailAdapter",
                                               grace_period_s=0.5))
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            shutdown = trio.Event()
            async with trio.open_nursery() as nursery:
                address = await nursery.start(functools.partial(ot.serve_http, pipeline, config, "127.0.0.1", 0,
                                                                shutdown=shutdown))
                outcomes: list[str] = []

                async def held() -> None:
                    async with httpx.AsyncClient(base_url=address.url, timeout=None) as client:
                        try:
                            await client.post(CHAT, json=_chat("block", stream=True))
                            outcomes.append("answered")
                        except httpx.HTTPError:
                            outcomes.append("cut off")

                nursery.start_soon(held)
                with trio.fail_after(10):
                    while (await pipeline.stats()).live_requests == 0:
                        await trio.sleep(0.01)
                shutdown.set()  # serve returns once the grace period is over
            assert outcomes == ["cut off"]
            assert (await pipeline.stats()).idle


async def test_a_client_leaving_mid_stream_aborts_its_request_everywhere(placement: str) -> None:
    config = build(placement, stage("streamer", "create_stream_then_wait", terminal=True),
                   serve=ot.ServeConfig(model="toy", adapter="tests.serve.adapters.TrailAdapter"))
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline, trio.open_nursery() as nursery:
            address = await nursery.start(ot.serve_http, pipeline, config, "127.0.0.1", 0)
            async with httpx.AsyncClient(base_url=address.url, timeout=None) as client:
                async with client.stream("POST", CHAT, json=_chat("hi", stream=True)) as response:
                    lines = response.aiter_lines()
                    while '"content":"first"' not in await anext(lines):
                        pass
                    # The answer is streaming, and the request can only end by an abort.
                    assert (await pipeline.stats()).live_requests == 1
                with trio.fail_after(10):
                    while not (await pipeline.stats()).idle or _metric(
                        (await client.get("/metrics")).text, 'omni_trio_requests_total{outcome="disconnected"}'
                    ) != 1:
                        await trio.sleep(0.01)
            nursery.cancel_scope.cancel()


async def test_json_nested_too_deeply_is_a_400_on_every_endpoint_and_is_counted() -> None:
    # 2,000 levels make Python's JSON reader raise RecursionError; 65 parse but are past MAX_DEPTH.
    config = _config("embedded")
    deep = b'{"model": "toy", "messages": ' + b"[" * 2000 + b"]" * 2000 + b"}"
    just_too_deep = b'{"model": "toy", "x": ' + b"[" * 64 + b"]" * 64 + b"}"
    assert len(deep) < 4096
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline, trio.open_nursery() as nursery:
            address = await nursery.start(ot.serve_http, pipeline, config, "127.0.0.1", 0)
            async with httpx.AsyncClient(base_url=address.url) as client:
                for path in (CHAT, "/v1/audio/speech"):
                    for body in (deep, just_too_deep):
                        response = await client.post(path, content=body, headers={"content-type": "application/json"})
                        assert response.status_code == 400, response.text
                        error = response.json()["error"]
                        assert error["type"] == "invalid_request_error" and error["param"] is None
                        assert "nested deeper than 64 levels" in error["message"]
                assert (await client.post(CHAT, json=_chat("still serving"))).status_code == 200
                metrics = (await client.get("/metrics")).text
                assert _metric(metrics, 'omni_trio_requests_total{outcome="bad_request"}') == 4
                assert _metric(metrics, "omni_trio_requests_in_flight") == 0
            nursery.cancel_scope.cancel()
