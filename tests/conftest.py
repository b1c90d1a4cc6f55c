import pytest

from preprocessing.public_metadata import PublicMetadataUnavailable, public_metadata_dir


@pytest.fixture(scope="session")
def public_metadata():
    """Directory of the real public metadata CSVs from the torchxrayvision wheel (fetched once)."""
    try:
        return public_metadata_dir()
    except PublicMetadataUnavailable as err:
        pytest.skip(f"real public metadata unavailable, cannot fetch the torchxrayvision wheel: {err}")


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """`make test` runs two pytest-xdist workers on two cores: a second intra-op thread per worker only
    contends (tiny models here are latency-bound; steps ran up to 8x slower with two threads each)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
