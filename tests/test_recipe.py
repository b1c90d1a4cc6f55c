"""The BCE warm-up option (TrainConfig.warmup_rounds, docs/algorithms.md section 12): FedAvg rounds first,
then the algorithm from the warmed model, numbered as one run; refused where it would be skipped."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from federated import TensorSite, TrainConfig, train
from federated.engine import Engine
from federated.schema import TIMING_KEYS


def _sites():
    rng = np.random.default_rng(0)
    return [TensorSite(name=f"s{k}", train=(rng.standard_normal((64, 6)).astype(np.float32),
                                            (rng.random((64, 1)) < 0.3).astype(np.float32)),
                       test=(rng.standard_normal((40, 6)).astype(np.float32),
                             (rng.random((40, 1)) < 0.3).astype(np.float32))) for k in range(2)]


def _config(**kw):
    base = dict(algorithm="codaplus", params={"T0": 4}, sites=_sites(), network="mlp", network_kwargs={"hidden": 8},
                rounds=5, local_steps=2, lr=0.1, loader_workers=0, progress=False, eval_every=1)
    return TrainConfig(**(base | kw))


def test_warmup_is_fedavg_then_the_algorithm_from_the_warmed_model():
    result = train(_config(warmup_rounds=2))
    warm = train(_config(algorithm="fedavg", params={}, rounds=2))
    engine = Engine(_config(rounds=3), initial_state=warm.global_state)
    # CODA+ snapshots its starting point as v_ref: it must be the warmed model, not the seed's initialisation.
    ref = engine.sites[0].state["ref.w.1.weight"]
    assert torch.equal(ref, warm.global_state["1.weight"])
    rest = engine.run()
    engine.close()
    for name, value in rest.global_state.items():
        assert torch.equal(result.global_state[name], value), name
    assert [h["round"] for h in result.history] == [0, 1, 2, 3, 4]
    assert [h["iteration"] for h in result.history] == [2, 4, 6, 8, 10]
    untimed = [[{k: v for k, v in h.items() if k not in TIMING_KEYS} for h in hs]
               for hs in (result.history[:2], warm.history)]
    assert untimed[0] == untimed[1]
    assert result.config.warmup_rounds == 2 and result.config.rounds == 5
    # Without the warm-up the same config trains something else.
    plain = train(_config())
    assert not torch.equal(plain.global_state["1.weight"], result.global_state["1.weight"])


def test_warmup_callbacks_see_the_numbering_of_the_whole_run():
    seen = []
    train(_config(warmup_rounds=1, rounds=3), callbacks=[lambda record: seen.append(record["iteration"])])
    assert seen == [2, 4, 6]


@pytest.mark.parametrize("kw", [dict(warmup_rounds=5), dict(warmup_rounds=1, checkpoint_dir="ckpt")])
def test_warmup_is_refused_where_it_cannot_run(kw):
    with pytest.raises(ValueError, match="warmup_rounds"):
        _config(**kw)


def test_an_engine_started_directly_refuses_a_warmup_it_would_skip():
    with pytest.raises(ValueError, match=r"run by federated\.train"):
        Engine(_config(warmup_rounds=1))


@pytest.mark.parametrize(("rounds", "I", "params", "want"), [
    (5, 2, {"stages": 2}, 6),           # T = 10: T0 rounded up to a multiple of I, one boundary
    (8, 2, {"stages": 2}, 8),           # T = 16: the halves
    (8, 2, {"stages": 4}, 4),
    (3, 4, {"stages": 5}, 4),           # fewer rounds than stages: a stage per round
    (8, 2, {"stages": 1}, None),        # one stage, constant lr
    (8, 2, {"stages": 2, "T0": 2}, 2),  # an explicit T0 wins
])
def test_the_stage_length_derives_from_the_runs_length(rounds, I, params, want):
    engine = Engine(_config(params=params, rounds=rounds, local_steps=I))
    assert engine.algorithm.stage_length == want


def test_a_derived_stage_divides_the_lr_once_within_the_run():
    engine = Engine(_config(params={"stages": 2, "lr_decay": 10.0}, rounds=5, local_steps=2, eval_every=0))
    engine.run()
    assert engine.algorithm.stage_lr(engine.sites[0]) == pytest.approx(0.1 / 10)


def test_a_derived_stage_trains_as_the_same_t0_given_explicitly():
    """The lr decay and the restart both follow the derived T0 (T = 10, I = 2: T0 = 6), not only one of them."""
    derived, explicit, one = (train(_config(params=params, rounds=5, local_steps=2, eval_every=0))
                              for params in ({"stages": 2}, {"T0": 6}, {"stages": 1}))
    for name, value in explicit.global_state.items():
        torch.testing.assert_close(derived.global_state[name], value)
    assert any(not torch.equal(one.global_state[n], v) for n, v in explicit.global_state.items())


@pytest.mark.parametrize("algorithm", ["codaplus", "codasca", "coda"])
def test_the_auc_m_family_trains_libaucs_stagewise_recipe_by_default(algorithm):
    """Two stages of T/2, lr / 10 at the boundary, weight decay 1e-4, the iterate carrying on (docs/claims.md
    "Stagewise defaults")."""
    engine = Engine(_config(algorithm=algorithm, params={}, rounds=8, local_steps=2))
    assert engine.algorithm.stage_length == 8
    p = engine.algorithm.p
    assert (p.lr_decay, p.weight_decay, p.stage_restart) == (10.0, 1e-4, False)
    assert engine.algorithm.stage_lr(engine.sites[0]) == pytest.approx(engine.config.lr)
    engine.sites[0].iteration = 8
    assert engine.algorithm.stage_lr(engine.sites[0]) == pytest.approx(engine.config.lr / 10)


def test_coda_refuses_a_single_stage():
    with pytest.raises(ValueError, match="stages >= 2"):
        train(_config(algorithm="coda", params={"stages": 1}))
