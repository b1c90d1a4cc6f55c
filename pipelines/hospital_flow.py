"""The hospital's scheduled PACS scoring as a Prefect flow (infra/prefect.yaml: ``pacs-scoring-<site>`` on
the hospital's own work pool). Thin: pipelines/hospital/job.py does the work. The run logger (which Prefect
sends to its server) gets counts only; studies that could not be retrieved are named on the worker's own log
(``fedauc.pacs``), and the flow run fails with their count and reasons. A PACS that cannot be used fails the flow
run without its address or user (the worker's log has them): the Prefect server may be the consortium's."""

from __future__ import annotations

import logging

from prefect import flow, get_run_logger


@flow(name="score_pacs")
def score_pacs(site_yaml: str, shards_root: str = "shards", model: str | None = None,
               operating_point: str = "youden", allow_synthetic_model: bool = False) -> dict:
    """Score the new studies of the site's PACS with the registered model (default its task's champion) and
    store one SR per study back; returns the days' aggregates that went to the centre."""
    from pipelines.hospital import job
    from pipelines.hospital.dicomweb import PacsUnavailable

    logger = get_run_logger()
    try:
        result = job.run(site_yaml, shards_root, model, operating_point, echo=logger.info,
                         allow_synthetic_model=allow_synthetic_model)
    except PacsUnavailable as err:
        logging.getLogger("fedauc.pacs").error(str(err))
        raise PacsUnavailable(err.without_address()) from None
    return {"sent": result["sent"], "warnings": result["warnings"]}
