"""What a training tells while it runs, from site 0's process: each round's record to the callbacks, a warning
naming an outlying site (federated/health.py), and the rounds' progress bar where the config asks for one."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from federated.config import TrainConfig
from federated.health import warn_outliers
from federated.schema import RoundRecord

RoundCallback = Callable[[RoundRecord], None]  # federated/schema.py


class RoundReport:
    """Reports the rounds ``start_round``.. of a training; a context manager that closes the progress bar. Only
    the ``leader`` (the process of site 0) reports: every other process holds the same records."""

    def __init__(self, config: TrainConfig, start_round: int, leader: bool, callbacks: Sequence[RoundCallback]):
        self.leader = leader
        self.callbacks = callbacks
        self.bar = None
        if config.progress and leader:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=config.rounds, initial=start_round, desc=f"{config.algorithm} rounds", unit="round")

    def __enter__(self) -> RoundReport:
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()

    def __call__(self, record: RoundRecord) -> None:
        if self.leader:
            warn_outliers(record)
            for callback in self.callbacks:
                callback(record)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{record['train_loss']:.4f}")
            self.bar.update(1)
