"""The in-process demo mesh: the daemon's round for N nodes, meetings as function calls."""

from __future__ import annotations

from dataclasses import replace

from peerd.mesh.inproc import MeshConfig, RoundReport, run_mesh

SMALL = MeshConfig(nodes=3, rounds=3, local_steps=3, seed=1)


def test_one_report_per_round_with_fresh_versions_and_bounded_caches() -> None:
    reports = list(run_mesh(SMALL))
    assert [r.round for r in reports] == [1, 2, 3]
    for r in reports:
        assert [n.version for n in r.nodes] == [r.round] * 3  # every round publishes
        for n in r.nodes:
            assert len(n.cache) <= SMALL.capacity
            assert n.id not in {origin for origin, _, _ in n.cache}
            assert all(0 <= age <= SMALL.tau_max for _, _, age in n.cache)
        assert len(r.isolated_accuracy) == 3


def test_the_same_config_gives_the_same_numbers() -> None:
    assert list(run_mesh(SMALL)) == list(run_mesh(SMALL))


def test_nodes_that_never_meet_learn_exactly_like_the_isolated_baseline() -> None:
    reports: list[RoundReport] = list(run_mesh(replace(SMALL, meet_probability=0.0)))
    for r in reports:
        assert all(n.cache == () for n in r.nodes)
        assert tuple(n.val_accuracy for n in r.nodes) == r.isolated_accuracy


def test_nodes_that_always_meet_hold_each_other_and_differ_from_the_baseline() -> None:
    last = list(run_mesh(replace(SMALL, meet_probability=1.0)))[-1]
    for n in last.nodes:
        assert {origin for origin, _, _ in n.cache} == {"node0", "node1", "node2"} - {n.id}
        assert all(age == 0 for _, _, age in n.cache)  # met this very round
    assert tuple(n.val_accuracy for n in last.nodes) != last.isolated_accuracy
