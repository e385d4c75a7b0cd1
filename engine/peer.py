"""``python -m engine.peer``: the command lives in ``engine.lab.peer``."""

from engine.lab.peer import main

if __name__ == "__main__":
    raise SystemExit(main())
