"""The differential privacy the engine runs at a site (docs/privacy.md section 3): ``sgd`` (per-sample clipping,
Gaussian noise, Poisson sampling), ``site`` (the engine's hooks around an algorithm's site: DP-SGD, noised
summaries, each release charged to the site's ledger) and ``evaluation`` (an evaluation job's release at the
site).

Above the algorithms and the configuration, which it wraps; below the engine and the launchers, which import it.
The budget it spends, the ledger it writes and the policy it obeys are ``federated.privacy``, below the
configuration."""
