import pytest
import yaml

from preprocessing.federation import load_federation
from preprocessing.sites import SiteConfigError


def _site(tmp_path, name, task="chest-xray", fmt="nih-cxr14"):
    (tmp_path / name).mkdir()
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, "format": fmt, "root": name, "task": task}))
    return {"config": f"{name}.yaml"}


def test_every_problem_is_reported_with_file_and_field(tmp_path):
    sites = [_site(tmp_path, "a"), _site(tmp_path, "b", task="melanoma", fmt="siim-isic-2020"),
             {"config": "missing.yaml"}, {"config": "a.yaml"}]
    path = tmp_path / "fed.yaml"
    path.write_text(yaml.safe_dump({"name": "f", "task": "chest-xray", "sites": sites}))
    with pytest.raises(SiteConfigError) as err:
        load_federation(path)
    text = str(err.value)
    assert f"{path}: sites.1.config: {tmp_path / 'b.yaml'} is a melanoma site, the federation is chest-xray" in text
    assert f"{tmp_path / 'missing.yaml'}: site file not found" in text
    assert f"{path}: sites: site name 'a' is used twice" in text


@pytest.mark.parametrize("text, message", [
    ("name: [unclosed\n", "malformed YAML"),
    ("- a\n- b\n", "expected a mapping of fields, got list"),
    ("name: f\ntask: chest-xray\nsites: []\ncolour: red\n", "colour: unknown field"),
])
def test_a_malformed_federation_names_the_file(tmp_path, text, message):
    path = tmp_path / "fed.yaml"
    path.write_text(text)
    with pytest.raises(SiteConfigError, match=message) as err:
        load_federation(path)
    assert str(path) in str(err.value)
