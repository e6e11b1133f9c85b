"""A PostgreSQL wire-protocol (v3) front for Topicbase: ``topicbase serve``.

Three wings under the server (``docs/pgwire.md`` draws who imports whom; no wing imports
one above it, and ``tests/test_layers.py`` and the import-linter contracts keep it so):

- ``server``, ``limits``, ``auth``, ``verifiers``, ``users``, ``tls``, ``login_throttle``,
  the house itself: listening, admitting and authenticating sockets;
- ``connection/``: one client connection (``Connection``) and the command handlers it
  dispatches to, which see it only through a narrow ``CommandContext``;
- ``emulation/``: PostgreSQL as clients expect it over DuckDB: the catalog relations,
  functions, types, settings, and the rewrite of catalog queries;
- ``codec/``: bytes and values: protocol messages, parameter and result values, arrays,
  DataRow encoding and the COPY formats. Pure: no session, no engine, no socket.
"""
