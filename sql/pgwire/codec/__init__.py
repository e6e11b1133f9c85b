"""The protocol codecs: bytes to values and back, and nothing else.

``messages`` (frontend and backend messages), ``wire_types`` (type OIDs, result values and
parameters, text and binary), ``arrays`` (array parameters), ``row_encoding`` (DataRow
messages a column at a time), ``copy_format`` (COPY text and CSV) and ``copy_binary``
(binary COPY). Imports nothing of ``sql.pgwire`` outside this wing.
"""
