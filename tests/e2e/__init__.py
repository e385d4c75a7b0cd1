"""Browser tests: one lab, one page without an engine and one Chromium for this package; torn down
when its last test ends, because a live Playwright sync session holds an event loop open on the main
thread and every later `asyncio.run` would fail."""
