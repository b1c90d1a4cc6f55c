"""The centre: the submitter and operator. A training's or an evaluation's job built, submitted in ``sim``,
``poc`` or ``prod`` and read back (``job``, ``evaluate``), a consortium provisioned (``provision``) and
operated with the admin's kit (``operate``). It imports no module of the sites' or the server's, only the
shared modules beside this folder, with one exception: ``poc`` starts a whole consortium on one machine, its
server and every site as their operators start them (tests/test_imports.py).
"""
