"""Training across hospitals over NVIDIA FLARE (``nvflare==2.9.0``, its Collab API).

The same engine as in-process and torchrun: every site's process runs ``federated.engine.Engine`` for
its own site, with a :class:`~federated.flare.site.backend.FlareTransport` whose collectives (mean, gather,
barrier) are calls to one function the server publishes (``server.job.collective``). The server waits for
all K sites, combines their tensors in site order with the in-process fold
(``federated.backends.weighted_sum``) and answers each site with the result. So MEAN is the same
weighted mean, GATHER the same concatenation in site order, LOCAL tensors never leave the site's
process, and the server sees exactly what the engine hands its transport, nothing else.

``site.job`` (published by every hospital) and ``server.job`` (``@collab.main`` and the collective) are the
job's two halves; ``centre.job.train_flare`` at the centre builds the job, submits it to an environment
(``SimEnv`` on one machine, ``centre.poc.LocalConsortium`` a provisioned consortium on one machine, ``ProdEnv`` a
real one) and reads the result back; ``centre.provision`` writes a consortium's project file and startup kits.
Each role's modules are in its own folder: ``site`` (a hospital's client and its half of a job), ``server``
(the coordinating centre's server and its half) and ``centre`` (the submitter and operator); what they
share is here: ``protocol`` (every name and constant on the wire), ``spec`` (the job), ``installed``
(no code travels), ``lockdown`` (the trust boundary on disk) and ``processes`` (a kit's NVFlare process).
What each module does: federated/README.md, section ``flare/``.
"""
