"""``python -m engine.bench``: the command lives in ``engine.lab.bench``."""

from engine.lab.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
