"""Site YAMLs: loading, defaults, every problem named by file and field, data checks, the CLI."""

from __future__ import annotations

import textwrap

import pytest
from typer.testing import CliRunner

from pipelines.cli import app
from preprocessing.sites import SiteConfigError, load_site, validate_site

CHEXPERT_HEADER = (
    "Path,Sex,Age,Frontal/Lateral,AP/PA,No Finding,Enlarged Cardiomediastinum,Cardiomegaly,Lung Opacity,"
    "Lung Lesion,Edema,Consolidation,Pneumonia,Atelectasis,Pneumothorax,Pleural Effusion,Pleural Other,"
    "Fracture,Support Devices\n"
)


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def chexpert_root(tmp_path):
    root = tmp_path / "data" / "CheXpert-v1.0-small"
    (root / "train").mkdir(parents=True)
    (root / "train.csv").write_text(CHEXPERT_HEADER + "train/patient00001/study1/view1_frontal.jpg,Male,50,Frontal,PA" + ",1.0" * 14 + "\n")
    (root / "valid.csv").write_text(CHEXPERT_HEADER)
    return root


def test_defaults_and_relative_root(tmp_path, chexpert_root):
    (tmp_path / "sites").mkdir()
    site = write(tmp_path / "sites" / "stanford.yaml", """\
        name: stanford
        format: chexpert
        root: ../data/CheXpert-v1.0-small
        task: chest-xray
        uncertain_policy: {Consolidation: ignore}
    """)
    config = load_site(site)
    assert config.root == chexpert_root.resolve()
    assert config.uncertain_policy == {"Cardiomegaly": "zeros", "Edema": "ones", "Consolidation": "ignore",
                                       "Atelectasis": "ones", "Pleural Effusion": "zeros"}
    assert config.views == ["PA", "AP"]
    assert (config.split.seed, config.split.valid, config.split.test, config.split.use_official) == (0, 0.1, 0.2, True)
    assert (config.image_size, config.min_image_size) == (224, 64)
    assert config.adapter_options.train_csv == "train.csv" and config.adapter_options.valid_csv == "valid.csv"
    assert validate_site(site) == []


def test_every_field_problem_is_reported_with_file_and_field(tmp_path):
    site = write(tmp_path / "bad.yaml", """\
        name: bad site
        format: chexpert
        root: .
        task: chest-xray
        uncertain_policy: {Edema: maybe}
        views: [PA, OBLIQUE]
        split: {valid: 0.5, test: 0.6}
        colour: blue
    """)
    with pytest.raises(SiteConfigError) as err:
        load_site(site)
    problems = {p.field: p.message for p in err.value.problems}
    assert set(problems) == {"name", "uncertain_policy.Edema", "views", "split", "colour"}
    assert problems["colour"] == "unknown field"
    assert "unknown view(s) ['OBLIQUE']" in problems["views"]
    assert "valid + test must be below 1" in problems["split"]
    assert str(err.value).startswith(f"{site}: ")
    assert all(p.file == str(site) for p in err.value.problems)


def test_unknown_format_and_unknown_disease(tmp_path):
    with pytest.raises(SiteConfigError, match=r"bad\.yaml: format: unknown format 'dicomdir'; expected one of \["):
        load_site(write(tmp_path / "bad.yaml", "name: a\nformat: dicomdir\nroot: .\ntask: chest-xray\n"))
    with pytest.raises(SiteConfigError) as err:
        load_site(write(tmp_path / "bad.yaml", "name: a\nformat: nih-cxr14\nroot: .\ntask: chest-xray\n"
                        "uncertain_policy: {Pneumonia: ones}\noptions: {data_entry: x.csv}\n"))
    problems = {p.field: p.message for p in err.value.problems}
    assert problems["uncertain_policy"].startswith("unknown disease(s) ['Pneumonia'] for task chest-xray")
    assert problems["options.data_entry"] == "unknown field"


def test_format_for_another_task_and_required_options(tmp_path):
    with pytest.raises(SiteConfigError) as err:
        load_site(write(tmp_path / "x.yaml", "name: a\nformat: generic-csv\nroot: .\ntask: melanoma\n"
                        "options: {labels_csv: l.csv, label_columns: {Edema: e}}\n"))
    problems = {p.field: p.message for p in err.value.problems}
    assert problems == {"options.patient_column": "required field is missing",
                        "options.path_column": "required field is missing"}
    with pytest.raises(SiteConfigError, match=r"task: format 'siim-isic-2020' serves \['melanoma'\], not 'chest-xray'"):
        load_site(write(tmp_path / "x.yaml", "name: a\nformat: siim-isic-2020\nroot: .\ntask: chest-xray\n"))


def test_generic_label_mapping_must_name_task_diseases(tmp_path):
    with pytest.raises(SiteConfigError, match=r"options\.label_columns\.Pneumonia: unknown disease for task chest-xray"):
        load_site(write(tmp_path / "x.yaml", "name: a\nformat: generic-csv\nroot: .\ntask: chest-xray\noptions:\n"
                        "  {labels_csv: l.csv, path_column: p, patient_column: q, label_columns: {Pneumonia: pn}}\n"))


@pytest.mark.parametrize("text,message", [
    ("name: [unclosed\n", "malformed YAML"),
    ("- a list\n", "expected a mapping of fields, got list"),
    ("name: a\nroot: .\ntask: chest-xray\n", "format: a site with a dataset declares format and root"),
])
def test_malformed_yaml(tmp_path, text, message):
    site = write(tmp_path / "x.yaml", text)
    with pytest.raises(SiteConfigError, match=message) as err:
        load_site(site)
    assert str(err.value).startswith(str(site))


def test_missing_site_file(tmp_path):
    with pytest.raises(SiteConfigError, match="site file not found"):
        load_site(tmp_path / "nope.yaml")


def test_validate_checks_the_data(tmp_path, chexpert_root):
    site = write(tmp_path / "s.yaml", f"name: s\nformat: chexpert\nroot: {tmp_path / 'absent'}\ntask: chest-xray\n")
    assert [str(p) for p in validate_site(site)] == [f"{site}: root: data root not found: {tmp_path / 'absent'}"]
    (chexpert_root / "valid.csv").unlink()
    (chexpert_root / "train.csv").write_text("Path,Sex,Age,Frontal/Lateral,Cardiomegaly\n")
    (chexpert_root / "train").rmdir()
    site = write(tmp_path / "s.yaml", f"name: s\nformat: chexpert\nroot: {chexpert_root}\ntask: chest-xray\n")
    problems = [str(p) for p in validate_site(site)]
    train = chexpert_root / "train.csv"
    assert problems == [
        f"{site}: options.train_csv: {train}: missing column(s) ['AP/PA', 'Edema', 'Consolidation', 'Atelectasis', "
        "'Pleural Effusion']; found ['Path', 'Sex', 'Age', 'Frontal/Lateral', 'Cardiomegaly']\n"
        "  fix: check that the site YAML's options name the right file (and, for a generic layout, its columns)",
        f"{site}: options.valid_csv: metadata file not found: {chexpert_root / 'valid.csv'}",
        f"{site}: root: image folder not found: {chexpert_root / 'train'}",
    ]


def test_cli_validate(tmp_path, chexpert_root):
    runner = CliRunner()
    good = write(tmp_path / "good.yaml", f"name: s\nformat: chexpert\nroot: {chexpert_root}\ntask: chest-xray\n")
    result = runner.invoke(app, ["sites", "validate", str(good)])
    assert result.exit_code == 0 and result.output.strip() == f"{good}: ok"
    bad = write(tmp_path / "bad.yaml", f"name: s\nformat: padchest\nroot: {chexpert_root}\ntask: chest-xray\n")
    result = runner.invoke(app, ["sites", "validate", str(bad)])
    assert result.exit_code == 1
    assert "options.labels_csv: metadata file not found" in result.output


def test_example_sites_load():
    from pathlib import Path

    examples = sorted(p for p in (Path(__file__).parents[1] / "sites").glob("*.yaml"))
    assert examples, "sites/ holds one example YAML per real layout"
    formats = {load_site(p).format for p in examples}
    assert formats == {"chexpert", "mimic-cxr-jpg", "nih-cxr14", "padchest", "vindr-cxr", "siim-isic-2020",
                       "generic-csv", "generic-dicom"}


def _generic_site(tmp_path, csv_bytes: bytes, extra: str = "") -> object:
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "labels.csv").write_bytes(csv_bytes)
    return write(tmp_path / "generic.yaml", "name: g\nformat: generic-csv\nroot: data\ntask: chest-xray\n"
                 "options: {labels_csv: labels.csv, path_column: path, patient_column: patient,\n"
                 "          label_columns: {Edema: edema}" + extra + "}\n")


def test_a_byte_that_is_not_utf8_is_named_by_line_and_byte_in_validate_and_preprocess(tmp_path):
    site = _generic_site(tmp_path, b"path,patient,edema\na.png,P1,1\nb.png,Jos\xe9,0\n")
    problems = [str(p) for p in validate_site(site)]
    assert len(problems) == 1
    assert "labels.csv: line 3, byte 10: 0xe9 is not UTF-8" in problems[0]
    assert "fix: re-save it as UTF-8, e.g. iconv -f WINDOWS-1252 -t UTF-8 labels.csv" in problems[0]
    runner = CliRunner()
    for command in (["sites", "validate", str(site)], ["preprocess", str(site), "--out", str(tmp_path / "out")]):
        result = runner.invoke(app, command)
        assert result.exit_code == 1, command
        assert "line 3, byte 10: 0xe9 is not UTF-8" in result.output and "Traceback" not in result.output
        assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)


def test_a_semicolon_separated_file_gets_a_delimiter_hint(tmp_path):
    site = _generic_site(tmp_path, b"path;patient;edema\na.png;P1;1\n")
    (problem,) = validate_site(site)
    assert "found ['path;patient;edema']" in str(problem)
    assert "3 columns on semicolon (';'): the file is probably semicolon-separated" in str(problem)
    assert "fix: re-export labels.csv comma-separated" in str(problem)


def test_yaml_fields_options_and_csv_header_problems_are_reported_together(tmp_path):
    site = _generic_site(tmp_path, b"path,patient,oedema\na.png,P1,1\n", extra=", colour: blue")
    assert [(p.field, p.message) for p in validate_site(site)] == [("options.colour", "unknown field")]
    site.write_text(site.read_text() + "speed: fast\ndecode_limits: {max_pixel: 5}\n")
    fields = {p.field: p.message for p in validate_site(site)}
    assert fields == {"speed": "unknown field", "decode_limits.max_pixel": "unknown field",
                      "options.colour": "unknown field"}
    site = _generic_site(tmp_path, b"path,patient,oedema\na.png,P1,1\n", extra="")
    site.write_text(site.read_text() + "speed: fast\n")
    fields = {p.field: p.message for p in validate_site(site)}
    assert set(fields) == {"speed", "options.labels_csv"}
    assert "missing column(s) ['edema']" in fields["options.labels_csv"]
