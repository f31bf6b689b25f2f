"""[network] bootstrap's resolver loop (peerd.net.bootstrap): IP entries as they are, DNS
names through the system resolver, a name that does not resolve retried with backoff, and
the bootstrap peers dialled again once the node is cut off."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from peerd.net import bootstrap
from peerd.net.bootstrap import CHECK_INTERVAL_S, keep_bootstrapped, parse, resolve

PEER = "12D3KooWBtg3aaRMjxwedh83aGiUkwSxDwUZkzuJcfaqUmo7R3pq"


def test_an_ip_entry_is_dialled_as_it_is_and_localhost_resolves() -> None:
    async def main() -> tuple[tuple[str, ...], tuple[str, ...]]:
        ip = await resolve(parse(f"/ip4/10.0.0.2/tcp/4011/p2p/{PEER}"))
        name = await resolve(parse(f"/dns4/localhost/tcp/4011/p2p/{PEER}"))
        return ip, name

    ip, name = trio.run(main)
    assert ip == ("/ip4/10.0.0.2/tcp/4011",)
    assert name == ("/ip4/127.0.0.1/tcp/4011",)


def test_a_name_that_does_not_resolve_is_logged_and_retried_with_backoff(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    tries: list[float] = []
    added: list[tuple[str, tuple[str, ...]]] = []

    async def flaky(entry: bootstrap.Entry) -> tuple[str, ...]:
        tries.append(trio.current_time())
        if len(tries) < 3:
            raise OSError("Name or service not known")
        return ("/ip4/10.0.0.7/tcp/4011",)

    monkeypatch.setattr(bootstrap, "resolve", flaky)

    async def main() -> None:
        with trio.move_on_after(120):
            await keep_bootstrapped([f"/dns4/gone.example/tcp/4011/p2p/{PEER}"],
                                    add=lambda p, a: added.append((p, a)),
                                    in_reach=lambda: True, retry=lambda: None,
                                    rng=random.Random(1))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert added == [(PEER, ("/ip4/10.0.0.7/tcp/4011",))]
    assert len(tries) == 3  # resolved once it worked, then left alone while in reach
    assert tries[1] - tries[0] >= 2.5  # backoff_s(1): 5 s with jitter in [0.5, 1]
    assert sum("cannot resolve gone.example" in r.message for r in caplog.records) == 2


def test_once_cut_off_the_names_are_resolved_again_and_retry_is_called_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reach = {"now": True}
    retries: list[float] = []
    resolved: list[float] = []

    async def quick(entry: bootstrap.Entry) -> tuple[str, ...]:
        resolved.append(trio.current_time())
        return ("/ip4/10.0.0.7/tcp/4011",)

    monkeypatch.setattr(bootstrap, "resolve", quick)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: keep_bootstrapped(
                [f"/dns4/b.example/tcp/4011/p2p/{PEER}"], add=lambda p, a: None,
                in_reach=lambda: reach["now"], retry=lambda: retries.append(1),
                rng=random.Random(1)))
            await trio.sleep(CHECK_INTERVAL_S * 3 + 1)
            reach["now"] = False
            await trio.sleep(CHECK_INTERVAL_S * 5)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert retries == [1]  # once when cut off, not every check: the table's backoff runs
    assert len(resolved) == 2  # at start, and again when cut off
