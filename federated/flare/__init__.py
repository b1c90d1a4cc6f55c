"""Training across hospitals over NVIDIA FLARE (``nvflare==2.9.0``, its Collab API).

The same engine as in-process and torchrun: every site's process runs ``federated.engine.Engine`` for
its own site, with a :class:`~federated.flare.backend.FlareTransport` whose collectives (mean, gather,
barrier) are calls to one function the server publishes (``server.collective``). The server waits for
all K sites, combines their tensors in site order with the in-process fold
(``federated.backends.weighted_sum``) and answers each site with the result. So MEAN is the same
weighted mean, GATHER the same concatenation in site order, LOCAL tensors never leave the site's
process, and the server sees exactly what the engine hands its transport, nothing else.

``site`` (published by every hospital) and ``server`` (``@collab.main`` and the collective) are the
job's two halves; ``job.train_flare`` at the centre builds the job, submits it to an environment
(``SimEnv`` on one machine, ``poc.LocalConsortium`` a provisioned consortium on one machine, ``ProdEnv`` a
real one) and reads the result back; ``provision`` writes a consortium's project file and startup kits.
Every module and the role that runs it (site, server, centre): federated/README.md, section ``flare/``.
"""
