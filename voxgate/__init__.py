"""voxgate: a real-time voice gateway, text streamed in and speech streamed out.

The one import name the distribution installs. Its parts are kept in the repository's top-level folders
(``protocol/``, ``engine/``, ``gateway/``, ``web/``), which this package links to:

- ``voxgate.protocol``: the sans-I/O core (messages, session core, segmentation, audio encoding);
- ``voxgate.gateway``: the I/O shell (Starlette app, WebSocket and REST routes, voice store, CLI);
- ``voxgate.engine``: the engine adapters (Piper, remote vllm-omni servers, in-process vllm-omni);
- ``voxgate/web``: the browser demo page, served as package data.
"""
