"""Train a small PyTorch model on a sharded, two-source HDF5 dataset through multitables' batches.

    python examples/train.py                      # one process
    torchrun --nproc-per-node=2 examples/train.py # data-parallel, two ranks (gloo)

Writes a synthetic regression dataset as two sources of shard files: the
main one (``train-000.h5 ...``) and a smaller one from another part of the
input space (``extra-000.h5 ...``), each with ``/X`` (features) and ``/y``
(targets). Each source is one dataset over its shards; batches are drawn from
the two in fixed proportions by a seeded schedule, each source shuffled
afresh every epoch and, with several ranks, shared between them. The loss is
printed after each round of steps; it falls. The position is saved with the
model, so a job restarted from the checkpoint goes on with the next batch.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import h5py
import numpy as np
import torch
import torch.distributed as dist

import multitables
import multitables.torch

N_FEATURES = 16


def write_shards(folder: str, name: str, n_rows: int, n_shards: int, scale: float, seed: int) -> None:
    """``n_shards`` files ``<name>-000.h5 ...`` of ``y = tanh(X @ A) @ b + noise``, X drawn with ``scale``.

    The function (``A``, ``b``) is the same for every source; ``seed`` draws
    the rows, ``scale`` where in the input space they lie.
    """
    fixed = np.random.default_rng(0)
    a = fixed.standard_normal((N_FEATURES, 8)) / np.sqrt(N_FEATURES)
    b = fixed.standard_normal(8)
    rng = np.random.default_rng(seed)
    bounds = np.linspace(0, n_rows, n_shards + 1).astype(int)
    for i, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
        x = (scale * rng.standard_normal((stop - start, N_FEATURES))).astype(np.float32)
        y = (np.tanh(x @ a) @ b + 0.05 * rng.standard_normal(stop - start)).astype(np.float32)
        with h5py.File(os.path.join(folder, f"{name}-{i:03d}.h5"), "w") as f:
            f.create_dataset("X", data=x, chunks=(min(4096, len(x)), N_FEATURES), compression="gzip", shuffle=True)
            f.create_dataset("y", data=y, chunks=(min(16384, len(y)),), compression="gzip")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="folder to write the shards to and train on (default: a temporary folder)")
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the main source (the other has a quarter)")
    parser.add_argument("--shards", type=int, default=8, help="files per source")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of steps to train, each as many steps as the main source has batches")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--checkpoint", help="resume from / save to this file")
    args = parser.parse_args()

    # Under torchrun, join the process group; multitables then reads rank and
    # world size from torch.distributed.
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0

    tmp = tempfile.TemporaryDirectory()
    folder = args.dir or tmp.name
    if distributed:
        shared = [folder]
        dist.broadcast_object_list(shared)  # rank 0's folder, so every rank reads the same files
        folder = shared[0]
    if rank == 0 and not os.path.exists(os.path.join(folder, "train-000.h5")):
        os.makedirs(folder, exist_ok=True)
        write_shards(folder, "train", args.rows, args.shards, scale=1.0, seed=1)
        write_shards(folder, "extra", args.rows // 4, args.shards, scale=2.0, seed=2)
    if distributed:
        dist.barrier()  # the files are written before anyone reads them

    # Each source is one dataset over its shard files; each batch comes from one source.
    train = multitables.Streamer(os.path.join(folder, "train-*.h5"))
    extra = multitables.Streamer(os.path.join(folder, "extra-*.h5"))
    sources = [
        train.get_batches(["/X", "/y"], batch_size=args.batch_size, shuffle=True, seed=0),
        extra.get_batches(["/X", "/y"], batch_size=args.batch_size, shuffle=True, seed=1),
    ]
    batches = multitables.mix_batches(sources, [0.8, 0.2], seed=0)
    steps_per_round = len(sources[0])

    torch.manual_seed(0)
    model: torch.nn.Module = torch.nn.Sequential(torch.nn.Linear(N_FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        batches.load_state_dict(state["batches"])  # goes on with the step after the last one trained on

    total, rows, started = 0.0, 0, time.perf_counter()
    for x, y in batches:  # numpy arrays of one source; to tensors without a copy
        x, y = multitables.torch.to_tensor(x, "/X"), multitables.torch.to_tensor(y, "/y")
        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item() * len(y)
        rows += len(y)
        if batches.step % steps_per_round == 0:
            if args.checkpoint and rank == 0:
                # batches.state_dict() is a few numbers per source; rank 0's loads on every rank.
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "batches": batches.state_dict()}, args.checkpoint)
            seconds = time.perf_counter() - started
            print(f"rank {rank} round {batches.step // steps_per_round - 1}: loss {total / max(rows, 1):.4f} "
                  f"over {rows} rows, step {batches.step}, {rows / seconds:,.0f} rows/s", flush=True)  # fmt: skip
            total, rows, started = 0.0, 0, time.perf_counter()
            if batches.step >= args.rounds * steps_per_round:
                break
    batches.close()

    if distributed:
        dist.barrier()  # nobody reads any more: rank 0 may delete the files
        dist.destroy_process_group()
    tmp.cleanup()


if __name__ == "__main__":
    main()
