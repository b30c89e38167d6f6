"""voxgate: a real-time voice gateway, text streamed in and speech streamed out.

The one import name the distribution installs. Its parts are kept in the repository's top-level folders,
which ``pyproject.toml`` maps under it (``[tool.setuptools.package-dir]``):

- ``voxgate.protocol`` (``protocol/``): the sans-I/O core (messages, session core, segmentation, codecs);
- ``voxgate.gateway`` (``gateway/``): the I/O shell (Starlette app, WebSocket and REST routes, voice store);
- ``voxgate.engine`` (``engine/``): the engine adapters (Piper, remote and in-process vllm-omni, and the
  fake one of the tests);
- ``voxgate.web`` (``web/``): the browser demo page, served as package data.

Only the command line lives here itself: ``voxgate.cli`` (the ``voxgate`` console script) and
``voxgate.client`` (``voxgate say`` / ``voxgate voices``, a client of a running gateway).
"""
