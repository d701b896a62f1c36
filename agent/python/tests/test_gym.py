"""The gym-style environment."""

from __future__ import annotations

import pytest

from mpib_agent.gym import SplitEnv, action_sup_bw


def test_env_basics() -> None:
    with SplitEnv("fail", interval=0.5, seed=1) as env:
        obs, info = env.reset()
        assert set(obs) == {"sout_mbps", "sup_mbps", "sup_bw", "sout_state", "sup_state", "t", "sout_completed_mbps",
                            "sup_completed_mbps", "sout_latency_us", "sup_latency_us", "applied_sup_bw"}
        assert obs["t"] == 0.5 and obs["sout_mbps"] == 0 and obs["sup_mbps"] > 0  # vanilla intra-island: all SUP
        assert info["optimum_sup_bw"] == 683 and info["optimum_mbps"] == pytest.approx(300_000, rel=0.05)
        obs, reward, terminated, truncated, info = env.step(683)
        assert obs["sup_bw"] == 683 and reward == pytest.approx(1.0, abs=0.03)
        assert obs["sup_mbps"] / obs["sout_mbps"] == pytest.approx(683 / 341, rel=0.02)
        assert info["achieved_mbps"] == pytest.approx(obs["sout_mbps"] + obs["sup_mbps"], rel=0.01)
        assert obs["sup_completed_mbps"] == pytest.approx(obs["sup_mbps"], rel=0.01) and obs["applied_sup_bw"] == 683
        assert obs["sout_latency_us"] > 0 and obs["sup_latency_us"] > 0  # both parts of a 3 MiB message take ~80 us
        assert not terminated and not truncated
        _, r_half, *_ = env.step(0.5)  # a float is the SUP share
        assert r_half < 0.8
        _, r0, *_ = env.step(0)
        assert r0 == pytest.approx(1 / 3, abs=0.03)
        n = 3
        while not truncated:
            _, _, _, truncated, _ = env.step(683)
            n += 1
        assert n == env.max_steps == 150  # 75 s / 0.5 s


def test_env_failover_and_seed() -> None:
    env = SplitEnv("fail", interval=1.0, seed=7, max_steps=35)
    obs, _ = env.reset()
    rewards = []
    for _ in range(31):
        obs, r, _, truncated, info = env.step(683)
        rewards.append(r)
    assert obs["sup_state"] == "down" and info["optimum_sup_bw"] == 0
    assert obs["sup_mbps"] == 0 and rewards[-1] == pytest.approx(1.0, abs=0.03)  # the plugin failed over
    assert obs["applied_sup_bw"] == 0 and obs["sup_completed_mbps"] == 0 and obs["sup_latency_us"] == 0
    env.close()
    # same seed, same rewards
    a = SplitEnv("equal", seed=3)
    b = SplitEnv("equal")
    a.reset()
    b.reset(seed=3)
    assert [a.step(500)[1] for _ in range(3)] == [b.step(500)[1] for _ in range(3)]
    a.close()
    b.close()


def test_actions() -> None:
    assert action_sup_bw(1) == 1 and action_sup_bw(1.0) == 1024 and action_sup_bw(0.5) == 512
    for bad in (-1, 1025, 1.5, -0.1, True, "3", None):
        with pytest.raises(ValueError):
            action_sup_bw(bad)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        SplitEnv().step(3)
