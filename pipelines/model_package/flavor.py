"""The registered model in MLflow: a torch.export program (MLflow's ``pytorch`` flavour, pt2) that is also a
pyfunc model taking image files, with its contract (``pipelines.model_package.contract``) beside it.

``log_model`` is what registration calls. The model folder holds MLflow's pytorch flavour unchanged (so
``mlflow.pytorch.load_model`` still gives the network), ``fedauc_contract.json``, and a ``python_function``
flavour whose loader is this module: ``mlflow.pyfunc.load_model(uri).predict(df)`` takes a DataFrame with a
column ``path`` (image files on the scoring machine) or ``bytes`` (each file's bytes, base64) and returns one
row per image: ``p_<disease>`` per output, ``calibrated_<disease>`` (its calibrated probability), ``status`` (scored | refused), ``reason`` and ``ood_distance`` (the
image's distance to the training images, ``federated.ood``; NaN where not measured). ``mlflow models serve
--env-manager local`` serves the same on ``/invocations``. No code travels in the model: the loader is
fedauc's own, installed at the hospital (docs/deploy.md section 1).
"""

from __future__ import annotations

import base64
import binascii
import json
import shutil
import sys
import tempfile
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from mlflow.models import Model, ModelSignature
from mlflow.models.model import MLMODEL_FILE_NAME
from mlflow.types import ColSpec, Schema

from federated.ood import Gaussian
from pipelines.model_package.contract import CONTRACT_FILE, METADATA_KEY, OOD_FILE, ModelContract
from pipelines.model_package.predict import (
    OOD_COLUMN,
    REFUSED,
    Item,
    Scorer,
    calibrated_column,
    probability_column,
    score_items,
)

INPUT_COLUMNS = ("path", "bytes")


def log_model(model, contract: ModelContract, input_example: np.ndarray, pip_requirements: list[str],
              ood: Gaussian | None = None):
    """Log ``model`` with ``contract`` (and the Gaussian of its out-of-distribution refusal) into the active run as
    ``model`` (logged by ``pipelines.registry.log_model``, then registered); MLflow's ModelInfo."""
    if (ood is None) != (contract.ood is None):
        raise ValueError("the contract's out-of-distribution threshold and its Gaussian go together")
    return Model.log(None, name="model", flavor=sys.modules[__name__],
                     metadata={METADATA_KEY: contract.model_dump(mode="json")}, pytorch_model=model,
                     contract=contract, input_example=input_example, pip_requirements=pip_requirements,
                     serialization_format="pt2", ood=ood)


def save_model(path, mlflow_model: Model, pytorch_model, contract: ModelContract, input_example: np.ndarray,
               pip_requirements: list[str], serialization_format: str = "pt2", ood: Gaussian | None = None,
               **_) -> None:
    """MLflow's flavour hook (``Model.log``): the pt2 program, then the contract and the image pyfunc."""
    mlflow.pytorch.save_model(pytorch_model, path, mlflow_model=mlflow_model, input_example=input_example,
                              serialization_format=serialization_format, pip_requirements=pip_requirements)
    # The tensor example and signature describe the pt2 program; the pyfunc takes files, so they go (the
    # example batch stays inside the pt2 file as torch.export's sample input).
    for example in Path(path).glob("*input_example*.json"):
        example.unlink()
    mlflow_model.saved_input_example_info = None
    mlflow_model.signature = signature(contract)
    mlflow_model.flavors[mlflow.pyfunc.FLAVOR_NAME]["loader_module"] = __name__
    (Path(path) / CONTRACT_FILE).write_text(contract.model_dump_json(indent=2))
    if ood is not None:
        np.savez(Path(path) / OOD_FILE, **ood.arrays())
    mlflow_model.save(str(Path(path) / MLMODEL_FILE_NAME))


def signature(contract: ModelContract) -> ModelSignature:
    inputs = Schema([ColSpec("string", column, required=False) for column in INPUT_COLUMNS])
    outputs = Schema([ColSpec("double", probability_column(d)) for d in contract.diseases]
                     + [ColSpec("double", calibrated_column(d)) for d in contract.diseases]
                     + [ColSpec("string", "status"), ColSpec("string", "reason"), ColSpec("double", OOD_COLUMN)])
    return ModelSignature(inputs, outputs)


def read_contract(model_dir: str | Path) -> ModelContract:
    return ModelContract.model_validate(json.loads((Path(model_dir) / CONTRACT_FILE).read_text()))


def load_scorer(model_dir: str | Path, name: str = "", version: str = "") -> Scorer:
    """The model in a downloaded model folder, ready to score."""
    contract = read_contract(model_dir)
    program = mlflow.pytorch.load_model(str(model_dir), map_location="cpu")
    state = {key: value.detach().clone() for key, value in program.state_dict().items()}
    ood = None
    if contract.ood is not None:
        with np.load(Path(model_dir) / OOD_FILE, allow_pickle=False) as arrays:
            ood = Gaussian.from_arrays(arrays)
    return Scorer.from_state(contract, state, name, version, ood)


class ImagePyfunc:
    """What ``mlflow.pyfunc.load_model`` wraps: ``predict(DataFrame) -> DataFrame`` (module docstring)."""

    def __init__(self, scorer: Scorer):
        self.scorer = scorer

    def predict(self, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        frame = pd.DataFrame(model_input)
        columns = [c for c in INPUT_COLUMNS if c in frame.columns]
        if len(columns) != 1:
            raise mlflow.exceptions.MlflowException.invalid_parameter_value(
                f"give one column, 'path' (image files) or 'bytes' (base64 file bytes); got {list(frame.columns)}")
        if columns == ["path"]:
            rows = list(score_items(self.scorer, (Item(str(p), None) for p in frame["path"]), workers=0))
        else:
            rows = self._score_bytes(frame["bytes"])
        out = pd.DataFrame(rows)
        diseases = self.scorer.contract.diseases
        return out[[probability_column(d) for d in diseases] + [calibrated_column(d) for d in diseases]
                   + ["status", "reason", OOD_COLUMN]]

    def _score_bytes(self, encoded: pd.Series) -> list[dict]:
        # Each file written to a private folder of its own and decoded there with the same guards as any file.
        folder = Path(tempfile.mkdtemp(prefix="fedauc-pyfunc-"))
        try:
            items, bad = [], {}
            for i, text in enumerate(encoded):
                path = folder / f"{i}.bin"
                try:
                    path.write_bytes(base64.b64decode(str(text), validate=True))
                except (binascii.Error, ValueError) as err:
                    bad[i] = str(err)
                    path.write_bytes(b"")
                items.append(Item(str(path), str(folder)))
            rows = list(score_items(self.scorer, items, workers=0))
            for i, detail in bad.items():
                rows[i].update(status=REFUSED, reason="not_base64", detail=f"row {i}: {detail}")
            return rows
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _load_pyfunc(data_path: str, model_config: dict | None = None) -> ImagePyfunc:
    """MLflow's pyfunc loader hook: ``data_path`` is the pytorch flavour's ``data`` folder in the model; the
    flavour's ``model_config`` (its device) does not apply: the model scores on the CPU."""
    return ImagePyfunc(load_scorer(Path(data_path).parent))
