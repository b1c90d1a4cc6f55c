"""A heterogeneous federation for the claims family (docs/claims.md, "Claim (a) on a heterogeneous federation"):
8 to 16 sites drawn from the claims benchmark's phantom clinics, with the three skews the federated benchmarks
measure heterogeneity by.

- **Label skew.** The federation's positives are shared out over the sites by a Dirichlet(alpha) draw, the
  partition of Hsu et al. 2019 ("Measuring the effects of non-identical data distribution"), which the
  federated-learning benchmarks since use for label skew. Small alpha concentrates the positives at a few
  sites: a site's positive rate ranges from one positive in its rows to a majority. Every site keeps at least
  one positive, so that every site's AUC loss is defined.
- **Quantity skew.** The sites' sizes are a second Dirichlet(beta) draw, floored at ``min_rows``.
- **Feature skew.** Each site is one clinic's dermoscope (colour cast, vignette, blur: ``preprocessing.synth``'s
  profiles, through the real preprocessing) seen through the site's own acquisition chain: a colour gain per
  channel, a windowing curve (gamma, contrast, brightness) and an acquisition resolution (the image taken at
  1/2 or 1/1 of the shared size and brought back to it). That is FedDG's and Flamby's natural split (a site is a
  device and a protocol) made stronger than three real devices are, and FeDXL's site-specific input shift
  (docs/algorithms.md section 10) made structured. A site's evaluation rows go through the same chain: each
  site scores its own kind of images.

The CODASCA paper's heterogeneous splits give each machine its own classes; a binary melanoma task has two,
so the label skew here is that of rates, not of classes, and the per-site acquisition stands in for the
class-conditional image differences between the paper's machines.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from benchmarks.claims.runs import CLINICS, VALIDATION_SEED, Pool
from federated import TensorSite
from preprocessing.records import MELANOMA_DISEASES


@dataclass(frozen=True)
class Heterogeneity:
    """How unlike each other the sites are. The defaults are the federation docs/claims.md reports."""

    sites: int = 8
    rows: int = 1200  # training rows in the whole federation
    rate: float = 0.1  # the federation's positive rate
    alpha: float = 0.3  # label skew: Dirichlet concentration of the positives' shares over sites
    beta: float = 2.0  # quantity skew: Dirichlet concentration of the sites' sizes
    min_rows: int = 40
    acquisition: float = 1.0  # feature skew: 0, every site sees its clinic's images unchanged; 1, the reported spread

    def __post_init__(self):
        if not 2 <= self.sites <= 64:
            raise ValueError(f"sites must be in [2, 64], got {self.sites}")
        if self.sites * self.min_rows > self.rows:
            raise ValueError(f"{self.sites} sites of at least {self.min_rows} rows need {self.sites * self.min_rows} "
                             f"rows; rows is {self.rows}")
        if self.rate * self.rows < self.sites:
            raise ValueError(f"{self.rows} rows at {self.rate:.0%} hold fewer positives than the {self.sites} sites, "
                             "each of which needs one: raise rows or rate")

    def describe(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Acquisition:
    """One site's acquisition chain: what it does to every image it takes, its own rows and its test rows alike."""

    clinic: str
    gain: tuple[float, float, float]  # colour gain per channel
    gamma: float  # windowing: the intensity curve x ** gamma
    contrast: float  # around mid-grey
    brightness: float
    downsample: int  # 1: the shared resolution; 2: taken at half of it and brought back

    def apply(self, images: np.ndarray) -> np.ndarray:
        """uint8 (N, H, W, 3) -> uint8 (N, H, W, 3) as this site acquires them."""
        x = (images.astype(np.float32) / 255.0) ** self.gamma
        x = (x - 0.5) * self.contrast + 0.5 + self.brightness
        x = x * np.asarray(self.gain, dtype=np.float32)
        if self.downsample > 1:
            f = self.downsample
            n, h, w, c = x.shape
            x = x.reshape(n, h // f, f, w // f, f, c).mean(axis=(2, 4)).repeat(f, axis=1).repeat(f, axis=2)
        return (np.clip(x, 0.0, 1.0) * 255 + 0.5).astype(np.uint8)


@dataclass(frozen=True)
class Draw:
    """One federation's draw: per site its rows, its positives (``shares``: the Dirichlet draw they follow) and
    its acquisition."""

    sizes: np.ndarray
    shares: np.ndarray
    positives: np.ndarray
    acquisitions: tuple[Acquisition, ...]

    @property
    def rates(self) -> np.ndarray:
        return self.positives / self.sizes


def _apportion(total: int, shares: np.ndarray, floor: int, cap: np.ndarray | None = None) -> np.ndarray:
    """Integers summing to ``total``, each >= ``floor`` (and <= ``cap``), closest to ``total * shares``
    (largest remainder over what is left after the floors)."""
    k = len(shares)
    cap = np.full(k, total) if cap is None else cap
    counts = np.full(k, floor)
    for _ in range(k + 1):  # each pass fills the sites that hit their cap; the rest share what is left
        left = total - counts.sum()
        room = cap - counts
        if left <= 0 or not room.any():
            break
        weights = np.where(room > 0, shares, 0.0)
        ideal = left * weights / weights.sum()
        add = np.minimum(np.floor(ideal).astype(int), room)
        order = np.argsort(-(ideal - np.floor(ideal)))
        short = left - add.sum()
        for i in order:
            if short <= 0:
                break
            if add[i] < room[i]:
                add[i] += 1
                short -= 1
        counts += add
    return counts


def draw(h: Heterogeneity, seed: int) -> Draw:
    """The sites' sizes, positives and acquisitions of federation ``seed`` (no images: cheap, and what a test checks)."""
    rng = np.random.default_rng([seed, 57])
    sizes = _apportion(h.rows, rng.dirichlet(np.full(h.sites, h.beta)), h.min_rows)
    shares = rng.dirichlet(np.full(h.sites, h.alpha))
    # A site keeps at least one positive and one negative; what a full site cannot take goes to the others by share.
    positives = _apportion(int(round(h.rate * h.rows)), shares, 1, cap=sizes - 1)
    s = h.acquisition
    acquisitions = []
    for k in range(h.sites):
        acquisitions.append(Acquisition(
            clinic=CLINICS[k % len(CLINICS)][0],
            gain=tuple(float(g) for g in np.exp(rng.normal(0.0, 0.2 * s, 3))),
            gamma=float(np.exp(rng.normal(0.0, 0.4 * s))),
            contrast=float(np.exp(rng.normal(0.0, 0.3 * s))),
            brightness=float(rng.normal(0.0, 0.08 * s)),
            downsample=2 if s > 0 and rng.random() < 0.5 else 1))
    return Draw(sizes, shares, positives, tuple(acquisitions))


def heterogeneous_federation(pool: Pool, h: Heterogeneity, seed: int) -> tuple[list[TensorSite], Draw]:
    """Federation ``seed``: each site's training rows drawn without replacement from its clinic's train split
    (no row at two sites), its evaluation rows a disjoint share of its clinic's evaluation split (the valid split
    for validation seeds, from ``VALIDATION_SEED`` up; the test split otherwise), both through its acquisition."""
    d = draw(h, seed)
    rng = np.random.default_rng([seed, 58])
    evaluation = "valid" if seed >= VALIDATION_SEED else "test"
    available = {}
    for profile, _ in CLINICS:
        y = pool.splits[profile]["train"][1]
        available[profile] = [list(rng.permutation(np.flatnonzero(y == label))) for label in (0, 1)]
    members = {profile: [k for k, a in enumerate(d.acquisitions) if a.clinic == profile] for profile, _ in CLINICS}
    sites = []
    for k, (size, n_pos, acquisition) in enumerate(zip(d.sizes, d.positives, d.acquisitions)):
        negatives, positives = available[acquisition.clinic]
        if n_pos > len(positives) or size - n_pos > len(negatives):
            raise ValueError(f"site {k} ({acquisition.clinic}): {size} rows with {n_pos} positives exceed what its "
                             f"clinic's train split has left ({len(positives)} positives, {len(negatives)} negatives): "
                             "build the pool larger or the federation smaller")
        rows = np.sort(np.array([positives.pop() for _ in range(n_pos)] +
                                [negatives.pop() for _ in range(size - n_pos)], dtype=int))
        x, y = pool.splits[acquisition.clinic]["train"]
        xe, ye = pool.splits[acquisition.clinic][evaluation]
        mine = np.arange(len(ye))[members[acquisition.clinic].index(k)::len(members[acquisition.clinic])]
        sites.append(TensorSite(name=f"site-{k:02d}", diseases=MELANOMA_DISEASES,
                                train=(acquisition.apply(x[rows]), y[rows].astype(np.float32)[:, None]),
                                test=(acquisition.apply(xe[mine]), ye[mine].astype(np.float32)[:, None])))
    return sites, d
