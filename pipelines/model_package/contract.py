"""The model contract: everything needed to score a raw image, stored with the registered model.

A hospital that loads ``models:/fedauc-<task>@champion`` finds in it (``fedauc_contract.json`` in the model's
folder and the same JSON under ``fedauc`` in the MLmodel's metadata) the task, the disease of each output in
order, how a file becomes the network's input (preprocessing's decoder version and limits, tile size,
channels, the modalities and views the task accepts: the settings the shards it was trained on were made
with), the body parts the task is read on, the network and its input shape, the fedauc code version that
trained it, the operating points read from the pooled validation histograms, the out-of-distribution refusal's
threshold (its feature mean and precision in ``fedauc_ood.npz`` beside it), the calibration map and the model's
provenance (its
federation, the number of sites, the training run, whether any site's images were synthetic). docs/deploy.md
section 1 describes each field.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from federated.ood import OodReference
from federated.scoring import ModelToScore
from pipelines.model_package.calibration import Calibration
from pipelines.model_package.thresholds import OperatingPoints
from preprocessing.body_parts import ANATOMIC_REGIONS, BODY_PARTS
from preprocessing.decode import ALLOWED_MODALITIES, DECODER_VERSION, DecodeLimits
from preprocessing.federation import Federation
from preprocessing.records import VIEW_TASKS
from preprocessing.resize import INTERPOLATION, RESIZE_MODE
from preprocessing.tiles import TransformSettings

CONTRACT_FILE = "fedauc_contract.json"
OOD_FILE = "fedauc_ood.npz"
METADATA_KEY = "fedauc"
CONTRACT_FORMAT = 1


class Provenance(BaseModel):
    """What the model was trained on, as the centre knew it when it registered the model."""

    model_config = ConfigDict(extra="forbid")
    federation: str
    sites: int  # how many hospitals trained it
    training_run: str  # the training's MLflow run id
    synthetic_sites: list[str] = Field(default_factory=list)  # the sites whose images were synthetic

    @property
    def synthetic(self) -> bool:
        return bool(self.synthetic_sites)

    def describe(self) -> str:
        data = (f"synthetic images at {len(self.synthetic_sites)} of them ({', '.join(self.synthetic_sites)})"
                if self.synthetic else "no synthetic images")
        return (f"trained by federation {self.federation} of {self.sites} site{'s' * (self.sites != 1)}, "
                f"{data}; MLflow training run {self.training_run}")


class ModelContract(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: int = CONTRACT_FORMAT
    task: str
    diseases: list[str]  # the network's outputs, in order
    network: str
    network_kwargs: dict[str, Any] = Field(default_factory=dict)
    input_shape: tuple[int, ...]  # (channels, height, width) of one image
    # How a file becomes a tile (preprocessing.tiles.TransformSettings): decoded by preprocessing.decode
    # (VOI LUT or window, MONOCHROME1 inverted, 16-bit min-max), resized into a square of image_size with
    # the aspect kept, quantised to uint8; the network sees tile / 255.
    image_size: int
    min_image_size: int
    resize_mode: str = RESIZE_MODE
    interpolation: str = INTERPOLATION
    decoder_version: str = DECODER_VERSION
    decode_limits: DecodeLimits = Field(default_factory=DecodeLimits)
    channels: int
    normalisation: str = "uint8 tile / 255, channels first"
    allowed_modalities: list[str]  # DICOM Modality values accepted; a file without the tag is accepted
    views: list[str]  # DICOM ViewPosition values accepted (chest X-ray); empty: any
    # BodyPartExamined values and Anatomic Region codes accepted; empty: any. A file that names no body part is
    # accepted, as one without a Modality or ViewPosition is. None (a contract written before the gate): the
    # task's gate.
    body_parts: list[str] | None = None
    anatomic_regions: list[str] | None = None
    code_version: str
    operating_points: OperatingPoints | None = None
    provenance: Provenance | None = None  # None: registered before models said what they were trained on
    # The out-of-distribution refusal's threshold (federated/ood.py); its mean and precision are in OOD_FILE beside
    # the contract. None: trained under differential privacy or registered before the refusal: nothing is refused
    # for being unlike the training images.
    ood: OodReference | None = None
    # The map from score to calibrated probability and its calibration errors, fitted on the same pooled validation
    # histograms as the operating points (pipelines/model_package/calibration.py). None: registered before it.
    calibration: Calibration | None = None

    @model_validator(mode="after")
    def _task_gate_by_default(self) -> ModelContract:
        if self.body_parts is None:
            self.body_parts = list(BODY_PARTS[self.task])
        if self.anatomic_regions is None:
            self.anatomic_regions = list(ANATOMIC_REGIONS[self.task])
        return self

    def transform(self) -> TransformSettings:
        return TransformSettings(task=self.task, image_size=self.image_size, min_image_size=self.min_image_size,
                                 resize_mode=self.resize_mode, interpolation=self.interpolation,
                                 decoder_version=self.decoder_version, limits=self.decode_limits)

    def model_to_score(self, label: str) -> ModelToScore:
        return ModelToScore(label=label, network=self.network, network_kwargs=self.network_kwargs,
                            input_shape=self.input_shape, num_classes=len(self.diseases), diseases=tuple(self.diseases))


def contract_for(federation: Federation, diseases: tuple[str, ...], network: str, network_kwargs: dict,
                 input_shape: tuple[int, ...], code_version: str, operating_points: OperatingPoints | None,
                 training_run: str, ood: OodReference | None = None,
                 calibration: Calibration | None = None) -> ModelContract:
    """The contract of a model trained on ``federation``'s shards in the MLflow run ``training_run``, learning
    ``diseases``. The sites'
    YAMLs say how their shards were made; the first site's decoding settings are the contract's (every site of a
    federation tiles to the same input shape), the views are those any site trained on."""
    first = federation.sites[0]
    views = sorted({view for site in federation.sites for view in site.views}) if first.task in VIEW_TASKS else []
    return ModelContract(task=federation.task, diseases=list(diseases), network=network,
                         network_kwargs=dict(network_kwargs), input_shape=tuple(input_shape),
                         image_size=int(input_shape[-1]), min_image_size=first.min_image_size,
                         decode_limits=first.decode_limits, channels=int(input_shape[0]),
                         allowed_modalities=sorted(ALLOWED_MODALITIES[federation.task]), views=views,
                         body_parts=list(BODY_PARTS[federation.task]),
                         anatomic_regions=list(ANATOMIC_REGIONS[federation.task]),
                         code_version=code_version, operating_points=operating_points, ood=ood,
                         calibration=calibration,
                         provenance=Provenance(federation=federation.name, sites=len(federation.sites),
                                               training_run=training_run,
                                               synthetic_sites=federation.synthetic_sites()))
