"""What NVIDIA FLARE's transport costs a training: the same job in-process, as an NVFlare simulator job and on a
provisioned consortium on this machine (POC: our kits, server and three hospital clients as processes,
mutual TLS, submitted with the admin's kit as against a real consortium).

Three dermatology clinics like the demo's (synthetic SIIM-ISIC sites, real shards at ``--image`` px), the
demo network (small_resnet), CODASCA. Both runs train the same model (tests/test_flare.py checks that bit
for bit); the engine's own round records give each round's seconds and bytes. Printed per mode: wall time,
job start-up (wall minus the rounds: NVFlare starts a server and one process per site), the median round,
and the bytes each site sends and receives per round. The transport's cost per round is a flare mode's
median round minus the in-process one. The POC's own start (provisioning, server and clients up and
admitted) is printed apart: a real consortium runs for many jobs. Target: at most 0.5 s per round. On a 2-core machine the simulator's three
site processes share the cores while in-process trains the sites one after the other, so the difference
also holds that scheduling; ``--local-steps 1`` makes communication dominate.

With ``secure_aggregation`` (docs/algorithms.md section 13) the simulator and the POC consortium run the job
again (on the POC the sites sign their keys with their kits): the rows ``-secure`` give its bytes and round
seconds, against the plain rows. Targets: at most 2x the plain bytes, under 0.5 s added per round.

Also printed: the serialised size of one mean collective (what a site's call carries, one pickle each way)
against the model's parameter bytes, to show there is no copy of the model per site beyond that.

    python -m benchmarks.throughput.flare [--rounds 5] [--local-steps 1] [--images 160] [--image 32]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import federated
from federated.backends import dtype_groups, flatten
from federated.flare.centre.job import train_flare
from federated.flare.centre.poc import LocalConsortium
from federated.sites import federation_config
from preprocessing.federation import load_federation
from testbed.federations import DERMATOLOGY_CLINICS, phantom_federation

TARGET_S = 0.5  # transport seconds per round


def summarise(mode: str, wall: float, history: list[dict]) -> dict:
    rounds = [r["seconds"] for r in history]
    return {"mode": mode, "wall_s": wall, "startup_s": wall - sum(rounds), "median_round_s": statistics.median(rounds),
            "sent_per_site_round": statistics.mean(sum(r["bytes_sent"]) / len(r["bytes_sent"]) for r in history),
            "received_per_site_round": statistics.mean(sum(r["bytes_received"]) / len(r["bytes_received"])
                                                       for r in history)}


def mean_payload_bytes(state: dict[str, torch.Tensor]) -> tuple[int, int]:
    """(pickled bytes of one mean collective over the model's floating tensors, their raw bytes)."""
    tensors = [t for t in state.values() if t.is_floating_point()]
    flats = [flatten([tensors[i] for i in idx]) for idx in dtype_groups(tensors).values()]
    buffer = io.BytesIO()
    torch.save({"weight": 1.0, "flats": flats}, buffer)
    return buffer.getbuffer().nbytes, sum(t.numel() * t.element_size() for t in tensors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--local-steps", type=int, default=1)
    parser.add_argument("--images", type=int, default=160, help="per site")
    parser.add_argument("--image", type=int, default=32, help="pixels")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"  # the site processes inherit it; this process too
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print(f"preparing 3 sites x {args.images} images at {args.image} px ...", flush=True)
        federation = load_federation(phantom_federation(root / "melanoma.yaml", "bench-melanoma", "melanoma",
                                                        DERMATOLOGY_CLINICS, n=args.images, image_size=args.image))
        settings = dict(algorithm="codasca", params={"T0": 4}, network="small_resnet", rounds=args.rounds,
                        local_steps=args.local_steps, batch_size=32, lr=0.1, eval_every=0, progress=False,
                        loader_workers=0, device="cpu")
        config = federation_config(federation, root / "shards", settings)
        print("in-process ...", flush=True)
        started = time.perf_counter()
        local = federated.train(config)
        rows = [summarise("in-process", time.perf_counter() - started, local.history)]
        print("NVFlare SimEnv ...", flush=True)
        started = time.perf_counter()
        flare = train_flare(config, federation, root / "shards", "sim", root / "flare", name="bench")
        rows.append(summarise("flare-sim", time.perf_counter() - started, flare.history))
        secure = config.model_copy(update={"secure_aggregation": True})
        print("NVFlare SimEnv, secure aggregation ...", flush=True)
        started = time.perf_counter()
        flare_secure = train_flare(secure, federation, root / "shards", "sim", root / "flare-secure", name="bench-secure")
        rows.append(summarise("flare-sim-secure", time.perf_counter() - started, flare_secure.history))
        print("NVFlare POC consortium ...", flush=True)
        started = time.perf_counter()
        with LocalConsortium(federation, root / "shards", root / "poc") as consortium:
            consortium_start = time.perf_counter() - started
            started = time.perf_counter()
            # Submitted as to a real consortium (the admin's kit); the sites inherited OMP_NUM_THREADS=1.
            poc = train_flare(config, federation, None, "prod", root / "poc" / "submit", kit=consortium.kits.admin,
                              name="bench")
            rows.append(summarise("flare-poc", time.perf_counter() - started, poc.history))
            started = time.perf_counter()
            poc_secure = train_flare(secure, federation, None, "prod", root / "poc" / "submit-secure",
                                     kit=consortium.kits.admin, name="bench-secure")
            rows.append(summarise("flare-poc-secure", time.perf_counter() - started, poc_secure.history))
    print(f"\n3 sites, small_resnet, CODASCA, {args.rounds} rounds x I={args.local_steps}, evaluation off")
    print(f"{'mode':<16} {'wall s':>8} {'start-up s':>11} {'median round s':>15} {'sent B/site/round':>18} "
          f"{'received B/site/round':>22}")
    for r in rows:
        print(f"{r['mode']:<16} {r['wall_s']:>8.2f} {r['startup_s']:>11.2f} {r['median_round_s']:>15.3f} "
              f"{r['sent_per_site_round']:>18,.0f} {r['received_per_site_round']:>22,.0f}")
    by_mode = {row["mode"]: row for row in rows}
    for row in rows[1:]:
        if row["mode"].endswith("-secure"):
            continue
        overhead = row["median_round_s"] - rows[0]["median_round_s"]
        verdict = "meets" if overhead <= TARGET_S else "MISSES"
        print(f"{row['mode']} transport per round: {overhead:+.3f} s ({verdict} the target <= {TARGET_S} s)")
    for mode in ("flare-sim", "flare-poc"):
        plain, masked = by_mode[mode], by_mode[f"{mode}-secure"]
        added, ratio = masked["median_round_s"] - plain["median_round_s"], masked["sent_per_site_round"] / plain["sent_per_site_round"]
        print(f"{mode} secure aggregation: {ratio:.2f}x the bytes (target <= 2), {added:+.3f} s per round "
              f"({'meets' if added < TARGET_S else 'MISSES'} the target < {TARGET_S} s)")
    same = all(torch.equal(poc_secure.global_state[k], v) for k, v in flare_secure.global_state.items())
    print(f"secure aggregation: POC model {'equals' if same else 'DIFFERS FROM'} the simulator's bit for bit")
    print(f"POC consortium start (provisioning, server and 3 clients admitted), once: {consortium_start:.1f} s")
    worst = max((poc.global_state[k].float() - v.float()).abs().max().item() for k, v in local.global_state.items())
    print(f"POC model vs in-process: max abs parameter difference {worst:.2e}")
    pickled, raw = mean_payload_bytes(local.global_state)
    print(f"one mean collective: {pickled:,} B serialised for {raw:,} B of floating tensors "
          f"(ratio {pickled / raw:.3f}; one serialisation each way per collective)")


if __name__ == "__main__":
    main()
