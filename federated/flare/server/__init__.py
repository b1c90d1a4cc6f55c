"""The server: the coordinating centre's NVFlare server, started by ``fedauc consortium start-server``
(``start``: its kit checked first), and the half of every fedauc job it runs (``job``: every site's part
called once, their collectives served, the job's live account kept, the result written). It imports no module
of the sites' or the centre's, only the shared modules beside this folder (tests/test_imports.py).
"""
