"""Federated training: ``federated.train(TrainConfig(...)) -> TrainResult``. See federated/README.md."""

from federated.config import ShardSite, SyntheticSite, TensorSite, TrainConfig
from federated.engine import TrainResult
from federated.registry import algorithm_names, get_algorithm, register
from federated.state import Comm
from federated.training import train

__all__ = ["Comm", "ShardSite", "SyntheticSite", "TensorSite", "TrainConfig", "TrainResult",
           "algorithm_names", "get_algorithm", "register", "train"]
