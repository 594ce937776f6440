"""Page-cache control (``multitables_bench.cache``): eviction, residency, O_DIRECT reads, the direct-driver probe.

Eviction needs a filesystem backed by a disk: on tmpfs the file *is* its
pages. The ``disk_dir`` fixture finds a directory where eviction works
(pytest's ``tmp_path``, else a scratch directory beside the repository) and
skips only where none does.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from multitables_bench import cache
from multitables_bench.cache import (
    PAGE_SIZE,
    direct_driver_available,
    evict,
    free_page_reporting,
    odirect_read_rate,
    resident_fraction,
)

MiB = 1 << 20


def _write(path: Path, nbytes: int) -> Path:
    with open(path, "wb") as f:
        f.write(os.urandom(nbytes))
        f.flush()
        os.fsync(f.fileno())
    return path


def _read_all(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(MiB):
            pass


def _filesystem(path: Path) -> str:
    """The filesystem type holding ``path`` (longest matching mount point), for skip messages."""
    real, best, fstype = os.path.realpath(path), "", "?"
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            point = left.split()[4]
            if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                best, fstype = point, right.split()[0]
    return fstype


def _can_evict(directory: Path) -> bool:
    probe = _write(directory / "evict-probe.bin", 1 * MiB)
    try:
        _read_all(probe)
        evict(probe)
        return resident_fraction(probe) < 0.5
    finally:
        probe.unlink()


@pytest.fixture
def disk_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on a filesystem where POSIX_FADV_DONTNEED drops pages."""
    if _can_evict(tmp_path):
        yield tmp_path
        return
    beside_repo = Path(__file__).resolve().parents[2]
    scratch = Path(tempfile.mkdtemp(prefix="multitables_bench_cache_test_", dir=beside_repo))
    try:
        if not _can_evict(scratch):
            pytest.skip(
                f"no filesystem here drops pages on POSIX_FADV_DONTNEED: {tmp_path} is on "
                f"{_filesystem(tmp_path)}, {scratch} on {_filesystem(scratch)}"
            )
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_a_file_just_read_is_resident(tmp_path: Path) -> None:
    path = _write(tmp_path / "f.bin", 2 * MiB + 123)
    _read_all(path)
    assert resident_fraction(path) == pytest.approx(1.0)


def test_evict_drops_every_page(disk_dir: Path) -> None:
    path = _write(disk_dir / "f.bin", 4 * MiB)
    _read_all(path)
    evict(path)
    assert resident_fraction(path) <= 0.01


def test_evict_drops_pages_still_dirty(disk_dir: Path) -> None:
    path = disk_dir / "dirty.bin"
    path.write_bytes(os.urandom(2 * MiB))  # no fsync: the pages are dirty; evict must write them back first
    evict(path)
    assert resident_fraction(path) <= 0.01


def test_residency_counts_pages(disk_dir: Path) -> None:
    """Read exactly a quarter of the pages (read-ahead off): a quarter is resident."""
    n_pages = 1024
    path = _write(disk_dir / "f.bin", n_pages * PAGE_SIZE)
    evict(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for page in range(n_pages // 4):
            os.pread(fd, PAGE_SIZE, page * PAGE_SIZE)
    finally:
        os.close(fd)
    assert resident_fraction(path) == pytest.approx(0.25, abs=0.05)


def test_empty_file_has_no_resident_pages(tmp_path: Path) -> None:
    path = tmp_path / "empty.bin"
    path.touch()
    assert resident_fraction(path) == 0.0


@pytest.mark.parametrize("func", [evict, resident_fraction, odirect_read_rate])
def test_missing_file_is_file_not_found(tmp_path: Path, func: object) -> None:
    with pytest.raises(FileNotFoundError):
        func(tmp_path / "missing.bin")  # type: ignore[operator]


def _odirect_or_skip(path: Path, **kwargs: object) -> float:
    try:
        return odirect_read_rate(path, **kwargs)  # type: ignore[arg-type]
    except OSError as exc:
        pytest.skip(f"{_filesystem(path)} refuses O_DIRECT here: {exc}")


@pytest.mark.parametrize("depth", [1, 3])
def test_odirect_reads_every_byte(disk_dir: Path, depth: int) -> None:
    size = 3 * MiB + 5000  # not a multiple of the page size: the last read is short
    path = _write(disk_dir / "f.bin", size)
    seen: list[int] = []
    rate = _odirect_or_skip(path, chunk=256 * 1024, depth=depth, progress=seen.append)
    assert sum(seen) == size
    assert rate > 0


def test_odirect_bypasses_the_page_cache(disk_dir: Path) -> None:
    path = _write(disk_dir / "f.bin", 4 * MiB)
    evict(path)
    _odirect_or_skip(path)
    assert resident_fraction(path) <= 0.01


@pytest.mark.parametrize("kwargs", [{"chunk": 0}, {"chunk": PAGE_SIZE + 1}, {"depth": 0}])
def test_odirect_rejects_bad_arguments(tmp_path: Path, kwargs: dict[str, int]) -> None:
    path = _write(tmp_path / "f.bin", PAGE_SIZE)
    with pytest.raises(ValueError):
        odirect_read_rate(path, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("engine", ["tables", "h5py"])
def test_direct_driver_probe_answers_and_cleans_up(tmp_path: Path, engine: str) -> None:
    assert isinstance(direct_driver_available(engine, tmp_path), bool)
    assert list(tmp_path.iterdir()) == []


def test_direct_driver_probe_matches_pytables(tmp_path: Path) -> None:
    """False exactly when PyTables refuses driver="H5FD_DIRECT" (the wheels: "driver is not available")."""
    import tables

    path = tmp_path / "probe.h5"
    try:
        tables.open_file(path, "w", driver="H5FD_DIRECT").close()
        opens = True
    except Exception:
        opens = False
    assert direct_driver_available("tables", tmp_path) is opens


def test_direct_driver_probe_rejects_unknown_engine() -> None:
    with pytest.raises(ValueError):
        direct_driver_available("zarr")


def test_public_names() -> None:
    assert set(cache.__all__) == {
        "evict",
        "resident_fraction",
        "odirect_read_rate",
        "direct_driver_available",
        "free_page_reporting",
        "settle_free_memory",
        "PAGE_SIZE",
    }


def _fake_virtio(root: Path, devices: dict[str, tuple[int, str]]) -> str:
    """A sysfs tree with virtio devices: name -> (device id, feature bits, bit 0 first)."""
    for name, (device, features) in devices.items():
        d = root / "bus" / "virtio" / "devices" / name
        d.mkdir(parents=True)
        (d / "device").write_text(f"0x{device:04x}\n")
        (d / "features").write_text(features + "\n")
    return str(root)


def test_free_page_reporting_is_the_balloon_reporting_feature(tmp_path: Path) -> None:
    reporting = "0110010100000000"  # bits 1, 2, 5, 7: bit 5 is VIRTIO_BALLOON_F_REPORTING
    balloon, disk = 0x0005, 0x0002
    assert free_page_reporting(_fake_virtio(tmp_path / "a", {"virtio0": (balloon, reporting), "virtio1": (disk, "0")}))
    assert not free_page_reporting(_fake_virtio(tmp_path / "b", {"virtio0": (balloon, "0110000100000000")}))
    assert not free_page_reporting(_fake_virtio(tmp_path / "c", {"virtio1": (disk, reporting)}))  # bit 5 of a disk
    assert not free_page_reporting(str(tmp_path / "no-sysfs"))


def test_settling_memory_touches_at_most_half_the_available_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "_available_memory", lambda: 64 << 20)
    assert cache.settle_free_memory(1 << 30) == 32 << 20
    assert cache.settle_free_memory(8 << 20) == 8 << 20
    assert cache.settle_free_memory(0) == 0
    monkeypatch.setattr(cache, "_available_memory", lambda: None)  # unknown: as asked
    assert cache.settle_free_memory(4 << 20) == 4 << 20
