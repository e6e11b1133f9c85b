"""One client connection and the commands it runs itself.

``connection`` (``Connection``: startup, the message loop, the simple query protocol),
``extended`` (Parse/Bind/Describe/Execute, mixed into ``Connection``), ``portals``
(prepared statements and portals), ``context`` (``CommandContext``: the narrow view of a
connection the handlers get), ``commands`` (COPY and SQL cursors in a Query or a portal),
``copy_statement`` (the COPY statement), ``copy_exchange`` (the CopyOut and CopyIn
exchanges), ``cursors`` (DECLARE/FETCH/MOVE/CLOSE), ``result_stream`` and ``spill``
(results in bounded batches), ``output`` (messages gathered into few socket writes).
"""
