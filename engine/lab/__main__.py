"""``python -m engine.lab``: start the engine server and the lab page together."""

from engine.lab.launcher import main

if __name__ == "__main__":
    raise SystemExit(main())
