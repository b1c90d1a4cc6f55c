"""A site's budget over a series of jobs (docs/privacy.md section 2): every release charged once across resumes and
aborts, the ledger's lock under jobs admitted at once and an evaluation overlapping a training, per-job audit
seeds, and delta refused where it bounds nothing."""

from __future__ import annotations

import multiprocessing
import shutil

import pytest

import federated
from federated.dp.evaluation import admit_evaluation
from federated.dp.site import NOISE_SEED_ENV, SitePrivacy
from federated.engine import Engine
from federated.privacy.ledger import Entry, Ledger, epsilon, ledger_path
from federated.privacy.policy import PrivacyRefused, SiteBudget

SITE = {"kind": "synthetic", "n_train": 200, "n_test": 60, "shape": [6], "pos_rate": 0.3, "signal": 2.0}
BUDGET = SiteBudget(epsilon=200, delta=1e-5)
TRAINING_ONLY = {"noise_multiplier": 1.0, "max_grad_norm": 1.0}


def _config(ledgers, **extra):
    return {"algorithm": "fedavg", "sites": [{**SITE, "ledger": str(p)} for p in ledgers], "network": "linear",
            "rounds": 3, "local_steps": 2, "batch_size": 20, "lr": 0.1, "progress": False, "loader_workers": 0,
            "eval_every": 1, "dp": {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "eval_noise_multiplier": 5.0},
            **extra}


class CentreAborts(RuntimeError):
    pass


@pytest.fixture
def releases(monkeypatch):
    """Counts, per site, every noised step and every evaluation that leaves it; ``abort_after(n)``: the centre
    aborts right after the n-th exchange of the next run (the round sent, its checkpoint not yet committed)."""
    counted = {"steps": {}, "evaluations": 0, "abort": None, "exchanges": 0}
    gradients, communicate, evaluate = SitePrivacy.gradients, Engine.communicate, Engine.evaluate

    def count_step(self, *args):
        counted["steps"][self.name] = counted["steps"].get(self.name, 0) + 1
        return gradients(self, *args)

    def exchange(self, *args):
        out = communicate(self, *args)
        counted["exchanges"] += 1
        if counted["exchanges"] == counted["abort"]:
            raise CentreAborts("the centre aborted the job")
        return out

    def count_evaluation(self):
        counted["evaluations"] += 1
        return evaluate(self)

    monkeypatch.setattr(SitePrivacy, "gradients", count_step)
    monkeypatch.setattr(Engine, "communicate", exchange)
    monkeypatch.setattr(Engine, "evaluate", count_evaluation)

    def abort_after(n):
        counted["abort"], counted["exchanges"] = n, 0

    counted["abort_after"] = abort_after
    return counted


def test_a_sites_ledger_after_jobs_resumes_and_aborts_composes_every_release_that_left(tmp_path, releases):
    ledgers = [tmp_path / f"site{k}.privacy-ledger.json" for k in range(2)]
    for path in ledgers:
        Ledger(path, BUDGET).save()
    first = _config(ledgers, checkpoint_dir=str(tmp_path / "first"))
    federated.train(first)
    # The centre aborts after round 1's exchange: round 1 left the sites, its checkpoint was never committed.
    second = _config(ledgers, checkpoint_dir=str(tmp_path / "second"), lr=0.05)
    releases["abort_after"](2)
    with pytest.raises(CentreAborts):
        federated.train(second)
    releases["abort_after"](None)
    federated.train({**second, "resume": True})  # rounds 1 and 2 leave again, with fresh noise
    # A resume whose checkpoint is gone trains from round 0 again: every round leaves again.
    shutil.rmtree(tmp_path / "first")
    federated.train({**first, "resume": True})
    # The centre aborts a job without checkpoints after its first exchange.
    releases["abort_after"](1)
    with pytest.raises(CentreAborts):
        federated.train(_config(ledgers, lr=0.2))

    steps = releases["steps"]["synthetic0"]
    assert steps == 2 * (3 + 2 + 2 + 3 + 1)  # what left: rounds x local steps
    released = [Entry("", "training", 1.0, 0.1, steps), Entry("", "evaluation", 5.0, 1.0, releases["evaluations"])]
    for path in ledgers:
        ledger = Ledger.load(path)
        assert sum(e.steps for e in ledger.entries if e.what == "training") == steps
        assert sum(e.steps for e in ledger.entries if e.what == "evaluation") == releases["evaluations"] == 3 + 1 + 2 + 3 + 0
        assert ledger.spent(1e-5) == pytest.approx(epsilon(released, 1e-5), rel=1e-9)


def _admit_at_once(ledger, barrier, outcomes, lr):
    barrier.wait()
    try:
        federated.train(_config([ledger], rounds=1, lr=lr, dp=TRAINING_ONLY))
        outcomes.put("trained")
    except PrivacyRefused as err:
        outcomes.put(str(err))


def test_jobs_admitted_at_once_in_separate_processes_each_see_the_others_charges(tmp_path):
    """Three processes admit a job at the same moment against one ledger whose budget holds two of them: the
    ledger keeps both charges and the third is refused (unlocked, each saw nothing spent and one entry survived)."""
    path = tmp_path / "site.privacy-ledger.json"
    job = Entry("", "training", 1.0, 0.1, 2)
    two, three = epsilon([job, job], 1e-5), epsilon([job, job, job], 1e-5)
    Ledger(path, SiteBudget(epsilon=(two + three) / 2, delta=1e-5)).save()
    context = multiprocessing.get_context("fork")
    barrier, outcomes = context.Barrier(3), context.Queue()
    workers = [context.Process(target=_admit_at_once, args=(path, barrier, outcomes, 0.1 * (k + 1)))
               for k in range(3)]
    for worker in workers:
        worker.start()
    results = sorted(outcomes.get(timeout=120) for _ in workers)
    for worker in workers:
        worker.join(60)
    assert results[1:] == ["trained", "trained"], results
    assert results[0].startswith("site 'synthetic0' refuses the job: it would spend epsilon ")
    ledger = Ledger.load(path)
    assert len(ledger.entries) == 2
    assert ledger.spent(1e-5) == pytest.approx(two, rel=1e-9)


def test_an_evaluation_overlapping_a_training_keeps_the_trainings_charge(tmp_path):
    """An evaluation job admitted before a training is charged after it: its release re-reads the ledger under the
    lock and appends, instead of writing back the copy it read before the training."""
    shard_dir = tmp_path / "shards" / "north"
    shard_dir.mkdir(parents=True)
    path = ledger_path(shard_dir)
    Ledger(path, BUDGET).save()
    evaluation = admit_evaluation("north", shard_dir, ["v1"], 2.0)
    federated.train(_config([path], rounds=1, dp=TRAINING_ONLY))
    evaluation.release([])
    assert [e.what for e in Ledger.load(path).entries] == ["training", "evaluation"]


def test_an_evaluation_is_admitted_again_when_it_releases(tmp_path):
    """A training charged between an evaluation's admission and its release can leave no room for it: then
    nothing of the evaluation leaves the site."""
    shard_dir = tmp_path / "shards" / "north"
    shard_dir.mkdir(parents=True)
    path = ledger_path(shard_dir)
    alone = [epsilon([Entry("", "training", 1.0, 0.1, 2)], 1e-5), epsilon([Entry("", "evaluation", 2.0, 1.0, 1)], 1e-5)]
    Ledger(path, SiteBudget(epsilon=max(alone) * 1.02, delta=1e-5)).save()  # either fits, not both
    evaluation = admit_evaluation("north", shard_dir, ["v1"], 2.0)
    federated.train(_config([path], rounds=1, dp=TRAINING_ONLY))
    with pytest.raises(PrivacyRefused, match=r"^site 'north' refuses the job: it would spend epsilon "):
        evaluation.release([{}])
    assert [e.what for e in Ledger.load(path).entries] == ["training"]


def test_under_the_audit_seed_two_jobs_never_share_noise_or_batches(tmp_path, monkeypatch):
    monkeypatch.setenv(NOISE_SEED_ENV, "7")
    seeds = []
    attach = federated.engine.privacy.attach
    monkeypatch.setattr(federated.engine.privacy, "attach",
                        lambda sites, privacy: (seeds.append([p.seed for p in privacy]), attach(sites, privacy)))
    path = tmp_path / "site.privacy-ledger.json"
    for lr in (0.1, 0.2, 0.1):
        federated.train(_config([path], rounds=1, lr=lr, dp=TRAINING_ONLY))
    assert seeds[0] != seeds[1]  # two jobs: two streams
    assert seeds[0] == seeds[2]  # one job: reproduced, as an audit needs


@pytest.mark.parametrize("where", ["budget", "job"])
def test_a_delta_of_at_least_one_over_the_records_is_refused(tmp_path, where):
    path = tmp_path / "site.privacy-ledger.json"
    if where == "budget":
        Ledger(path, SiteBudget(epsilon=50, delta=0.5)).save()
        dp = {"noise_multiplier": 1.0}
    else:
        dp = {"noise_multiplier": 1.0, "delta": 0.01}  # 200 records: 1/200 = 0.005
    with pytest.raises(PrivacyRefused) as err:
        federated.train(_config([path], rounds=1, dp=dp))
    assert str(err.value).startswith("site 'synthetic0' refuses the job: delta ")
    assert "is not below 1 / its number of training records" in str(err.value)
    assert not Ledger.load(path).entries


def test_which_algorithms_train_under_dp_is_declared_on_their_classes():
    from federated.algorithms.fedavg import FedAvg
    from federated.dp.refusals import check_dp_job, dp_methods

    assert dp_methods() == {"fedavg": "DP-SGD", "fedprox": "DP-SGD", "scaffold": "DP-SGD", "localsgdm": "DP-SGD",
                            "codaplus": "DP-SGDA", "codasca": "DP-SGDA", "localsgdam": "DP-SGDA"}

    class Reweighted(FedAvg):  # a subclass that changes the step declares its own DP, it inherits none
        pass

    assert Reweighted.dp() is None and FedAvg.dp() == "DP-SGD"
    with pytest.raises(PrivacyRefused, match="its ratio loss weights positives by the federation's class counts"):
        check_dp_job("localsgdm_rl", {"noise_multiplier": 1.0}, False)


def test_a_site_composes_its_ledger_with_its_own_accountant_whatever_the_job_says(tmp_path):
    """The accountant is an object the site's budget names (common/accounting.py): a job that asks for RDP
    is charged at a PRV site as PRV composes it, evaluation jobs included (which name none)."""
    from common.accounting import PRV, RDP, SubsampledGaussian

    shard_dir = tmp_path / "shards" / "north"
    path = ledger_path(shard_dir)
    Ledger(path, SiteBudget(epsilon=200, delta=1e-5, accountant="prv")).save()
    spent = federated.train(_config([path], rounds=1, dp={**TRAINING_ONLY, "accountant": "rdp"})).privacy
    training = [e.mechanism for e in Ledger.load(path).entries]
    assert spent["synthetic0"]["epsilon_spent"] == pytest.approx(PRV.epsilon(training, 1e-5), rel=1e-9)
    assert PRV.epsilon(training, 1e-5) != pytest.approx(RDP.epsilon(training, 1e-5), rel=1e-3)
    evaluation = admit_evaluation("north", shard_dir, ["v1"], 2.0).privacy
    assert evaluation["epsilon_job"] == pytest.approx(PRV.epsilon([SubsampledGaussian(2.0, 1.0, 1)], 1e-5), rel=1e-9)
