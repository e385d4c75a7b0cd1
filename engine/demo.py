"""``python -m engine.demo``: the command lives in ``engine.lab.demo``."""

from engine.lab.demo import main

if __name__ == "__main__":
    raise SystemExit(main())
