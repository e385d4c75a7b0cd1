"""``python -m engine.client``: the command lives in ``engine.server.client``."""

from engine.server.client import main

if __name__ == "__main__":
    raise SystemExit(main())
