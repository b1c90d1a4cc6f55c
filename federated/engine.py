"""The federated training loop: ``Engine(config).run() -> TrainResult`` (``federated.train``: federated/training.py).

One round: every site runs I local steps (``algorithm.local_step``), ``before_communication``, then the
engine communicates every declared tensor by its kind (federated/state.py), then ``round_end``, then at
stage boundaries the combined ``stage_statistics`` go to ``stage_start``. Bytes each site sends and
receives are counted from the tensors actually handed to the transport (federated/transport.py). Sites in
this process run one after another, every hook under the site's own RNG stream, so every transport
(in-process, torchrun, NVIDIA FLARE) follows the same computation and gives the same model to float tolerance.

The network and device come from federated/network.py, evaluation from federated/evaluation.py,
checkpoints from federated/checkpoint.py, a round's bytes and record from federated/rounds.py, what a training
tells while it runs from federated/reporting.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from federated import evaluation, ood, ood_fit
from federated.aggregation import robust_rule
from federated.algorithms.base import Algorithm, Site
from federated.backends import InProcessTransport
from federated.checkpoint import latest_round_dir, load_round, save_round
from federated.config import TrainConfig, load_sites
from federated.data import SiteData, SiteLoader
from federated.dp import site as privacy
from federated.federation import federation_context
from federated.health import HealthMonitor, SiteUpdate, site_row, update_groups
from federated.network import (
    build_model,
    initial_model,
    local_steps,
    model_input_shape,
    training_device,
    training_forward,
)
from federated.registry import get_algorithm
from federated.reporting import RoundCallback, RoundReport
from federated.rounds import Traffic, round_record
from federated.schema import RoundRecord
from federated.secure_aggregation import RING_BYTES, SecureTransport
from federated.sites import site_names
from federated.state import Comm, check_layout, model_state_spec, model_tensors, nbytes
from federated.timing import COLUMNS, RoundClock, with_times
from federated.transport import Transport


@dataclass
class TrainResult:
    global_state: dict[str, torch.Tensor]  # state_dict of the averaged global network (on CPU)
    history: list[RoundRecord]  # one record per round: bytes, loss, and metrics when evaluated
    config: TrainConfig
    input_shape: tuple[int, ...]
    num_classes: int
    site_states: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)  # algorithm state, this process
    test_histograms: np.ndarray | None = None  # the last evaluation's, summed over sites (evaluation.Evaluation)
    privacy: dict[str, dict] = field(default_factory=dict)  # under DP, site -> its epsilons (federated/privacy)
    valid_histograms: np.ndarray | None = None  # likewise (the registered model's operating points)
    ood: ood.OodModel | None = None  # the out-of-distribution refusal's model, fitted after the last round

    def model(self) -> nn.Module:
        """The global network, rebuilt from the config and loaded with the final weights."""
        net = build_model(self.config, self.input_shape, self.num_classes)
        net.load_state_dict(self.global_state)
        return net


class Engine:
    """The round loop of one federated run. The sites of this process, their algorithm and the transport
    that connects them to the others (default: every site in this process); ``close()`` releases a transport
    the engine created."""

    def __init__(self, config: TrainConfig, transport: Transport | None = None,
                 initial_state: dict[str, torch.Tensor] | None = None, own_checkpoints: bool = False):
        if config.warmup_rounds:
            # Only federated.train runs the warm-up; an engine started elsewhere (FLARE, torchrun) would skip it.
            raise ValueError(f"warmup_rounds={config.warmup_rounds}: the warm-up is run by federated.train, "
                             "not by an Engine (set warmup_rounds=0 here)")
        self.config = config
        self.initial_state = initial_state
        self.owns_transport = transport is None
        if transport is None:
            transport = InProcessTransport(len(config.sites), training_device(config))
        self.device = transport.device
        if transport.num_sites != len(config.sites):
            raise ValueError(f"the config lists {len(config.sites)} sites but the transport connects "
                             f"{transport.num_sites} (torchrun --nproc-per-node must equal the number of sites)")
        self.is_leader = 0 in transport.local_sites
        # Every process commits its own checkpoint folder (NVIDIA FLARE: each hospital's), not site 0's alone.
        self.commits_checkpoints = self.is_leader or own_checkpoints
        self.site_fingerprints: dict[int, str] | None = None  # for checkpoints, computed on first use
        self.datas = load_sites(config.sites, transport.local_sites, config.diseases)
        self.secure = (SecureTransport(transport, [d.name for d in self.datas], config.mask_degree())
                       if config.secure_aggregation else None)
        self.transport = transport = self.secure or transport
        self.input_shape = model_input_shape(self.datas[0])
        self.privacy = privacy.admit_sites(config, self.datas, transport.local_sites, self.input_shape)  # before any release
        self.fed, self.weights, local_priors = federation_context(config, self.datas, self.transport, self.device)
        # Whether any site (in any process) holds a valid or test split: evaluation is a collective.
        flags = [[torch.tensor([float(any(s in d.splits for s in ("valid", "test")))], device=self.device)]
                 for d in self.datas]
        self.transport.mean_(flags, [1.0 / transport.num_sites] * len(flags))
        self.has_eval_data = bool(flags[0][0] > 0) and (config.dp is None or config.dp.eval_noise_multiplier is not None)
        self.algorithm: Algorithm = get_algorithm(config.algorithm)(config.params, self.fed)
        self.sites = [self._make_site(k, d, w, p) for k, d, w, p in
                      zip(transport.local_sites, self.datas, self.weights, local_priors)]
        privacy.attach(self.sites, self.privacy)
        if config.ood_false_refusal > 0 and config.dp is None:
            ood_fit.check_member_sizes(self.sites[0].model, self.sites)
        self.spec = {**model_state_spec(self.sites[0].model, config.bn_stats),
                     **self.algorithm.state_spec(self.sites[0])}
        for site in self.sites:
            with site.rng():
                site.state = self.algorithm.init_site_state(site)
            declared = {n for n in self.spec if not n.startswith("model.")}
            if declared != set(site.state):
                raise ValueError(f"algorithm {config.algorithm!r}: state_spec declares {sorted(declared)} but "
                                 f"init_site_state returns {sorted(site.state)}")
        tensors = self._tensors(self.sites[0])
        # MEAN tensors keep shape and dtype for the whole run: an all-reduce needs identical buffers on
        # every site, and the byte accounting is checked against these declared sizes every round.
        self.mean_layout = {n: (tuple(tensors[n].shape), tensors[n].dtype) for n, c in self.spec.items()
                            if c is Comm.MEAN}
        self.robust = robust_rule(config.robust_aggregation, config.trim_fraction, transport.num_sites)
        groups = update_groups(self.spec, tensors)
        self.updates = [SiteUpdate(self._tensors(site), groups) for site in self.sites]
        self.health = HealthMonitor(site_names(config), list(groups), config)
        if self.algorithm.stage_length and self.algorithm.stage_length % config.local_steps:
            raise ValueError(f"stage length {self.algorithm.stage_length} must be a multiple of local_steps "
                             f"I = {config.local_steps}: stages change at communication rounds")

    def close(self) -> None:
        """Release the transport if this engine created it (idempotent)."""
        if self.owns_transport:
            self.transport.close()

    # --- setup ------------------------------------------------------------------------------------
    def _make_site(self, k: int, data: SiteData, weight: float, prior: torch.Tensor) -> Site:
        model = initial_model(self.config, self.input_shape, len(data.diseases), self.device)
        if self.initial_state is not None:  # before init_site_state: algorithms snapshot their starting point
            model.load_state_dict(self.initial_state)
        loader = SiteLoader(data.train, self.config.batch_size, seed=self.config.seed * 100_003 + 2 * k + 1,
                            device=self.device, guarantee_positives=self.config.guarantee_positives,
                            workers=self.config.loader_workers, flip=self.config.augment_flip,
                            max_shift=self.config.augment_shift)
        gen = torch.Generator().manual_seed(self.config.seed * 100_003 + 2 * k + 2)
        cuda_state = None
        if self.device.type == "cuda":
            with torch.random.fork_rng(devices=[self.device]):
                torch.cuda.manual_seed(self.config.seed * 100_003 + 2 * k + 2)
                cuda_state = torch.cuda.get_rng_state()
        return Site(k, data, model, loader, weight, prior, rng_state=gen.get_state(), cuda_rng_state=cuda_state,
                    forward=training_forward(model, self.config))

    def each_site(self, hook) -> None:
        """Run ``hook(site)`` for every site of this process under the site's own RNG stream."""
        for site in self.sites:
            with site.rng():
                hook(site)

    # --- communication ------------------------------------------------------------------------
    def _tensors(self, site: Site) -> dict[str, torch.Tensor]:
        return {**model_tensors(site.model), **site.state}

    def communicate(self, kinds: tuple[Comm, ...] = (Comm.MEAN, Comm.GATHER)) -> tuple[list[int], list[int]]:
        """Do what the declaration says for tensors of ``kinds``; bytes sent and received by each site here."""
        sent = [0] * len(self.sites)
        received = [0] * len(self.sites)
        tensors = [self._tensors(s) for s in self.sites]
        mean_names = [n for n, c in self.spec.items() if c is Comm.MEAN and c in kinds]
        check_layout(self.config.algorithm, tensors, mean_names, self.mean_layout)
        self.transport.mean_([[t[n] for n in mean_names] for t in tensors], self.weights, self.robust,
                             names=mean_names)
        for i, t in enumerate(tensors):
            b = sum(self._mean_bytes(t[n]) for n in mean_names)
            sent[i] += b
            received[i] += b
        for name in (n for n, c in self.spec.items() if c is Comm.GATHER and c in kinds):
            own = [s.state[name] for s in self.sites]
            result = self.transport.gather(own)
            for i, site in enumerate(self.sites):
                sent[i] += nbytes(own[i])
                received[i] += nbytes(result) - nbytes(own[i])
                site.state[name] = result.clone() if len(self.sites) > 1 else result
        return sent, received

    def stage_boundary(self) -> int:
        """Combine every site's stage statistics as the algorithm's ``stage_spec`` declares and start the
        next stage; returns the bytes each site sent (and received)."""
        stats = []
        for site in self.sites:
            with site.rng():
                stats.append(self.algorithm.stage_statistics(site))
        spec = self.algorithm.stage_spec(self.sites[0])
        if set(spec) != set(stats[0]) or not set(spec.values()) <= {Comm.MEAN, Comm.SUM}:
            raise ValueError(f"algorithm {self.config.algorithm!r}: stage_spec {spec} must give every stage "
                             f"statistic {sorted(stats[0])} the kind mean or sum")
        for kind, weights in ((Comm.MEAN, self.weights), (Comm.SUM, [1.0] * len(self.sites))):
            names = sorted(n for n, c in spec.items() if c is kind)
            self.transport.mean_([[st[n] for n in names] for st in stats], weights, names=names)
        for site, st in zip(self.sites, stats):
            with site.rng():
                self.algorithm.stage_start(site, st)
        return sum(self._mean_bytes(t) for t in stats[0].values())

    def _mean_bytes(self, t: torch.Tensor) -> int:
        return t.numel() * RING_BYTES if self.secure else nbytes(t)

    # --- evaluation ---------------------------------------------------------------------------
    def global_model(self) -> nn.Module:
        return evaluation.global_model(self.sites, self.transport, self.weights, self.config.bn_stats)

    def evaluate(self) -> evaluation.Evaluation:
        """``evaluation.evaluate`` of the global model on every site's valid and test splits."""
        cfg = self.config
        return evaluation.evaluate(self.global_model(), self.sites, self.transport, self.fed, cfg.bn_stats,
                                   cfg.eval_bins, cfg.eval_min_count)

    def _site_fingerprints(self) -> dict[int, str]:
        if self.site_fingerprints is None:
            self.site_fingerprints = {k: self.config.sites[k].fingerprint(k) for k in self.transport.local_sites}
        return self.site_fingerprints

    # --- the loop -----------------------------------------------------------------------------
    def local_round(self, site: Site, update: SiteUpdate) -> torch.Tensor:
        """Site ``site``'s I local steps under its own RNG stream; its (mean, first) loss of the round, on the
        device (read back with the round's one per-site gather)."""
        cfg = self.config
        update.restart(self._tensors(site))
        with site.rng(), local_steps(cfg, site.model) as step_begins:
            total, first = torch.zeros((), device=self.device), None
            for batch in site.loader.batches(cfg.local_steps):
                step_begins()
                loss = self.algorithm.local_step(site, batch)
                first = loss.detach().clone() if first is None else first  # a copy: the loss may be a reused buffer
                total += loss
                site.iteration += 1
        return torch.stack([total / cfg.local_steps, first.to(total.dtype).reshape(())])

    def run(self, callbacks: Sequence[RoundCallback] = ()) -> TrainResult:
        """Every round from the first, or on a resume from the one after the last checkpoint: each recorded,
        checkpointed and reported to ``callbacks``; the trained global model."""
        cfg = self.config
        last_evaluation = None
        with privacy.settling(cfg, self.privacy) as released:  # charges what left on an early stop
            start_round, history = self._resume()
            with RoundReport(cfg, start_round, self.is_leader, callbacks) as report:
                carried = self._initial_exchange(start_round)
                for r in range(start_round, cfg.rounds):
                    record, evaluated = self.round(r, released, carried)
                    carried = Traffic.none(len(self.sites))
                    if evaluated is not None:
                        last_evaluation = evaluated
                    history.append(record)
                    self._checkpoint(r, history)
                    report(record)
        return self._result(history, last_evaluation)

    def round(self, r: int, released: privacy.Released, carried: Traffic
              ) -> tuple[RoundRecord, evaluation.Evaluation | None]:
        """Round ``r``: every site's local steps, the exchange, the sites' health, the evaluation when one is
        due; the round's record (its bytes include ``carried``'s)."""
        # The slow site named (federated/timing.py); under DP no site's time leaves it.
        clock = RoundClock(len(self.sites), self.device, withheld=self.privacy is not None)
        if self.secure:
            self.secure.round = r
        losses, norms = self._local_rounds(r, clock)
        released.rounds += 1  # from here the round has left the site
        per_site = self._site_rows(carried + self._exchange(), losses, norms, clock)
        health = self.health.check(r, per_site[:, :-COLUMNS])
        evaluated = self._evaluation_due(r, released)
        timing = clock.record(per_site, self.health.site_names)
        return round_record(r, self.sites[0].iteration, self.config.lr, per_site, health, timing, evaluated), evaluated

    def _resume(self) -> tuple[int, list[RoundRecord]]:
        """The round to start from and the records of those before it: on a resume, after the last checkpoint."""
        cfg = self.config
        round_dir = latest_round_dir(Path(cfg.checkpoint_dir)) if cfg.checkpoint_dir and cfg.resume else None
        if round_dir is None:
            return 0, []
        meta = load_round(round_dir, self.sites, cfg, self._site_fingerprints())
        self.health.resume(meta["history"])
        return meta["round"] + 1, meta["history"]

    def _initial_exchange(self, start_round: int) -> Traffic:
        """Before round 0, the GATHER tensors where the algorithm asks (``initial_gather``); round 0 counts them."""
        if start_round > 0 or not self.algorithm.initial_gather:
            return Traffic.none(len(self.sites))
        traffic = Traffic(*self.communicate((Comm.GATHER,)))
        self.each_site(self.algorithm.round_end)
        return traffic

    def _local_rounds(self, r: int, clock: RoundClock) -> tuple[list[torch.Tensor], list]:
        """Every site's local steps and ``before_communication``; the losses and update norms each sends
        (withheld under DP)."""
        losses = [clock.time(self.local_round, site, update) for site, update in zip(self.sites, self.updates)]
        self.each_site(self.algorithm.before_communication)
        tensors = [self._tensors(site) for site in self.sites]
        check_layout(self.config.algorithm, tensors, list(self.mean_layout), self.mean_layout)
        norms = [update.norms(t) for t, update in zip(tensors, self.updates)]
        if self.privacy:
            losses, norms = privacy.withhold(losses, norms, self.privacy, r, self.config.lr)
        return losses, norms

    def _exchange(self) -> Traffic:
        """The round's communication, ``round_end``, and at a stage's end its boundary."""
        traffic = Traffic(*self.communicate())
        self.each_site(self.algorithm.round_end)
        stage = self.algorithm.stage_length
        if stage and self.sites[0].iteration % stage == 0:
            traffic = traffic.each_plus(self.stage_boundary())
        return traffic

    def _site_rows(self, traffic: Traffic, losses: list[torch.Tensor], norms: list, clock: RoundClock) -> torch.Tensor:
        """The round's one wait for the sites: every site's bytes, losses, update norms (federated/health.py) and
        times, gathered before a diverged model is evaluated or checkpointed."""
        rows = [with_times(site_row(site.index, b_s, b_r, loss, n), clock.row(i)) for i, (site, b_s, b_r, loss, n)
                in enumerate(zip(self.sites, traffic.sent, traffic.received, losses, norms))]
        return self.transport.gather([row.to(self.device) for row in rows]).cpu()

    def _evaluation_due(self, r: int, released: privacy.Released) -> evaluation.Evaluation | None:
        """The global model evaluated where round ``r`` ends with an evaluation (every site's payload has one
        size: fixed-size summaries)."""
        if not (self.has_eval_data and self.config.evaluates_after(r)):
            return None
        released.evaluations += 1
        evaluated = self.evaluate()
        if r == self.config.rounds - 1 and self.config.ood_false_refusal > 0 and self.config.dp is None:
            evaluated.ood, sent = ood_fit.federated_statistics(
                self.global_model(), self.sites, self.transport, self.device, self.config.ood_false_refusal,
                "pooled train and validation splits of the training's sites", self._mean_bytes, self.fed.amp,
                self.fed.channels_last)
            evaluated.bytes_sent = [a + b for a, b in zip(evaluated.bytes_sent, sent)]
            evaluated.bytes_received = [a + b for a, b in zip(evaluated.bytes_received, sent)]
        return evaluated

    def _checkpoint(self, r: int, history: list[RoundRecord]) -> None:
        if self.config.checkpoint_dir is not None:
            meta = {"round": r, "history": history} if self.commits_checkpoints else None
            save_round(Path(self.config.checkpoint_dir), r, self.sites, meta, self.transport.barrier, self.config,
                       self._site_fingerprints())

    def _result(self, history: list[RoundRecord], last_evaluation: evaluation.Evaluation | None) -> TrainResult:
        state = {k: v.detach().cpu().clone() for k, v in self.global_model().state_dict().items()}
        histograms = (None, None) if last_evaluation is None else (last_evaluation.test_histograms,
                                                                   last_evaluation.valid_histograms)
        return TrainResult(state, history, self.config, self.input_shape, self.fed.num_classes,
                           {s.index: s.state for s in self.sites}, histograms[0],
                           {p.name: p.epsilon for p in self.privacy or ()}, histograms[1],
                           None if last_evaluation is None else last_evaluation.ood)


__all__ = ["Engine", "RoundCallback", "TrainResult"]
