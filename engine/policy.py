"""``python -m engine.policy``: the command lives in ``engine.lab.score_cli``."""

from engine.lab.score_cli import main

if __name__ == "__main__":
    raise SystemExit(main())
