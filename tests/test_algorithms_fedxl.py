"""FeDXL1, FeDXL2, Local Pair, Centralized (docs/algorithms.md sections 1.4, 1.5, 7): estimators against explicit pair
loops, the pool payload (bounded, counted, scores only), multi-label masking."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from federated import Comm, SyntheticSite, TensorSite, TrainConfig, train
from federated.algorithms.centralized import centralize
from federated.engine import Engine
from models.objectives import DEFAULT_TEMPERATURE

C, P = 2, 4


def make_engine(algorithm: str, params: dict | None = None, sites=None, K: int = 2, network: str = "linear"):
    sites = sites or [SyntheticSite(n_train=40, shape=(4,), num_classes=C, pos_rate=0.4, task_seed=3, shift=0.3)
                      for _ in range(K)]
    cfg = TrainConfig(algorithm=algorithm, params={"pool_size": P, "passive_batch": 5, **(params or {})}
                      if algorithm in ("fedxl1", "fedxl2") else (params or {}), sites=sites, network=network,
                      network_kwargs={"hidden": 8} if network == "mlp" else {}, rounds=2, local_steps=3,
                      batch_size=10, lr=0.5, loader_workers=0, progress=False)
    return Engine(cfg)


def fill_passive(site, gen: torch.Generator) -> None:
    """Known pool contents with some empty (NaN) entries, the way a gathered pool looks."""
    for name, t in site.state.items():
        if name.startswith("passive."):
            values = torch.rand(t.shape, generator=gen)
            values[torch.rand(t.shape, generator=gen) < 0.3] = float("nan")
            t.copy_(values)
    site.state["passive.neg_score"][:, 1] = float("nan")  # disease 1 has no passive negatives at all
    if "passive.pos_u" in site.state:  # a sent positive always carries its u
        score, u = site.state["passive.pos_score"], site.state["passive.pos_u"]
        u.copy_(torch.where(torch.isnan(score), float("nan"), 1 + torch.rand(u.shape, generator=gen)))


def pair_loss(surrogate: str, t: torch.Tensor) -> torch.Tensor:
    if surrogate == "squared_hinge":
        return torch.clamp(1 - t, min=0) ** 2
    return 1 / (1 + torch.exp(DEFAULT_TEMPERATURE["sigmoid"] * t))


def draws(alg, site, seed: int):
    """The passive draws the estimator made after ``torch.manual_seed(seed)`` (negatives first, then positives)."""
    torch.manual_seed(seed)
    neg, vn = alg.pool.draw(site, "neg")
    pos, vp = alg.pool.draw(site, "pos")
    return neg, vn, pos, vp


@pytest.mark.parametrize("surrogate", ["squared_hinge", "sigmoid"])
def test_fedxl1_estimator_matches_pair_loops(surrogate):
    eng = make_engine("fedxl1", {"surrogate": surrogate})
    alg, site = eng.algorithm, eng.sites[0]
    fill_passive(site, torch.Generator().manual_seed(0))
    batch = next(site.loader.batches(1))
    s = torch.rand(len(batch.y), C, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(11)
    G = alg.objective(site, batch, s)
    neg, vn, pos, vp = draws(alg, site, 11)
    brute = s.sum() * 0
    for c in range(C):
        for active_pos, passive in ((True, neg["neg_score"]), (False, pos["pos_score"])):
            valid = vn if active_pos else vp
            terms = []
            for i in range(len(batch.y)):
                if batch.mask[i, c] == 0 or batch.y[i, c] != (1.0 if active_pos else 0.0):
                    continue
                for j in range(len(passive)):
                    if valid[j, c]:
                        diff = s[i, c] - passive[j, c] if active_pos else passive[j, c] - s[i, c]
                        terms.append(pair_loss(surrogate, diff))
            if terms:
                brute = brute + torch.stack(terms).mean()
    brute = brute / C
    assert torch.allclose(G, brute, atol=1e-6)
    g_est, = torch.autograd.grad(G, s)
    g_brute, = torch.autograd.grad(brute, s)
    assert torch.allclose(g_est, g_brute, atol=1e-6)
    assert vn[:, 1].sum() == 0  # an empty pool column is never drawn as valid


def test_passive_draws_are_uniform_over_valid_entries():
    eng = make_engine("fedxl1")
    alg, site = eng.algorithm, eng.sites[0]
    pool = torch.full((6, C), float("nan"))
    pool[[0, 2, 5], 0] = torch.tensor([0.1, 0.2, 0.3])
    site.state["passive.neg_score"] = pool
    alg.pool.draws = 30000
    torch.manual_seed(0)
    drawn, valid = alg.pool.draw(site, "neg")
    assert bool(valid[:, 0].all()) and not bool(valid[:, 1].any())
    freq = torch.stack([torch.isclose(drawn["neg_score"][:, 0], torch.tensor(v)).float().mean() for v in (0.1, 0.2, 0.3)])
    assert torch.allclose(freq, torch.full((3,), 1 / 3), atol=0.02)


def kl_brute(pos_s, neg_s, u_old, gamma, lam=1.0):
    """Explicit loops of docs/algorithms.md section 1.5: u update, then the surrogate whose gradient uses u."""
    u_new, loss = [], pos_s.sum() * 0
    for i in range(len(pos_s)):
        g = sum(math.exp(float(pair_loss("squared_hinge", pos_s[i].detach() - n)) / lam) for n in neg_s) / len(neg_s)
        u = g if u_old[i] == 0 else (1 - gamma) * float(u_old[i]) + gamma * g
        u_new.append(u)
        for n in neg_s:
            l_ij = pair_loss("squared_hinge", pos_s[i] - n)
            loss = loss + math.exp(float(l_ij.detach()) / lam) / u * l_ij
    return u_new, loss / (len(pos_s) * len(neg_s))


@pytest.mark.parametrize("iteration", [0, 5])
def test_fedxl2_local_step_matches_pair_loops(iteration):
    """At the first step v is the gradient itself (the paper's start; v = 0 would give beta * grad); later
    steps take the EMA of v with the new gradient."""
    eng = make_engine("fedxl2", {"gamma": 0.3, "beta": 0.2})
    alg, site = eng.algorithm, eng.sites[0]
    fill_passive(site, torch.Generator().manual_seed(1))
    site.iteration = iteration
    momentum = [site.state[f"momentum.{n}"] for n in site.parameter_names()]
    for m in momentum:
        m.copy_(torch.randn(m.shape, generator=torch.Generator().manual_seed(2)))
    v_before = [m.clone() for m in momentum]
    batch = next(site.loader.batches(1))
    site.state["u"][batch.index[:3]] = 2.0  # some positives were visited before, the others get u = g
    u_before = site.state["u"].clone()
    w = [p.detach().clone().requires_grad_() for p in site.model.parameters()]
    torch.manual_seed(5)
    alg.local_step(site, batch)
    neg, vn, pos, vp = draws(alg, site, 5)
    s = torch.sigmoid(batch.x @ w[0].T + w[1])
    G = s.sum() * 0
    for c in range(C):
        is_pos = (batch.y[:, c] == 1) & (batch.mask[:, c] == 1)
        is_neg = (batch.y[:, c] == 0) & (batch.mask[:, c] == 1)
        passive_neg = neg["neg_score"][vn[:, c], c]
        if is_pos.any() and len(passive_neg):
            u_new, part = kl_brute(s[is_pos, c], passive_neg, u_before[batch.index[is_pos], c], 0.3)
            G = G + part
            assert torch.allclose(site.state["u"][batch.index[is_pos], c], torch.tensor(u_new), rtol=1e-5)
        pool_pos, pool_u = pos["pos_score"][vp[:, c], c], pos["pos_u"][vp[:, c], c]
        terms = [math.exp(float(pair_loss("squared_hinge", pp - s[j, c].detach()))) / float(uu)
                 * pair_loss("squared_hinge", pp - s[j, c])
                 for pp, uu in zip(pool_pos, pool_u) for j in torch.nonzero(is_neg).flatten()]
        if terms:
            G = G + torch.stack(terms).mean()
    grads = torch.autograd.grad(G / C, w)
    for p, m, w0, v0, g in zip(site.model.parameters(), momentum, w, v_before, grads):
        v = g if iteration == 0 else 0.8 * v0 + 0.2 * g
        assert torch.allclose(m, v, atol=1e-6)
        assert torch.allclose(p.detach(), w0.detach() - 0.5 * v, atol=1e-6)


def test_localpair_gradient_is_exact_kl_opauc_gradient_when_u_is_fresh():
    """With gamma = 1 the stored u equals the batch inner mean, so the surrogate's gradient must be the exact
    gradient of F = mean_i lam log(mean_j exp(l_ij / lam)) over the batch's pairs (docs/algorithms.md section 1.5)."""
    eng = make_engine("localpair", {"gamma": 1.0, "lam": 0.5})
    alg, site = eng.algorithm, eng.sites[0]
    batch = next(site.loader.batches(1))
    s = torch.rand(len(batch.y), C, dtype=torch.float64, requires_grad=True)
    G = alg.objective(site, batch, s)
    F = s.sum() * 0
    for c in range(C):
        pos = [i for i in range(len(s)) if batch.y[i, c] == 1 and batch.mask[i, c] == 1]
        neg = [j for j in range(len(s)) if batch.y[j, c] == 0 and batch.mask[j, c] == 1]
        per_pos = [0.5 * torch.log(torch.stack([torch.exp(pair_loss("squared_hinge", s[i, c] - s[j, c]) / 0.5)
                                                for j in neg]).mean()) for i in pos]
        F = F + torch.stack(per_pos).mean()
    g_est, = torch.autograd.grad(G, s)
    g_exact, = torch.autograd.grad(F / C, s)
    assert torch.allclose(g_est, g_exact, atol=1e-8)


def test_pool_payload_is_bounded_scores_only_and_counted():
    K = 3
    runs = {alg: train(make_engine(alg, K=K).config) for alg in ("fedxl1", "fedxl2", "localpair")}
    eng = make_engine("fedxl2", K=K)
    gathered = {n: c for n, c in eng.spec.items() if c.value == "gather"}
    assert set(gathered) == {"pool.pos_score", "pool.pos_u", "pool.neg_score"}  # no image, label or index
    for name in gathered:
        assert eng.sites[0].state[name].shape == (P, C) and eng.sites[0].state[name].dtype == torch.float32
    payload = {"fedxl2": 3 * P * C * 4, "fedxl1": 2 * P * C * 4}
    model_bytes = runs["localpair"].history[1]["bytes_sent"][0]  # model + v, no pools
    assert runs["fedxl2"].history[1]["bytes_sent"][0] == model_bytes + payload["fedxl2"]
    assert runs["fedxl2"].history[1]["bytes_received"][0] == model_bytes + (K - 1) * payload["fedxl2"]
    # round 0 also carries the initial pools
    assert runs["fedxl2"].history[0]["bytes_sent"][0] == model_bytes + 2 * payload["fedxl2"]
    net_bytes = sum(t.numel() * t.element_size() for t in eng.sites[0].model.state_dict().values())
    assert runs["fedxl1"].history[1]["bytes_sent"][0] == net_bytes + payload["fedxl1"]  # FeDXL1 sends no v
    passive = runs["fedxl2"].site_states[0]["passive.pos_score"]
    assert passive.shape == (K * P, C)


def test_pools_sample_the_rounds_own_scores_and_skip_masked_diseases():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 4)).astype(np.float32)
    y = (rng.random((40, C)) < 0.4).astype(np.float32)
    y_masked = y.copy()
    y_masked[:, 1] = np.nan  # disease 1 is unlabeled at site 1
    sites = [TensorSite(train=(x, y)), TensorSite(train=(x, y_masked))]
    eng = make_engine("fedxl2", sites=sites)
    alg = eng.algorithm
    eng.communicate((Comm.GATHER,))  # the initial pools, as Engine.run does before round 0
    eng.each_site(alg.round_end)
    for site in eng.sites:
        with site.rng():
            for batch in site.loader.batches(3):
                alg.local_step(site, batch)
                site.iteration += 1
            buffer = {f: site.state[f"buffer.{f}"].clone() for f in ("pos_score", "neg_score", "pos_u")}
            label = site.state["buffer.label"].clone()
            alg.before_communication(site)
        for c in range(C):
            for kind, value in (("pos", 1.0), ("neg", 0.0)):
                sent = site.state[f"pool.{kind}_score"][:, c]
                assert sent.shape == (P,)
                if site.index == 1 and c == 1:  # no label of disease 1 at this site: nothing to send
                    assert bool(torch.isnan(sent).all())
                    continue
                rows = label[:, c] == value
                if kind == "pos":
                    rows &= buffer["pos_u"][:, c] > 0
                assert rows.any()
                own = buffer[f"{kind}_score"][rows, c]
                assert all(bool((own == v).any()) for v in sent)  # only this round's scores of that class
        sent_u = site.state["pool.pos_u"][:, 0]
        assert bool((sent_u >= 1).all())  # u = mean exp(l) >= 1
    result = train(eng.config)
    assert np.isfinite(result.history[-1]["train_loss"])


def test_payload_is_p_rows_drawn_with_replacement_from_the_rounds_scores():
    """The kept deviation from the paper (docs/algorithms.md section 7): not every score of the round but P rows
    per class and disease drawn with replacement. A class with one row in the round sends it P times; one with
    more than P distinct rows can repeat a row (neither a draw without replacement nor the paper's payload of
    every row would)."""
    eng = make_engine("fedxl1")
    alg, site = eng.algorithm, eng.sites[0]
    label = site.state["buffer.label"]
    scores = torch.arange(len(label) * C, dtype=torch.float32).reshape(-1, C)
    repeats = 0
    for seed in range(10):
        label.fill_(0.0)
        label[0, 0] = 1.0  # disease 0: one positive this round
        label[:10, 1] = 1.0  # disease 1: ten positives, more than P
        site.state["buffer.pos_score"].copy_(scores)
        torch.manual_seed(seed)
        alg.pool.payload(site)
        sent = site.state["pool.pos_score"]
        assert sent.shape == (P, C)
        assert bool((sent[:, 0] == scores[0, 0]).all())
        assert set(sent[:, 1].tolist()) <= set(scores[:10, 1].tolist())
        repeats += len(set(sent[:, 1].tolist())) < P
    assert 0 < repeats < 10


@pytest.mark.parametrize("algorithm", ["fedxl1", "fedxl2"])
def test_pool_payload_does_not_reveal_the_positive_count(algorithm):
    """Site 0 has 2 positives per disease in one federation and 30 in the other: the payload has the same
    size, holds no padding (every entry is a real score), and the bytes sent are identical."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((60, 4)).astype(np.float32)
    other = (rng.random((60, C)) < 0.5).astype(np.float32)
    payloads, sent = [], []
    for positives in (2, 30):
        y = np.zeros((60, C), dtype=np.float32)
        y[rng.permutation(60)[:positives]] = 1.0
        eng = make_engine(algorithm, sites=[TensorSite(train=(x, y)), TensorSite(train=(x, other))])
        result = train(eng.config.model_copy(update={"guarantee_positives": True}))
        pool = result.site_states[0]["pool.pos_score"]  # the last round's gathered payloads: site 0 first
        assert pool.shape == (2 * P, C) and bool(torch.isfinite(pool).all())
        payloads.append(pool[:P])
        sent.append([h["bytes_sent"] for h in result.history])
    assert payloads[0].shape == payloads[1].shape and sent[0] == sent[1]


def test_tau_keeps_the_newest_rounds():
    eng = make_engine("fedxl1", {"tau": 2})
    site = eng.sites[0]
    rows = eng.fed.num_sites * P
    for r, value in enumerate((0.25, 0.5, 0.75)):
        site.iteration = r * eng.config.local_steps
        for name in ("pool.pos_score", "pool.neg_score"):
            site.state[name] = torch.full((rows, C), value)
        eng.algorithm.round_end(site)
    kept = site.state["passive.pos_score"]
    assert sorted(set(kept.flatten().tolist())) == [0.5, 0.75]  # round 0's pool was replaced


def test_centralized_needs_one_site_and_centralize_merges_data():
    eng = make_engine("fedxl2", K=3)
    with pytest.raises(ValueError, match="centralize"):
        make_engine("centralized", K=3)
    cfg = centralize(eng.config)
    assert cfg.algorithm == "centralized" and len(cfg.sites) == 1 and cfg.batch_size == 3 * eng.config.batch_size
    merged = cfg.sites[0].load(0)
    assert len(merged.train) == sum(len(s.data.train) for s in eng.sites)
    result = train(cfg.model_copy(update={"params": {}}))
    assert np.isfinite(result.history[-1]["train_loss"])


def test_fedxl2_across_processes_gives_the_in_process_model(tmp_path):
    """Pools through torch.distributed all_gather (gloo, one process per site): same model, same bytes."""
    from test_engine_distributed import _env, _free_port

    sites = [SyntheticSite(n_train=60, shape=(5,), num_classes=C, pos_rate=0.3, shift=0.5 * k, task_seed=2)
             for k in range(2)]
    cfg = TrainConfig(algorithm="fedxl2", params={"pool_size": P, "passive_batch": 6}, sites=sites, network="mlp",
                      network_kwargs={"hidden": 8}, rounds=3, local_steps=2, batch_size=12, lr=0.3,
                      loader_workers=0, progress=False, timeout_s=30, guarantee_positives=True)
    (tmp_path / "cfg.json").write_text(cfg.model_dump_json())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), "-m", "federated.distributed", str(tmp_path / "cfg.json"),
           "--out", str(tmp_path / "result.pt")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = torch.load(tmp_path / "result.pt", weights_only=False)
    mine = train(cfg)
    for key, value in mine.global_state.items():
        assert torch.allclose(value.float(), theirs["global_state"][key].float(), atol=1e-5), key
    for a, b in zip(mine.history, theirs["history"]):
        assert a["bytes_sent"] == b["bytes_sent"] and a["bytes_received"] == b["bytes_received"]
