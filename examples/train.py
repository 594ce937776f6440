"""Train a small PyTorch model on an HDF5 file through multitables' batches.

    python examples/train.py                      # one process
    torchrun --nproc-per-node=2 examples/train.py # data-parallel, two ranks (gloo)

Writes a synthetic regression dataset (``/X``: features, ``/y``: targets) to
an HDF5 file, then trains a small network on it for a few epochs, printing
the loss after each; it falls. Each epoch visits the rows in a new shuffled
order, and with several ranks each rank gets its own share. The position is
saved with the model, so a job restarted from the checkpoint goes on with the
next batch.
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


def write_dataset(path: str, n_rows: int, n_features: int = 16, seed: int = 0) -> None:
    """``y = tanh(X @ A) @ b + noise``: learnable, not linear."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n_features, 8)) / np.sqrt(n_features)
    b = rng.standard_normal(8)
    x = rng.standard_normal((n_rows, n_features)).astype(np.float32)
    y = (np.tanh(x @ a) @ b + 0.05 * rng.standard_normal(n_rows)).astype(np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("X", data=x, chunks=(4096, n_features), compression="gzip", shuffle=True)
        f.create_dataset("y", data=y, chunks=(16384,), compression="gzip")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", help="HDF5 file to write and train on (default: a temporary file)")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=5)
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
    path = args.file or os.path.join(tmp.name, "train.h5")
    if distributed:
        shared = [path]
        dist.broadcast_object_list(shared)  # rank 0's path, so every rank reads the same file
        path = shared[0]
    if rank == 0 and not os.path.exists(path):
        write_dataset(path, args.rows)
    if distributed:
        dist.barrier()  # the file is written before anyone reads it

    stream = multitables.Streamer(path)
    batches = multitables.torch.TorchBatches(
        stream.get_batches(["/X", "/y"], batch_size=args.batch_size, shuffle=True, seed=0)
    )

    torch.manual_seed(0)
    model: torch.nn.Module = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    start_epoch = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        batches.load_state_dict(state["batches"])  # goes on with the batch after the last one trained on
        start_epoch = batches.epoch

    for epoch in range(start_epoch, args.epochs):
        batches.set_epoch(epoch)  # keeps a restored mid-epoch position
        total, rows, started = 0.0, 0, time.perf_counter()
        for x, y in batches:  # tensors, from the library's arrays without a copy
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y)
            rows += len(y)
        if args.checkpoint and rank == 0:
            # batches.state_dict() is a few numbers; rank 0's loads on every rank.
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "batches": batches.state_dict()}, args.checkpoint)
        seconds = time.perf_counter() - started
        print(f"rank {rank} epoch {epoch}: loss {total / max(rows, 1):.4f} over {rows} rows, "
              f"{len(batches)} batches, {rows / seconds:,.0f} rows/s")  # fmt: skip

    if distributed:
        dist.barrier()  # nobody reads any more: rank 0 may delete the file
        dist.destroy_process_group()
    tmp.cleanup()


if __name__ == "__main__":
    main()
