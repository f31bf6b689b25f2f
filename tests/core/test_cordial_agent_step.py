"""One agent's step of Algorithm 1 from what it holds (its M_i, Λ^i, own inputs and labels,
and the peers' embedded outputs) is row i of the whole fleet's step: what lets a daemon run
the paper's update with the other agents remote."""

from __future__ import annotations

import torch

from peerd.core import cordial as cl
from peerd.learn.linearproblem import make_problem


def test_an_agents_step_is_its_row_of_the_fleet_step() -> None:
    prob = make_problem(4, "gaussian", 1, seed=5)
    gen = torch.Generator().manual_seed(1)
    x = prob.sample(20, gen)
    x0, x1 = x[:, :10], x[:, 10:]
    y0 = prob.labels(x0)
    steps = cl.StepSizes()
    m, lam = prob.m0 * 3.0, prob.lam0  # a large M, so that the projection of Λ acts too
    for t in (0, 7):
        m_all, lam_all = cl.cordial_step(m, lam, x0, y0, x1, t, steps)
        e0, e1 = cl.embedded(m, x0)[0], cl.embedded(m, x1)[0]
        for i in range(4):
            noise = e0.clone()
            noise[:, i] = 123.0  # the own slot is recomputed from M_i, never read
            m_i, lam_i = cl.agent_step(m[0, i], lam[0, i], i, noise, x0[0, :, i], y0[0, :, i],
                                       e1, x1[0, :, i], t, steps)
            torch.testing.assert_close(m_i, m_all[0, i])
            torch.testing.assert_close(lam_i, lam_all[0, i])
            assert float(lam_i[i].abs().max()) == float(lam[0, i, i].abs().max())  # own: kept


def test_a_missing_peer_is_a_zero_input_not_an_error() -> None:
    prob = make_problem(3, "gaussian", 1, seed=2)
    x = prob.sample(8, torch.Generator().manual_seed(0))
    x0, x1, y0 = x[:, :4], x[:, 4:], prob.labels(x[:, :4])
    e0, e1 = cl.embedded(prob.m0, x0)[0], cl.embedded(prob.m0, x1)[0]
    e0[:, 2], e1[:, 2] = 0.0, 0.0  # agent 2 sent nothing
    m_i, lam_i = cl.agent_step(prob.m0[0, 0], prob.lam0[0, 0], 0, e0, x0[0, :, 0],
                               y0[0, :, 0], e1, x1[0, :, 0], 0, cl.StepSizes())
    assert bool(torch.isfinite(m_i).all())
    assert bool(torch.isfinite(lam_i).all())
    # No output from agent 2: its coordination layer gets no gradient.
    torch.testing.assert_close(lam_i[2], prob.lam0[0, 0, 2])
    assert not torch.equal(lam_i[1], prob.lam0[0, 0, 1])
