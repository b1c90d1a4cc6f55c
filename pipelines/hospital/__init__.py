"""The champion at work in a hospital: everything that runs at the site with a registered model.

``contract``: what the registered model says about itself (task, diseases in output order, the decoding and
tile settings it was trained with, the network, the code version, the operating points). ``flavor``: how
registration stores it in MLflow (a torch.export program that is also a pyfunc model taking image files).
``predict``: files, folders or a site's dataset scored through preprocessing's own decoding and
``federated.predict.predict_scores``. ``batch``: ``fedauc predict`` and ``fedauc thresholds`` (a registered
model resolved, loaded and its operating points chosen; files scored to a table). ``thresholds``: operating
points from score histograms. ``job``: one run of the scheduled PACS scoring (``fedauc pacs``). ``pacs``:
the DICOMweb scoring job, over ``dicomweb`` (the PACS through dicomweb-client), with ``pacs_state`` (what it
remembers of each study between runs) and ``sinks`` (where results go, the SR of ``report`` last). ``drift``:
what a day of scoring may tell the centre, and the drift figure the centre computes from it.

Importable and testable without a Prefect or MLflow server.
"""
