"""multitables-benchmark: the command; the benchmark itself is the package ``multitables_bench``."""

from multitables_bench.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
