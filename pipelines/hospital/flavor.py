"""The pyfunc loader's module name in the models registered before the registered model's package moved to
``pipelines/model_package/``: MLflow imports a model's loader by the name it recorded at registration, so a
champion registered by an earlier fedauc still serves (``mlflow.pyfunc.load_model``, ``mlflow models serve``)
at a hospital that upgraded (docs/deploy.md section 1)."""

from pipelines.model_package.flavor import _load_pyfunc

__all__ = ["_load_pyfunc"]
