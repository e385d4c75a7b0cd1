"""``python -m engine.lesson``: the command lives in ``engine.lab.lesson``."""

from engine.lab.lesson import main

if __name__ == "__main__":
    raise SystemExit(main())
