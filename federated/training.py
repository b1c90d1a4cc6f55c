"""``federated.train(config, callbacks) -> TrainResult``: a training in this process, the engine's rounds
(federated/engine.py) after LibAUC's FedAvg warm-up where the config asks for one (``warmup_rounds``)."""

from __future__ import annotations

from collections.abc import Sequence

from federated.config import TrainConfig
from federated.engine import Engine, RoundCallback, TrainResult


def train(config: TrainConfig | dict, callbacks: Sequence[RoundCallback] = ()) -> TrainResult:
    """Run federated training as ``config`` says. ``callbacks`` get each round's record (on site 0's
    process): ``{"round", "iteration", "bytes_sent", "bytes_received", "train_loss", "seconds", "metrics"?,
    "suppressed"?}``; on evaluation rounds (and the last round) ``metrics`` is the flat float dict and
    ``suppressed`` the small-count suppression record of federated/evaluation.py (its docstring names
    the keys). Bytes include the evaluation's exchange. ``lr``, ``site_losses``, ``update_norm``,
    ``update_norm_rel``, ``outliers`` (and ``loss_reference`` once): federated/health.py's ``check``.

    With ``warmup_rounds`` W, rounds 0..W-1 are FedAvg (BCE) and ``algorithm`` runs the remaining rounds
    from the averaged warm model (its own state starts fresh there); the records number rounds and
    iterations across both phases."""
    if not isinstance(config, TrainConfig):
        config = TrainConfig.model_validate(config)
    initial_state, history = None, []
    warm = config.warmup_rounds
    if warm:
        phase = {"warmup_rounds": 0}
        warm_result = _run(config.model_copy(update={**phase, "algorithm": "fedavg", "params": {}, "rounds": warm}),
                           callbacks)
        initial_state, history = warm_result.global_state, warm_result.history
        config = config.model_copy(update={**phase, "rounds": config.rounds - warm})

        def shift(record: dict) -> None:  # runs first, so later callbacks (and the history) see the shifted numbers
            record["round"] += warm
            record["iteration"] += warm * config.local_steps

        callbacks = [shift, *callbacks]
    result = _run(config, callbacks, initial_state)
    if warm:
        result.history[:0] = history
        result.config = result.config.model_copy(update={"rounds": config.rounds + warm, "warmup_rounds": warm})
    return result


def _run(config: TrainConfig, callbacks: Sequence[RoundCallback], initial_state=None) -> TrainResult:
    engine = Engine(config, initial_state=initial_state)
    try:
        return engine.run(callbacks)
    finally:
        engine.close()


