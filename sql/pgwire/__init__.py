"""A PostgreSQL wire-protocol (v3) front for Topicbase: ``topicbase serve``.

- ``messages``: byte codecs of frontend and backend messages (no session logic);
- ``types``: Arrow types as PostgreSQL type OIDs, values as text (and a few binary) fields,
  and parameters from the client's text or binary form;
- ``server``: the asyncio server, one engine ``Session`` per connection, statements run on
  worker threads so the event loop never waits on the engine.
"""
