"""``python -m engine.bench``: the command lives in ``engine.lab.bench`` (``vllm``: in
``engine.observe.bench``)."""

import sys

from engine.core import threads
from engine.lab.bench import main

if __name__ == "__main__":
    if sys.argv[1:2] == ["vllm"]:  # Fluxo's engine and vLLM as servers: engine/observe/bench.py
        from engine.observe.bench import main as vllm_main

        raise SystemExit(vllm_main(sys.argv[2:]))
    threads.enable()  # a busy neighbour costs its share (engine/core/threads.py)
    raise SystemExit(main())
