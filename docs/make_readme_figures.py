"""Regenerate the README's figures from the MLflow store a `make demo` left behind.

- docs/mlflow_trainings.png and docs/mlflow_champion.png: the first two links `fedauc ui` prints for chest-xray (its
  trainings, best pooled test AUC first; its champion's version page), in Debian's headless Chromium driven by
  selenium (`make setup` installs chromium and chromium-driver);
- docs/roc_chest.png: the pooled test ROC curves of the chest-xray champion, as logged to its run.

Run: `.venv/bin/python docs/make_readme_figures.py` after `make demo`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import mlflow
from mlflow import MlflowClient

from federated import schema
from pipelines import tracking
from pipelines.servers import ui_servers, wait_for
from pipelines.ui_views import task_links

DOCS = Path(__file__).resolve().parent
PORT = 5077


def champion_roc(task: str, out: Path) -> None:
    client = MlflowClient()
    champion = client.get_model_version_by_alias(schema.registered_model_name(task), schema.CHAMPION_ALIAS)
    local = mlflow.artifacts.download_artifacts(run_id=champion.run_id, artifact_path="roc_test_pooled.png",
                                                dst_path=tempfile.mkdtemp())
    shutil.copyfile(local, out)


def mlflow_screenshots(task: str, trainings: Path, champion: Path) -> None:
    from selenium import webdriver
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    server = ui_servers(PORT, PORT + 1)["MLflow"]
    command, url = server.command, server.url
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1500,800", "--hide-scrollbars"):
        options.add_argument(argument)
    try:
        wait_for(url, server)
        (links,) = [link for link in task_links(url, "http://127.0.0.1:4200") if link.task == task]
        driver = webdriver.Chrome(service=webdriver.ChromeService(shutil.which("chromedriver")), options=options)
        try:
            for link, out, ready in ((links.trainings, trainings, "[role=row][row-index] [col-id]"),
                                     (links.champion, champion, "[data-testid=markdown-view], .markdown-view, p")):
                driver.get(link)
                try:
                    WebDriverWait(driver, 180).until(lambda d, css=ready: d.find_elements(By.CSS_SELECTOR, css))
                except TimeoutException:
                    driver.save_screenshot(str(out))
                    raise SystemExit(f"{link} showed no {ready} in 180 s: what it showed is in {out}") from None
                time.sleep(3)  # the table's last cells, the description's markdown
                for close in driver.find_elements(By.CSS_SELECTOR, "[aria-label=Close]"):  # MLflow's assistant panel
                    if close.is_displayed():
                        close.click()
                time.sleep(1)
                driver.save_screenshot(str(out))
        finally:
            driver.quit()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


if __name__ == "__main__":
    tracking.configure()
    champion_roc("chest-xray", DOCS / "roc_chest.png")
    mlflow_screenshots("chest-xray", DOCS / "mlflow_trainings.png", DOCS / "mlflow_champion.png")
    print(f"wrote {DOCS / 'roc_chest.png'}, {DOCS / 'mlflow_trainings.png'} and {DOCS / 'mlflow_champion.png'}")
