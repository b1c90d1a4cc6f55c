"""The champion at work in a hospital: only what runs at the site, over the registered model of
``pipelines.model_package``.

``table``: ``fedauc predict`` and ``fedauc thresholds`` (files, folders or a site's dataset scored into a
CSV or Parquet table; the hospital's own operating points from its validation split). ``job``: one run of
the scheduled PACS scoring (``fedauc pacs``: the provenance check, the day's drift, studies not retrieved).
``pacs``: the DICOMweb scoring job, over ``dicomweb`` (the PACS through dicomweb-client), with ``pacs_state``
(what it remembers of each study between runs), ``result`` (one study's result) and ``sinks`` (where it goes,
the SR of ``dicom_sr`` last; ``sink_registry`` the names a site YAML chooses from, ``outbox`` a folder's). ``drift``: what a day of scoring may tell the centre, and the drift figure the centre computes from it.
``flavor``: the pyfunc loader's name in models registered before ``model_package`` existed.

Importable and testable without a Prefect or MLflow server.
"""
