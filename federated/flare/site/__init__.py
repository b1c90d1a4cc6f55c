"""The site: a hospital's NVFlare client, started by ``fedauc consortium start-site`` (``start``: the kit, its
certificate, the server and the shards checked first), and the half of every fedauc job it runs (``job``: the
engine for this site, or an evaluation's scoring). It imports no module of the server's or the centre's, only
the shared modules beside this folder (tests/test_imports.py), and nothing of MLflow or Prefect.
"""
