import pytest

from preprocessing.public_metadata import PublicMetadataUnavailable, public_metadata_dir


@pytest.fixture(scope="session")
def public_metadata():
    """Directory of the real public metadata CSVs from the torchxrayvision wheel (fetched once)."""
    try:
        return public_metadata_dir()
    except PublicMetadataUnavailable as err:
        pytest.skip(f"real public metadata unavailable, cannot fetch the torchxrayvision wheel: {err}")
