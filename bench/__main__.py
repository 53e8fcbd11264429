"""`python -m bench`: run the broker benchmark suite and write bench/RESULTS.md."""

from bench.cli import main

if __name__ == "__main__":  # worker processes are spawned and re-import this module: they must not run it
    raise SystemExit(main())
