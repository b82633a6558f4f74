"""The serving wing: everything about running the host as a process, none of it the ASGI app.

- `cli`: the `retrieval-host` command (serve, token new, ingest, quickstart);
- `factory`: loading the application factory the configuration names, and calling it;
- `wiring`: the adapters a host configuration names (store, run records, providers), for
  application factories;
- `server`, `server_protocol`: uvicorn with the host's TLS policy, header deadlines, the
  loopback metrics port and the graceful shutdown;
- `workers`: the supervisor of `listen.workers` processes on one port;
- `tls`: the server TLS context and the local CA the quickstart makes;
- `tokens`: new bearer tokens and their configuration entries;
- `quickstart`: a local HTTPS host with sample documents in one command.

It sits above `http` (the ASGI app) and the Driver; nothing below imports it.
"""
