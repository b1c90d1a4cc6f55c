"""Each hospital's privacy budget and what it means (docs/privacy.md): ``policy`` (what DP is and what it
refuses), ``accounting`` (the mechanism and the accountants), ``ledger`` (the site's budget and spending, composed
by its accountant, under its lock), ``binding`` (the data a ledger guards), ``budget`` (the declared budget and its
changes, as events), ``meaning`` (what an (epsilon, delta) allows a membership attack).

Below the training's configuration (``federated.config``, ``federated.settings``), which checks a job against
it: nothing here imports the engine, an algorithm or the configuration. The mechanisms that spend the budget
during a job are ``federated.dp``, above the algorithms."""
