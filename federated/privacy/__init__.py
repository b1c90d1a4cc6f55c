"""Each hospital's privacy budget and the differential privacy that enforces it at the site (docs/privacy.md):
``policy`` (what DP is and what it refuses), ``accounting`` (the mechanism and the accountants), ``ledger`` (the
site's budget and spending, composed by its accountant, under its lock), ``budget`` (the declared budget and its
changes, as events), ``sgd`` (per-sample clipping, Gaussian noise, Poisson sampling), ``site`` (the engine's
hooks), ``evaluation`` (an evaluation job's release at the site), ``meaning`` (what an (epsilon, delta)
allows a membership attack). Nothing here imports the engine; the engine imports ``site``."""
