"""``python -m engine.bench``: the command lives in ``engine.lab.bench``."""

from engine.core import threads
from engine.lab.bench import main

if __name__ == "__main__":
    threads.enable()  # a busy neighbour costs its share (engine/core/threads.py)
    raise SystemExit(main())
