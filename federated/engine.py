"""The federated training loop: ``train(config) -> TrainResult``.

One round: every site runs I local steps (``algorithm.local_step``), ``before_communication``, then the
engine communicates every declared tensor by its kind (federated/state.py), then ``round_end``, then at
stage boundaries the averaged ``stage_statistics`` go to ``stage_start``. Bytes each site sends and
receives are counted from the tensors actually handed to the backend. Sites in this process run one
after another (each with its own RNG stream), so the in-process and distributed backends follow the
same computation and give the same model to float tolerance.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from federated.algorithms.base import Algorithm, Federation, Site
from federated.backends import DistributedBackend, InProcessBackend
from federated.checkpoint import latest_round_dir, load_round, save_round
from federated.config import TrainConfig
from federated.data import SiteData, SiteLoader, label_counts
from federated.predict import predict_scores
from federated.registry import get_algorithm
from federated.state import Comm, model_state_spec, model_tensors, nbytes

RoundCallback = Callable[[dict], None]


@dataclass
class TrainResult:
    global_state: dict[str, torch.Tensor]  # state_dict of the averaged global network (on CPU)
    history: list[dict]  # one record per round: bytes, loss, and metrics when evaluated
    config: TrainConfig
    input_shape: tuple[int, ...]
    num_classes: int
    site_states: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)  # algorithm state, this process

    def model(self) -> nn.Module:
        """The global network, rebuilt from the config and loaded with the final weights."""
        net = build_network(self.config, self.input_shape, self.num_classes)
        net.load_state_dict(self.global_state)
        return net


def build_network(config: TrainConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """``linear`` / ``mlp`` for feature-vector tasks (convex tests, synthetic benchmarks); image
    networks from ``models.networks.build_network``."""
    dim = int(np.prod(input_shape))
    if config.network == "linear":
        return nn.Sequential(nn.Flatten(), nn.Linear(dim, num_classes))
    if config.network == "mlp":
        hidden = int(config.network_kwargs.get("hidden", 64))
        return nn.Sequential(nn.Flatten(), nn.Linear(dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                             nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                             nn.Linear(hidden, num_classes))
    from models.networks import build_network as build_image_network

    return build_image_network(config.network, num_classes=num_classes, in_channels=input_shape[0],
                               **config.network_kwargs)


def _input_shape(data: SiteData) -> tuple[int, ...]:
    images = data.train.images
    if images.dtype == np.uint8 or images.dtype == torch.uint8:
        return (1, *images.shape[1:3]) if images.ndim == 3 else (images.shape[3], *images.shape[1:3])
    return tuple(images.shape[1:])


class _SiteRNG:
    """Swap the global torch RNG to the site's own stream while the site computes."""

    def __init__(self, site: Site, cuda: bool):
        self.site, self.cuda = site, cuda

    def __enter__(self):
        self.saved = torch.get_rng_state()
        torch.set_rng_state(self.site.rng_state)
        if self.cuda:
            self.saved_cuda = torch.cuda.get_rng_state()
            torch.cuda.set_rng_state(self.site.cuda_rng_state)

    def __exit__(self, *exc):
        self.site.rng_state = torch.get_rng_state()
        torch.set_rng_state(self.saved)
        if self.cuda:
            self.site.cuda_rng_state = torch.cuda.get_rng_state()
            torch.cuda.set_rng_state(self.saved_cuda)


def _usable_prior(positives: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """positives / known, kept inside (0, 1) for a disease with one class only (no positive anywhere in a
    small federation, or at one site with a local prior). Such a disease never has both classes in a
    batch, so its AUC loss is zero whatever the prior; the clamp only keeps the losses' check meaningful."""
    known = known.clamp_min(1)
    eps = 0.5 / known
    return (positives / known).clamp(min=eps, max=1 - eps).float()


class Engine:
    def __init__(self, config: TrainConfig, backend=None):
        self.config = config
        local_rank = int(os.environ.get("LOCAL_RANK", "0")) if config.backend == "distributed" else 0
        self.device = config.resolve_device(local_rank)
        if backend is None:
            backend = (DistributedBackend(config.timeout_s, self.device) if config.backend == "distributed"
                       else InProcessBackend(len(config.sites)))
        self.backend = backend
        if backend.num_sites != len(config.sites):
            raise ValueError(f"the config lists {len(config.sites)} sites but the {backend.name} backend runs "
                             f"{backend.num_sites} (torchrun --nproc-per-node must equal the number of sites)")
        self.is_leader = 0 in backend.local_sites
        self.datas = [config.sites[k].load(k) for k in backend.local_sites]
        diseases = self.datas[0].diseases
        for d in self.datas[1:]:
            if d.diseases != diseases:
                raise ValueError(f"site {d.name!r} has diseases {d.diseases}, site {self.datas[0].name!r} has {diseases}")
        self.input_shape = _input_shape(self.datas[0])
        self.fed, self.weights, local_priors = self._federation(diseases)
        # Whether any site (in any process) holds a valid or test split: evaluation is a collective.
        flags = [[torch.tensor([float(any(s in d.splits for s in ("valid", "test")))], device=self.device)]
                 for d in self.datas]
        self.backend.mean_(flags, [1.0 / backend.num_sites] * len(flags))
        self.has_eval_data = bool(flags[0][0] > 0)
        self.algorithm: Algorithm = get_algorithm(config.algorithm)(config.params, self.fed)
        self.sites = [self._make_site(k, d, w, p) for k, d, w, p in
                      zip(backend.local_sites, self.datas, self.weights, local_priors)]
        self.spec = {**model_state_spec(self.sites[0].model, config.bn_stats),
                     **self.algorithm.state_spec(self.sites[0])}
        for site in self.sites:
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
        if self.algorithm.stage_length and self.algorithm.stage_length % config.local_steps:
            raise ValueError(f"stage length {self.algorithm.stage_length} must be a multiple of local_steps "
                             f"I = {config.local_steps}: stages change at communication rounds")

    # --- setup ------------------------------------------------------------------------------------
    def _federation(self, diseases):
        """Global prior and class counts from the sites' aggregate label counts (section 0)."""
        counts = []
        for data in self.datas:
            pos, known = label_counts(data.train.labels)
            counts.append([torch.tensor(pos), torch.tensor(known), torch.tensor([float(len(data.train))])])
        local = [[t.clone() for t in c] for c in counts]
        K = self.backend.num_sites
        on_device = [[t.to(self.device) for t in c] for c in counts]  # NCCL reduces device tensors only
        self.backend.mean_(on_device, [1.0 / K] * len(counts))
        pos, known, n = (t.cpu() * K for t in on_device[0])
        for c, name in enumerate(diseases):
            if known[c] == 0:
                raise ValueError(f"disease {name!r} has no known label at any site")
        prior = _usable_prior(pos, known)
        weights = ([1.0 / K] * len(self.datas) if self.config.aggregation == "uniform"
                   else [float(c[2][0] / n[0]) for c in local])
        if self.config.prior == "local":
            priors = [_usable_prior(c[0], c[1]).to(self.device) for c in local]
        else:
            priors = [prior.to(self.device)] * len(self.datas)
        fed = Federation(K, self.config.local_steps, self.config.lr, diseases, prior.to(self.device),
                         pos.float(), (known - pos).float(), self.device,
                         self.config.amp and self.device.type == "cuda",
                         self.config.channels_last and self.device.type == "cuda")
        return fed, weights, priors

    def _make_site(self, k: int, data: SiteData, weight: float, prior: torch.Tensor) -> Site:
        torch.manual_seed(self.config.seed)  # every site starts from the same initial model
        model = build_network(self.config, self.input_shape, len(data.diseases)).to(self.device)
        if self.fed.channels_last and len(self.input_shape) == 3:
            model = model.to(memory_format=torch.channels_last)
        model.train()
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
        return Site(k, data, model, loader, weight, prior, rng_state=gen.get_state(), cuda_rng_state=cuda_state)

    # --- communication ------------------------------------------------------------------------
    def _tensors(self, site: Site) -> dict[str, torch.Tensor]:
        return {**model_tensors(site.model), **site.state}

    def communicate(self, kinds: tuple[Comm, ...] = (Comm.MEAN, Comm.GATHER)) -> tuple[list[int], list[int]]:
        """Do what the declaration says for tensors of ``kinds``; bytes sent and received by each site here."""
        sent = [0] * len(self.sites)
        received = [0] * len(self.sites)
        tensors = [self._tensors(s) for s in self.sites]
        mean_names = [n for n, c in self.spec.items() if c is Comm.MEAN and c in kinds]
        for t in tensors:
            for n in mean_names:
                if (tuple(t[n].shape), t[n].dtype) != self.mean_layout[n]:
                    raise RuntimeError(f"algorithm {self.config.algorithm!r}: MEAN tensor {n!r} is now "
                                       f"{tuple(t[n].shape)} {t[n].dtype}, declared {self.mean_layout[n]}; "
                                       "a MEAN tensor must keep its shape and dtype")
        self.backend.mean_([[t[n] for n in mean_names] for t in tensors], self.weights)
        for i, t in enumerate(tensors):
            b = sum(nbytes(t[n]) for n in mean_names)
            sent[i] += b
            received[i] += b
        for name in (n for n, c in self.spec.items() if c is Comm.GATHER and c in kinds):
            own = [s.state[name] for s in self.sites]
            result = self.backend.gather(own)
            for i, site in enumerate(self.sites):
                sent[i] += nbytes(own[i])
                received[i] += nbytes(result) - nbytes(own[i])
                site.state[name] = result.clone() if len(self.sites) > 1 else result
        return sent, received

    def stage_boundary(self) -> int:
        stats = [self.algorithm.stage_statistics(s) for s in self.sites]
        names = sorted(stats[0])
        self.backend.mean_([[st[n] for n in names] for st in stats], self.weights)
        for site, st in zip(self.sites, stats):
            self.algorithm.stage_start(site, st)
        return sum(nbytes(stats[0][n]) for n in names)

    # --- evaluation ---------------------------------------------------------------------------
    def global_model(self) -> nn.Module:
        """The weighted mean of the site models (parameters and float buffers), in eval mode."""
        models = [copy.deepcopy(s.model) for s in self.sites]
        floats = [[t for t in model_tensors(m).values() if t.is_floating_point()] for m in models]
        self.backend.mean_(floats, self.weights)
        return models[0].eval()

    def _scores(self, model: nn.Module, images) -> torch.Tensor:
        scores = predict_scores(model, images, self.device, amp=self.fed.amp, channels_last=self.fed.channels_last)
        return torch.from_numpy(scores).to(self.device)  # NCCL gathers device tensors

    def evaluate(self) -> dict[str, float]:
        """Metrics of the averaged global model (models.metrics.per_site_and_pooled) on every site's
        ``valid`` and ``test`` splits: keys ``<split>/site/<k>/<metric>``, ``<split>/pooled/<metric>``
        (all sites' samples ranked together) and ``<split>/macro_over_sites/<metric>``; NaN = undefined."""
        model = self.global_model()
        result: dict[str, float] = {}
        for split in ("valid", "test"):
            scores, labels, site_ids = [], [], []
            for site in self.sites:
                part = site.data.splits.get(split)
                n = 0 if part is None else len(part)
                empty = torch.zeros(0, self.fed.num_classes, device=self.device)
                scores.append(self._scores(model, part.images) if n else empty)
                labels.append(torch.tensor(part.labels, device=self.device) if n else empty)
                site_ids.append(torch.full((n,), float(site.index), device=self.device))
            s = self.backend.gather(scores).float().cpu().numpy()
            y = self.backend.gather(labels).cpu().numpy()
            ids = self.backend.gather(site_ids).cpu().numpy()
            if len(s) == 0:
                continue
            from models.metrics import per_site_and_pooled

            sites = [int(k) for k in np.unique(ids)]
            metrics = per_site_and_pooled({str(k): y[ids == k] for k in sites}, {str(k): s[ids == k] for k in sites},
                                          list(self.fed.diseases))
            result.update({f"{split}/{key}": float(value) for key, value in metrics.items()})
        return result

    # --- the loop -----------------------------------------------------------------------------
    def run(self, callbacks: Sequence[RoundCallback] = ()) -> TrainResult:
        cfg = self.config
        history: list[dict] = []
        start_round = 0
        ckpt_dir = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        if ckpt_dir is not None and cfg.resume:
            round_dir = latest_round_dir(ckpt_dir)
            if round_dir is not None:
                meta = load_round(round_dir, self.sites)
                start_round, history = meta["round"] + 1, meta["history"]
        cuda = self.device.type == "cuda"
        bar = None
        if cfg.progress and self.is_leader:
            from tqdm.auto import tqdm

            bar = tqdm(total=cfg.rounds, initial=start_round, desc=f"{cfg.algorithm} rounds", unit="round")
        initial = ([0] * len(self.sites), [0] * len(self.sites))
        if start_round == 0 and self.algorithm.initial_gather:
            initial = self.communicate((Comm.GATHER,))
            for site in self.sites:
                self.algorithm.round_end(site)
        for r in range(start_round, cfg.rounds):
            t0 = time.perf_counter()
            losses = []
            for site in self.sites:
                with _SiteRNG(site, cuda):
                    total = torch.zeros((), device=self.device)
                    for batch in site.loader.batches(cfg.local_steps):
                        total += self.algorithm.local_step(site, batch)
                        site.iteration += 1
                    losses.append(total / cfg.local_steps)
            for site in self.sites:
                self.algorithm.before_communication(site)
            sent, received = self.communicate()
            for site in self.sites:
                self.algorithm.round_end(site)
            stage = self.algorithm.stage_length
            if stage and self.sites[0].iteration % stage == 0:
                extra = self.stage_boundary()
                sent = [b + extra for b in sent]
                received = [b + extra for b in received]
            if r == 0:
                sent = [b + extra for b, extra in zip(sent, initial[0])]
                received = [b + extra for b, extra in zip(received, initial[1])]
            per_site = torch.tensor([[float(site.index), b_s, b_r, float(loss)] for site, b_s, b_r, loss
                                     in zip(self.sites, sent, received, losses)], dtype=torch.float64)
            per_site = self.backend.gather([per_site.to(self.device) if self.device.type == "cuda" and
                                            self.backend.name == "distributed" else per_site]).cpu()
            record = {
                "round": r,
                "iteration": self.sites[0].iteration,
                "bytes_sent": [int(v) for v in per_site[:, 1]],
                "bytes_received": [int(v) for v in per_site[:, 2]],
                "train_loss": float(per_site[:, 3].mean()),
                "seconds": time.perf_counter() - t0,
            }
            last = r == cfg.rounds - 1
            if self.has_eval_data and (last or (cfg.eval_every and (r + 1) % cfg.eval_every == 0)):
                record["metrics"] = self.evaluate()
            history.append(record)
            if ckpt_dir is not None:
                save_round(ckpt_dir, r, self.sites, {"round": r, "history": history} if self.is_leader else None,
                           self.backend.barrier)
            if self.is_leader:
                for cb in callbacks:
                    cb(record)
            if bar is not None:
                bar.set_postfix(loss=f"{record['train_loss']:.4f}")
                bar.update(1)
        if bar is not None:
            bar.close()
        gm = self.global_model()
        state = {k: v.detach().cpu().clone() for k, v in gm.state_dict().items()}
        return TrainResult(state, history, cfg, self.input_shape, self.fed.num_classes,
                           {s.index: s.state for s in self.sites})


def train(config: TrainConfig | dict, callbacks: Sequence[RoundCallback] = ()) -> TrainResult:
    """Run federated training as ``config`` says. ``callbacks`` get each round's record (on site 0's
    process): ``{"round", "iteration", "bytes_sent", "bytes_received", "train_loss", "seconds",
    "metrics"?}``; ``metrics`` (evaluation rounds and the last round) is ``Engine.evaluate``'s flat dict."""
    if not isinstance(config, TrainConfig):
        config = TrainConfig.model_validate(config)
    return Engine(config).run(callbacks)


__all__ = ["Engine", "TrainResult", "build_network", "train"]
