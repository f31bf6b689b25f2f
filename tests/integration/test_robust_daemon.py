"""Real daemons blending with a robust rule: the daemon's block-wise path runs end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.mesh import Node, cached_origins, make_fleet, start, status, wait_for


@pytest.mark.parametrize(("blend", "port"), [("median", 27610), ("krum:0", 27620)])
def test_three_daemons_blend_with_a_robust_rule_and_keep_training(
    tmp_path: Path, running: list[Node], blend: str, port: int
) -> None:
    nodes = make_fleet(tmp_path, 3, base_port=port, learning={"blend": blend})
    start(nodes, running)
    for me in nodes:
        others = {n.id for n in nodes if n is not me}
        wait_for(lambda me=me, others=others: others <= cached_origins(me), 120,  # type: ignore[misc]
                 "every daemon to cache both others", nodes)
    # A few rounds with both peers cached: each blends three models under the rule. (Before
    # that, krum:0 rightly refuses a round of two models, n <= 2f + 2, and logs it.)
    def rounds_later(k: int) -> None:  # a round that began before the wait may plan with two
        target = {n.id: status(n)["node"]["round"] + k for n in nodes}
        for n in nodes:
            wait_for(lambda n=n: status(n)["node"]["round"] >= target[n.id],  # type: ignore[misc]
                     60, f"{k} more rounds", nodes)

    rounds_later(2)
    logged = {n.id: len(n.logs()) for n in nodes}
    rounds_later(3)
    for n in nodes:
        s = status(n)
        assert s["node"]["val_accuracy"] is not None
        assert "round failed" not in n.logs()
        assert "blended nothing" not in n.logs()[logged[n.id]:]
