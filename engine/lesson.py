"""``python -m engine.lesson``: the command lives in ``engine.lab.lesson``."""

from engine.core import threads
from engine.lab.lesson import main

if __name__ == "__main__":
    threads.enable()  # a busy neighbour costs its share (engine/core/threads.py)
    raise SystemExit(main())
