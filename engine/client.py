"""``python -m engine.client``: the command lives in ``engine.server.chat_cli``."""

from engine.server.chat_cli import main

if __name__ == "__main__":
    raise SystemExit(main())
