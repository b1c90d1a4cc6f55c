"""The registered model: what centre code registers and what a hospital loads, scores with and trusts.

``contract``: what the registered model says about itself (task, diseases in output order, the decoding and
tile settings it was trained with, the body parts it reads, the network, the code version, the operating
points, its provenance). ``thresholds``: operating points from score histograms, and where a hospital keeps
its own. ``predict``: image files scored through preprocessing's own decoding and
``federated.predict.predict_scores`` (``score_items``, ``Scorer``, ``Item``; the reasons a file is
refused). ``flavor``: how registration stores it in MLflow (a torch.export program that is also a pyfunc
model taking image files). ``loading``: a ``models:/`` URI resolved (by default a task's champion), the model
downloaded and loaded as a ``Scorer``, the operating points a scoring run uses.

Nothing here talks to a PACS or runs a hospital's job (``pipelines.hospital`` does); importable and
testable without a Prefect or MLflow server.
"""
