"""The result sinks a site YAML may name (``pacs.sinks``), and the sinks of one run built from those names.

A name-to-class registry in the shape of MONAI's ``image_writer.py`` (``register_writer``/``resolve_writer``):
``register_sink`` adds a class that keeps the ``sinks.ResultSink`` contract, ``resolve_sink`` finds it by
name, ``build_sinks`` makes the run's sinks from the YAML, each one's options checked by its own model.
tests/test_hospital_sinks.py runs every registered sink through the contract.
"""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from common.errors import ConfigError, problem_message
from pipelines.hospital.dicomweb import Pacs
from pipelines.hospital.outbox import JsonOutbox
from pipelines.hospital.sinks import DicomSrSink, ResultSink

_SINKS: dict[str, type[ResultSink]] = {}
COMMIT_MARK = DicomSrSink.name


def register_sink(sink: type[ResultSink]) -> type[ResultSink]:
    if _SINKS.get(sink.name, sink) is not sink:
        raise ValueError(f"two result sinks named {sink.name!r}: {_SINKS[sink.name].__qualname__}, {sink.__qualname__}")
    _SINKS[sink.name] = sink
    return sink


def registered() -> dict[str, type[ResultSink]]:
    return dict(_SINKS)


def resolve_sink(name: str, field: str = "pacs.sinks") -> type[ResultSink]:
    if name not in _SINKS:
        raise ConfigError(f"{field}: no result sink is named {name!r}",
                          fix=f"name one of {sorted(_SINKS)} in the site YAML's pacs.sinks")
    return _SINKS[name]


def build_sinks(choices: list[str | dict[str, dict | None]], pacs: Pacs) -> list[ResultSink]:
    """The run's sinks, in the YAML's order (``check_sinks``)."""
    return [sink(pacs, options) for sink, options in check_sinks(choices)]


def check_sinks(choices: list[str | dict[str, dict | None]]) -> list[tuple[type[ResultSink], BaseModel]]:
    """Each sink of the site YAML's ``pacs.sinks`` with its parsed options, or a ``ConfigError`` naming the
    field: each entry a name, or a name with its options (``{json-outbox: {folder: ...}}``); the DICOM SR
    last, the study's commit mark."""
    sinks = []
    for index, choice in enumerate(choices):
        field = f"pacs.sinks[{index}]"
        if isinstance(choice, str):
            name, options = choice, {}
        elif len(choice) == 1:
            ((name, options),) = choice.items()
        else:
            raise ConfigError(f"{field}: one sink per entry, {sorted(choice)} given",
                              fix="write each sink as its own list item: `- name` or `- name: {options}`")
        sink = resolve_sink(name, field)
        try:
            parsed = sink.Options.model_validate(options or {})
        except ValidationError as err:
            error = err.errors()[0]
            where = ".".join(str(part) for part in (field, name, *error["loc"]))
            raise ConfigError(f"{where}: {problem_message(error)}",
                              fix=f"see the {name} sink's options in docs/deploy.md section 3") from None
        sinks.append((sink, parsed))
    names = [sink.name for sink, _ in sinks]
    if names[-1:] != [COMMIT_MARK] or names.count(COMMIT_MARK) != 1:
        raise ConfigError(f"pacs.sinks: {names} does not end with {COMMIT_MARK}, once",
                          fix=f"list {COMMIT_MARK} last: a study is done once its SR is in the PACS")
    return sinks


for _sink in (JsonOutbox, DicomSrSink):
    register_sink(_sink)
