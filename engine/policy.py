"""``python -m engine.policy``: the command lives in ``engine.lab.score_cli``."""

from engine.core import threads
from engine.lab.score_cli import main

if __name__ == "__main__":
    threads.enable()  # a busy neighbour costs its share (engine/core/threads.py)
    raise SystemExit(main())
