"""Every limit of Topicbase, in one place, each with its reason.

The storage's and the engine's, the PostgreSQL-wire server's (protocol facts and
Topicbase's choices; ``sql.pgwire.limits.ServerLimits`` takes its defaults from here) and
the statement text's. This module imports nothing of the project. Going over a limit raises
``LimitExceededError`` (SQLSTATE 54000) where it is checked; nothing waits or
grows without bound.
"""

from __future__ import annotations

# -- messages and batches -------------------------------------------------------------
# YDB caps a message at 120 MB after compression; a single-node Python store
# keeps it smaller so that one batch stays comfortably in memory.
MESSAGE_BYTES_MAX = 16 * 1024 * 1024
# One appended batch (its encoded body) must fit in memory twice (build + write).
BATCH_BYTES_MAX = 64 * 1024 * 1024
BATCH_MESSAGES_MAX = 100_000
# A committed transaction's share of a partition is published as frames of at most this
# many messages and about this much message data (``storage.frame_cuts``): a reader pays
# for a whole frame (docs/bounded_frames.md: 4 MiB reads cheapest per byte and keeps a
# poll of 100 messages under 1 ms).
FRAME_TARGET_BYTES = 4 * 1024 * 1024
FRAME_TARGET_MESSAGES = 4096
# An autocommit write over many partitions commits through the staging log
# (``engine.spread_append``) only if its shares average at most this much message data:
# the log writes every byte twice (the checkpoint syncs it in the partitions later), and
# a sync costs about what writing half a MiB durably does here (docs/scale.md), so big
# shares gain nothing.
SPREAD_SHARE_BYTES_MAX = 512 * 1024
# A spread publish (storage.spread_publish) encodes shares of at most this much message
# data into one body itself (a copy: the bytes FrameEncoder writes either way); larger
# shares go to FrameEncoder's zero-copy path.
SPREAD_COPIED_BYTES_MAX = 32 * 1024
# Producer ids and message group ids: YDB allows up to 2,048 bytes.
PRODUCER_ID_BYTES_MAX = 2048
METADATA_ITEMS_MAX = 64

# -- system calls -------------------------------------------------------------------
# Buffers one ``pwritev`` takes (POSIX IOV_MAX, 1024 on Linux; EINVAL past it).
# ``storage.fs`` writes longer lists of parts in runs of this many.
IOV_MAX = 1024

# -- segments and indexes -------------------------------------------------------------
SEGMENT_BYTES_DEFAULT = 64 * 1024 * 1024
SEGMENT_BYTES_MIN = 1024
# A segment rolls once it passes ``segment_bytes``, so it may exceed it by one frame;
# its offset index stores positions as uint32 (``storage.offset_index``): 2 GiB leaves
# room for that frame under 4 GiB. (Before this cap, a 4 GiB setting was accepted.)
SEGMENT_BYTES_MAX = 2 * 1024 * 1024 * 1024
SEGMENT_MS_DEFAULT = 7 * 24 * 3600 * 1000
# One offset-index entry per this many log bytes (Kafka's index.interval.bytes).
INDEX_INTERVAL_BYTES = 4096
# The writer asks the kernel to start writing a segment back to disk every this
# many bytes (``FileSystem.start_writeback``), so sealing a full segment finds
# little left to sync.
WRITEBACK_INTERVAL_BYTES = 4 * 1024 * 1024
# Synced log bytes of a partition kept in the page cache when the others are dropped
# (``storage.page_cache``, on with TOPICBASE_DROP_SYNCED_PAGES=1): tailing readers
# read the newest bytes from memory.
PAGE_CACHE_KEEP_BYTES = 16 * 1024 * 1024

# -- reads --------------------------------------------------------------------------
READ_BYTES_MAX = 256 * 1024 * 1024
READ_MESSAGES_MAX = 1_000_000
# A consumer read is a poll: without max_messages/max_bytes it returns at most this much
# (the rest is left for the next poll; a peek without them is whole, up to the READ_* above).
POLL_MESSAGES_MAX_DEFAULT = 10_000
POLL_BYTES_MAX_DEFAULT = 64 * 1024 * 1024
# Where consumers' (and members') last polls stopped, kept for fair polls
# (engine.reads.RoundRobin): the least recently polled are forgotten past this many,
# so short-lived member names do not grow memory (a forgotten one starts at the first
# partition again: fairness needs no durability).
ROUND_ROBIN_POSITIONS_MAX = 65_536
WAIT_MS_MAX = 5 * 60 * 1000

# -- topics, partitions, files --------------------------------------------------------
PARTITIONS_PER_TOPIC_MAX = 1000
TOPICS_MAX = 10_000
OPEN_FILES_MAX = 4096

# -- producers ----------------------------------------------------------------------
PRODUCER_EXPIRY_MS_DEFAULT = 14 * 24 * 3600 * 1000
PRODUCERS_PER_PARTITION_MAX = 1_000_000

# -- durability -----------------------------------------------------------------------
# Group commit: the leader may wait this long for followers before it syncs. The
# default is 0: appends that arrive while a sync runs already share the next one,
# and an idle store then pays no extra latency.
GROUP_COMMIT_WINDOW_US_DEFAULT = 0
GROUP_COMMIT_WINDOW_US_MAX = 10_000

# -- transactions -------------------------------------------------------------------
# Uncommitted offset ranges one consumer partition may hold at once (engine.catalog:
# claims of concurrent transactions waiting to commit).
PENDING_RANGES_MAX = 10_000
# Topic writes a transaction may stage before COMMIT (read back into memory at COMMIT).
TRANSACTION_STAGED_BYTES_MAX = 256 * 1024 * 1024
# Of those, what one open transaction keeps in memory; the rest waits in its spill file
# under the data directory (engine.staged_writes), so idle transactions cost disk, not RAM.
TRANSACTION_MEMORY_BYTES_MAX = 8 * 1024 * 1024
# What all open transactions together keep in memory (past it, every batch is spilled).
TRANSACTIONS_MEMORY_BYTES_MAX = 256 * 1024 * 1024
# What all open transactions together may stage, in memory and spilled: a cap on the
# disk a few sessions can fill with writes that may never commit.
TRANSACTIONS_STAGED_BYTES_MAX = 4 * 1024 * 1024 * 1024
# Commits that read spilled writes back into memory at once (each at most twice
# TRANSACTION_STAGED_BYTES_MAX while its batches are joined per partition); others wait
# their turn, so a burst of large commits cannot add up to all the machine's memory.
SPILLED_COMMITS_MAX = 2
# A transaction open longer than this is rolled back at its next statement.
TRANSACTION_DURATION_MS_MAX = 10 * 60 * 1000
# Explicit transactions open at once in one database.
OPEN_TRANSACTIONS_MAX = 1000

# Counter deltas (engine.deltas): a transaction's kept deltas take at most this many bytes
# of its commit record (bounded by ``Delta.record_bytes``); a further upsert runs the
# DuckDB way with the kept ones, so the record stays far below
# COMMIT_RECORD_PAYLOAD_BYTES_MAX.
DELTAS_RECORD_BYTES_MAX = 8 * 1024 * 1024
# Committed counter deltas not yet applied to DuckDB, database-wide (records, deltas,
# bytes by ``Delta.record_bytes``): past any of them no new delta is kept (the upsert runs
# the DuckDB way) and a commit whose deltas would go past them runs them the DuckDB way,
# so the queue, what a read or a writer waits for and what recovery applies stay bounded.
DELTAS_PENDING_RECORDS_MAX = 1024
DELTAS_PENDING_DELTAS_MAX = 4096
DELTAS_PENDING_BYTES_MAX = 32 * 1024 * 1024

# -- statement complexity and the sandboxed DuckDB (issue 10) -----------------------------
# Views over views, each checked with its owner's privileges (engine.privileges).
VIEW_DEPTH_MAX = 16
# A statement's relation reads once its views are expanded (DuckDB copies a view's query
# wherever the view is read): ``v_i AS SELECT ... FROM v_{i-1} a, v_{i-1} b`` is 2^n reads
# to bind and join (DuckDB 2.0.1, round 25: 2^10 0.11 s, 2^12 0.8 s, 2^14 3.6 s). Ordinary
# users' statements past it are refused (54000, ``engine.privileges``).
VIEW_EXPANDED_RELATIONS_MAX = 1024
# Nesting of (), [], {} and CASE ... END in one statement. Parsing and planning recurse
# once per level (sqlglot ~24 Python frames a parenthesis, DuckDB's transformer and binder
# a C++ frame or more); PostgreSQL runs a few hundred levels, so ordinary generated SQL
# (100 nested parentheses) works and anything deeper is refused (54001) before any
# parser recurses.
NESTING_DEPTH_MAX = 200
# UNION/EXCEPT/INTERSECT in one statement. DuckDB plans a chain of N set operations in
# time and memory that grow with N²: 5,000 took 4 s and 0.8 GB, 20,000 took 83 s and
# 10 GB here. 1,000 takes 0.5 s.
SET_OPERATIONS_MAX = 1000
# Python's recursion limit while Topicbase runs: sqlglot needs ~24 frames per nesting
# level to parse and print a statement, and the planner and the pg-wire rewrites walk the
# tree again. 200 levels need ~5,000 frames; the rest is headroom. Only raised, never
# lowered. Python 3.11 keeps pure-Python frames off the C stack, so this is safe on the
# default 8 MiB thread stacks.
PYTHON_RECURSION_LIMIT = 20_000
# DuckDB's own expression depth (its parser, transformer and binder), fixed at open and
# locked, so no session can raise it and crash the process with a deep expression.
DUCKDB_EXPRESSION_DEPTH_MAX = 1000
# DuckDB's binder copies expressions in two places: an alias of an earlier SELECT item
# named again (``'x' AS a, a || a AS b, b || b AS c, ...``: the item copied into each
# reference) and a macro's parameter used more than once in its body (the built-in
# ``nullif(a, b)`` is ``CASE WHEN a = b THEN NULL ELSE a END``; ``nullif(nullif(...))``
# n deep is 2^n). Both grow with width, not depth, so DUCKDB_EXPRESSION_DEPTH_MAX does not
# stop them, nor does DuckDB's memory limit. The sandbox (``planner.alias_expansion``)
# refuses (54000) a statement whose alias references and macro calls would add more than
# this many expression nodes, counted before DuckDB sees it. Measured (DuckDB 2.0.1,
# round 24): ``x + x`` chains bind at ~30 us and ~1 KiB a copied node (12 levels, 8k
# nodes: 0.25 s and 9 MiB; 16 levels, 131k: 19 s and 118 MiB); 10,000 keeps one statement
# under ~0.4 s and ~12 MiB, while ordinary alias reuse and macro calls add tens of nodes.
BIND_EXPANSION_NODES_MAX = 10_000
# DuckDB's memory limit when the data directory's owner sets none: a share of the
# machine's physical memory, leaving room for Python, the page cache and the store.
# Beyond it DuckDB spills to ``<data>/tmp``.
DUCKDB_MEMORY_FRACTION = 0.4
# The ``topicbase serve`` process's private writable memory (RLIMIT_DATA) at most, as a
# share of physical memory (sql.pgwire.memory_cap): past it an allocation fails (53200 for
# a statement's) instead of the kernel killing the server ...
PROCESS_DATA_FRACTION = 0.75
# ... but never below what the server reserves when busy within its own bounds: DuckDB's
# share (``DUCKDB_MEMORY_FRACTION``), plus this fixed part, plus
# ``PROCESS_DATA_PER_CONNECTION_BYTES`` for each of ``max_connections``. RLIMIT_DATA counts
# address space, not resident memory (thread stacks whole). Round 26 (H4), measured with
# pyarrow's pool on the system allocator (``memory_cap.ARROW_POOL_SETTING``) and both doors:
# VmData 337 MiB at rest, 525 MiB once the first session started DuckDB's threads, wrote
# and read a topic and grouped a DuckDB table (docs/security_review.md); the rest is
# headroom. (Round 24's 6 GiB floor came from pyarrow's eager 1 GiB arena and 8 MiB
# connection stacks, and put the cap above the memory of any host under ~8 GiB.)
PROCESS_DATA_OVERHEAD_BYTES = 768 << 20
# A session: its thread's stack (``CONNECTION_THREAD_STACK_BYTES``) and what it allocates
# besides (event loop, malloc arena, DuckDB's per-connection state): 5.9 MiB measured from
# 1 to 97 sessions each having grouped a DuckDB table (round 26).
PROCESS_DATA_PER_CONNECTION_BYTES = 6 << 20
# ... and never above this share of memory: where that floor is more (a 2 GiB host with the
# default 100 connections: 2.1 GiB), a server near its maximum of busy sessions gets 53200
# for an allocation past it rather than the cap be above the host's memory and catch
# nothing; ``--max-connections`` lower keeps the floor under it.
PROCESS_DATA_CEILING_FRACTION = 0.9
# The stack of a wire connection's own thread (and of its worker thread before it has
# one), instead of the 8 MiB default: every statement of the connection parses, plans and
# binds on it. Python 3.11 keeps pure-Python frames off the C stack, so the depth is
# DuckDB's (its transformer and binder recurse per expression level, up to
# ``DUCKDB_EXPRESSION_DEPTH_MAX``). Deepest measured (round 26, over the wire): a chain of
# 990 JSON ``->`` operators, 2.3 MiB; 990 ``+`` or ``NOT``, 1.5 MiB; 200 nested subqueries,
# 0.5 MiB; statements refused past a limit less. 4 MiB is ~1.7x the deepest.
CONNECTION_THREAD_STACK_BYTES = 4 << 20
# DuckDB's spill files in ``<data>/tmp`` may take at most this share of the disk space
# free when the database opens (DuckDB's own default is 90 %, which would leave topic
# appends on the same disk without room).
DUCKDB_TEMP_DISK_FRACTION = 0.25

# Relations DuckDB's join-order optimizer may be handed in one join graph of an ordinary
# user's statement (FROM items, joins, derived tables and subqueries flattened in; views as
# one: ``planner.plan_relations``). Its planning time grows ~n^3-n^4 and cannot be
# interrupted (round 26: 64 equi-joined relations 0.17 s, 96 0.94 s, 200 ~26 s, 300 288 s).
PLAN_RELATIONS_MAX = 64
# DuckDB's predicate rewrites on an ordinary user's statement (``planner.predicate_rewrites``;
# quadratic, and no interrupt ends them). The terms of the conjunctions one OR joins
# (``(a = 0 AND b = 0) OR …``: round 27, 1,000 disjuncts of two terms 1.4 s, 2,000 7.5 s),
# and the conjuncts of a statement's filters that are not plain comparisons (``a <> i``,
# ``NOT IN``, ``LIKE``, function calls …: 1,000 0.9 s, 2,000 3.3 s; through 500 chained
# CTEs 1.5 s). At these bounds the shapes measured plan in at most ~0.3 s.
PREDICATE_DISJUNCT_TERMS_MAX = 800
PREDICATE_FILTER_CONJUNCTS_MAX = 256
# Statement texts longer than this are parsed and analysed afresh each time, never kept in
# the text-keyed caches (grammar.text_cache): a few hundred entries of 16 MiB statements
# would otherwise hold gigabytes. 64 KiB keeps a 1000-placeholder INSERT cached.
CACHED_TEXT_CHARS_MAX = 64 * 1024
# The engine's kept DuckDB plans (``engine.tables.CursorPlans``) hold the constants DuckDB
# folded: a plan is kept only for a text of at most this many characters whose string
# literals are at most ``PLANNED_LITERAL_CHARS_MAX`` characters each (with no call or
# operator that makes a value larger than its largest input, each folded value is at most
# one literal, and there are fewer of them than tokens): at most ~1,024 x 128 bytes a
# plan, ~8 MiB for a cursor's 64 plans (review R2 F6, round 24).
PLANNED_TEXT_CHARS_MAX = 2048
PLANNED_LITERAL_CHARS_MAX = 128
# A session's memo of statement descriptions (engine.describe, 128 entries) keeps texts up
# to this long; longer ones (bulk INSERTs) are described afresh each time.
DESCRIBE_MEMO_TEXT_CHARS_MAX = 8192
# A parameterless SELECT of literals runs in DuckDB once per text and its one row is kept
# (engine.tables ``literal_result``): at most this many texts per way (extended, simple) of
# at most this many characters and columns; DuckDB's Arrow of a literal row holds ~2 KB a
# column, so 2 x 256 kept rows stay within ~16 MiB (review R2-F1 of round 13: without the
# column bound, 512 wide texts held ~1 GB).
LITERAL_RESULTS_MAX = 256
LITERAL_RESULT_TEXT_CHARS_MAX = 4096
LITERAL_RESULT_COLUMNS_MAX = 16
# A DuckDB cursor keeps the parsed statements of texts up to this long, of at most
# PARSED_CHARS_PER_CURSOR_MAX characters together (engine.tables, ``CursorPlans.statement``):
# DuckDB's parse of a text takes ~35 bytes of memory a character (measured: 404 KiB for
# 11.7k characters), so a cursor holds at most ~1 MiB of them; a session's repeated
# statements are short.
PARSED_TEXT_CHARS_MAX = 2048
PARSED_CHARS_PER_CURSOR_MAX = 32 * 1024

# -- storage files -------------------------------------------------------------------------
# One commit record's payload (storage.commit_log): one transaction's consumer offsets
# and publishes. Encoding a longer one is a bug (asserted).
COMMIT_RECORD_PAYLOAD_BYTES_MAX = 64 * 1024 * 1024
# A topic write committed by reference to the offset ranges it was read from
# (engine.moved_refs) names at most this many ranges (contiguous ones merged: about one per
# partition read) in its commit record, ~40 bytes each; a write from more is staged as a
# copy, so a record stays far below COMMIT_RECORD_PAYLOAD_BYTES_MAX.
MOVED_RANGES_MAX = 4096
# The staging log (storage.staging) starts a new file past this many bytes: one directory
# sync per file, not per transaction, and files small enough to delete one at a time.
STAGING_FILE_BYTES_MAX = 64 * 1024 * 1024
# The longest a write waits for its write-speed tokens (storage.autopartition's throttle);
# a write that would wait longer takes nothing and fails with 53000.
THROTTLE_DELAY_S_MAX = 10.0

# -- the PostgreSQL-wire server (sql.pgwire) ------------------------------------------------
# Protocol facts first. Not to be confused with MESSAGE_BYTES_MAX above, one topic
# message's payload: these bound messages of the PostgreSQL protocol.
# A frontend message's length as PostgreSQL accepts it at most (PQ_LARGE_MESSAGE_LIMIT,
# 1 GiB); the server's configured WIRE_MESSAGE_BYTES_MAX_DEFAULT is far lower.
WIRE_MESSAGE_LENGTH_MAX = 1 << 30
# A backend message's length word is an int32: a DataRow over this cannot be sent at all.
WIRE_ROW_MESSAGE_BYTES_MAX = 2**31 - 1
# The startup packet (user, database, options): PostgreSQL's MAX_STARTUP_PACKET_LENGTH.
WIRE_STARTUP_LENGTH_MAX = 10_000
# Parse, Bind and ParameterDescription count parameters in an unsigned Int16.
WIRE_PARAMETERS_MAX = 65535
# RowDescription and DataRow count a row's columns in a signed Int16: a result wider than
# this cannot be described (54011; PostgreSQL itself refuses a SELECT list over 1664).
WIRE_RESULT_COLUMNS_MAX = 32767
# PostgreSQL's PG_MAX_AUTH_TOKEN_LENGTH: a password or SASL message longer than this is refused.
WIRE_PASSWORD_MESSAGE_LENGTH_MAX = 65535
# Encryption requests before the StartupMessage: SSL then GSS (and back) at most this often.
WIRE_NEGOTIATION_PACKETS_MAX = 4
# PostgreSQL's NUMERIC_MAX_PRECISION: the digits of a NUMERIC value on the wire.
NUMERIC_DIGITS_MAX = 1000
# PostgreSQL's MAXDIM: the dimensions of an array parameter.
ARRAY_DIMENSIONS_MAX = 6
# A duration setting (statement_timeout, idle_session_timeout …) in ms: PostgreSQL's INT_MAX.
SETTING_DURATION_MS_MAX = 2**31 - 1
# PostgreSQL's NAMEDATALEN - 1: application_name is cut to this many bytes (PostgreSQL
# cuts only pg_stat_activity's copy so).
NAME_BYTES_MAX = 63
# The characters one wire session's settings hold, names and values together (custom
# "prefix.name" settings have no fixed number): past it SET is refused with 54000. Far
# over what drivers and applications set; 100 connections hold at most ~100 MiB of them.
SESSION_SETTINGS_CHARS_MAX = 1 << 20
# ... and at most this many settings (PostgreSQL's own ~350 and custom ones).
SESSION_SETTINGS_MAX = 1024

# Then Topicbase's choices. The server's configurable limits (``sql.pgwire.limits.
# ServerLimits``, ``topicbase serve --max-connections``) default to these.
KIB = 1024
MIB = 1024 * 1024
# Open client sockets at once (PostgreSQL's max_connections default).
CONNECTIONS_MAX_DEFAULT = 100
# One frontend message (Query, Parse, Bind, CopyData ...). 64 MiB = the largest
# batch one append may carry (BATCH_BYTES_MAX): a bigger message could not be
# written anyway, and 100 connections each holding one stay in memory.
WIRE_MESSAGE_BYTES_MAX_DEFAULT = 64 * MIB
# The text of one Query or Parse message (~3 s of parsing at ~5 MB/s).
STATEMENT_BYTES_MAX_DEFAULT = 16 * MIB
# Arrow bytes of one statement's result (Result.table.nbytes).
RESULT_BYTES_MAX_DEFAULT = 1024 * MIB
# Sockets still logging in at once (outside CONNECTIONS_MAX_DEFAULT). Logins take
# milliseconds, so 64 serve hundreds of logins a second; more only feeds a flood.
UNAUTHENTICATED_MAX_DEFAULT = 64
# Of connections_max, the slots only superusers may take (PostgreSQL's default).
SUPERUSER_RESERVED_CONNECTIONS_DEFAULT = 3
# The largest connection limit a user may be given (PostgreSQL's rolconnlimit is an int4).
CONNECTION_LIMIT_MAX = 2**31 - 1
# How long a refused client may take to send its startup packet before it is dropped.
REFUSAL_TIMEOUT_S = 10.0
# Startup negotiation packets (SSLRequest, GSSENCRequest) a refused client may send.
REFUSAL_PACKETS_MAX = 4
# Output a connection's transport may hold after a message before its loop waits for
# the client to read some (besides Sync, Flush and a Query's end, where it always does):
# a client pipelining Executes without reading cannot make the server hold more.
OUTPUT_HELD_MAX = 1 * MIB
# SQL cursors (DECLARE) one connection holds at once.
CURSORS_PER_CONNECTION_MAX = 1000
# The data of one COPY FROM STDIN, read before anything is written (as TRANSACTION_
# STAGED_BYTES_MAX bounds what a transaction stages).
COPY_IN_BYTES_MAX = 256 * MIB
# The users file (read whole at every login that finds it changed).
USERS_FILE_BYTES_MAX = 16 * MIB
# PostgreSQL truncates role names to NAMEDATALEN - 1 bytes; we refuse longer ones.
USER_NAME_BYTES_MAX = 63
PASSWORD_BYTES_MAX = 1024
# A stored SCRAM verifier with more PBKDF2 iterations is refused (cleartext checks run them).
SCRAM_ITERATIONS_MAX = 10_000_000

# -- the Arrow Flight door (sql.flight, engine.bulk_write) ----------------------------------
# One Flight command or action body (JSON naming topics, ranges, write ids); longer is 54000.
FLIGHT_COMMAND_BYTES_MAX = 1 << 20
# One body of the Flight ``stage`` action (a JSON header line and an Arrow IPC stream; a
# larger one is 54000): what one call makes the server hold besides gRPC's own copy. Twice
# MESSAGE_BYTES_MAX, so that the largest topic message fits in one part.
FLIGHT_STAGE_BODY_BYTES_MAX = 2 * MESSAGE_BYTES_MAX
# What one ``stage`` body may decode to (compressed buffers as declared, dictionary columns
# as they would be cast plain, the rest as sent), checked before pyarrow decodes it.
FLIGHT_STAGE_DECODED_BYTES_MAX = BATCH_BYTES_MAX
# ``stage`` calls decoding and staging at once (each holds up to its body and
# FLIGHT_STAGE_DECODED_BYTES_MAX decoded, plus frames being built); others wait for a turn
# up to FLIGHT_STAGE_WAIT_S, then get 53300. gRPC still holds every body it received.
FLIGHT_STAGES_MAX = 4
FLIGHT_STAGE_WAIT_S = 60.0
# Columns (at every nesting level) and record batches of one ``stage`` body; more is
# 54000 (a schema of 250,000 columns in a 27 MB body cost +379 MiB and 5 s of CPU to
# decode; 150,000 one-row batches 5.8 s). 1,664 is PostgreSQL's target-list limit.
FLIGHT_STAGE_COLUMNS_MAX = 1664
FLIGHT_STAGE_BATCHES_MAX = 10_000
# Numbered parts of one staged stream (``engine.bulk_write``): 0 .. STAGED_PARTS_MAX - 1
# (a part's number is 8 hex digits of its staged file's name).
STAGED_PARTS_MAX = 1 << 31
# Write-id prefixes an ``abort`` of ``prefix-*`` keeps closed to new writes for
# abandon_after_s; past it the oldest is forgotten first.
ABORTED_WRITE_PREFIXES_MAX = 10_000
# Bearer tokens remembered at once; past this many, a login first forgets the expired ones.
FLIGHT_TOKENS_MAX = 100_000
# Bytes of the bulk writes staged on disk and not yet committed or aborted, by default
# (the server's setting); a write past it fails with 54000.
BULK_STAGING_BYTES_MAX_DEFAULT = 16 << 30

# -- topicbase check (engine.check) ---------------------------------------------------------
# A badly damaged store could yield a problem per frame; a check's report keeps this many.
CHECK_PROBLEMS_MAX = 10_000
# Commit records live until the next checkpoint (every 256 commits); a bound all the same.
CHECK_RECORDS_MAX = 1_000_000

# -- statement text (grammar) -----------------------------------------------------------
# The whole script, in UTF-8 bytes. Big enough for tens of thousands of short VALUES
# rows; small enough that parsing stays well under a second.
SQL_TEXT_BYTES_MAX = 16 * MIB
# One path component of a topic name, or a consumer name: the common file-name limit,
# since the engine keeps topics and consumers as directories and files.
NAME_COMPONENT_BYTES_MAX = 255

# Keyless messages that may join one partition's waiting group commit in a row
# (storage.topic_log.TopicLog._keyless_partition), then round robin goes on.
KEYLESS_JOIN_MESSAGES_MAX = 64
# ... and a keyless batch joins the next round of that partition's running group commit
# (not only one that appends already wait for) while at least this many other appends
# of the topic are in progress: busy enough that the next round will have company.
KEYLESS_JOIN_BUSY_APPENDS = 6
# Keyless batches combined into one append while the topic is busy
# (storage.topic_log.TopicLog.append_keyless): at most this many messages and bytes each
# (the batch's buffers, as check_wire_batch counts them: data, metadata, offsets), and at
# most COMBINED_MESSAGES_MAX messages and COMBINED_BYTES_MAX bytes in one combined append
# (well under BATCH_BYTES_MAX, so a combined append never meets a limit its batches do
# not; it also bounds the copy that joins them).
COMBINE_MESSAGES_MAX = 64
COMBINE_BYTES_MAX = 256 * 1024
COMBINED_MESSAGES_MAX = 4096
COMBINED_BYTES_MAX = 16 * 1024 * 1024

# Read-only maps of segment files live at once (storage.file_map): far under the kernel's
# vm.max_map_count (65,530 by default); past it reads use pread.
READ_MAPS_MAX = 4096
# Runs of frames a segment remembers as verified by this process (storage.verified_frames):
# a tailing consumer and the writer extend one; a few more for consumers at other places.
# Past it the run verified longest ago is forgotten (its frames are checked again).
VERIFIED_RUNS_MAX = 8
# The body of a frame a client sends staged (COPY ... (FORMAT frames), storage.staged_frames
# .read_incoming): a frame is within the frame targets or one message alone, so its body is
# at most one message plus the metadata of a batch; a header claiming more is refused
# before the body is read.
INCOMING_FRAME_BODY_BYTES_MAX = max(FRAME_TARGET_BYTES, MESSAGE_BYTES_MAX) + MIB

# -- kept lookup plans (engine.session.Session.answer_lookup; docs/statement_cost.md round 9) --
# A session keeps the plan of each prepared primary-key lookup it answers from an index, by
# statement, while no topic is created or dropped: at most this many plans a session (then
# all are forgotten), each of a text of at most KEPT_LOOKUP_TEXT_CHARS_MAX characters, so a
# session holds at most ~16 x 4096 x 4 bytes of text (the plans share the statements the
# parse caches hold already). Longer texts are planned on every run, as before.
KEPT_LOOKUP_PLANS_MAX = 16
KEPT_LOOKUP_TEXT_CHARS_MAX = 4096

# -- kept literal plans and response bytes (engine.literal_plans, the wire's literal
# -- responses; docs/statement_cost.md round 9) --
# A session keeps the plan of each prepared parameterless SELECT of literals it runs
# (``Session.answer_literal``), by statement: at most this many a session (then all are
# forgotten); only texts of at most LITERAL_RESULT_TEXT_CHARS_MAX characters.
KEPT_LITERAL_PLANS_MAX = 16
# A wire connection keeps the encoded DataRow and CommandComplete of a kept literal row per
# result formats (sql.pgwire.connection.extended): at most this many responses (then all
# are forgotten), each of at most KEPT_LITERAL_RESPONSE_BYTES_MAX bytes (a bigger one is
# encoded every time): at most 16 x 4 KiB a connection.
KEPT_LITERAL_RESPONSES_MAX = 16
KEPT_LITERAL_RESPONSE_BYTES_MAX = 4096

# -- adopted staged frames (storage.staged_frames: a COPY's share of one partition staged
# in a file of its own, in the segment format, is renamed into the partition as a segment
# at the publish instead of being copied; round 14, H4) --
# A COPY stages at most this many partitions in files of their own (the rest go to its
# shared frames file, copied at the publish): the files' count (and their fdatasyncs at
# the commit) stays bounded whatever the partition count.
ADOPT_FILES_MAX = 16
# A partition's file is adopted when it holds at least this many bytes (below, its frames
# are copied as the shared file's are: a segment per small share would multiply the
# partition's segments) and at most ``ADOPT_BYTES_MAX`` (the offset index's positions are
# 32-bit).
ADOPT_BYTES_MIN = 4 * MIB
# A partition's frames go to the COPY's shared file until they hold this many bytes, then
# to a file of its own: a small share stays in the one shared file, as staged before. A
# frame of this many bytes or more goes to the partition's own file from the first.
ADOPT_SWITCH_BYTES = MIB
ADOPT_BYTES_MAX = 1024 * MIB

# -- caches of what is derived from statements (grammar.bounded_cache; docs/memory_bounds.md) --
# Each cache keyed by a statement's text or shape (parse trees, analyses, result schemas,
# kept rows) holds at most this many bytes of its entries' estimated costs, and all of them
# together at most TEXT_CACHES_BYTES_MAX (past it the largest give up their least recently
# used entries). A client chooses its texts, so without these 250 distinct 4 KB texts held
# ~300 MB (review R2-N1, round 13); a workload's repeated statements need far less.
TEXT_CACHE_BYTES_MAX = 16 * MIB
TEXT_CACHES_BYTES_MAX = 64 * MIB
# Named prepared statements one wire connection holds at once (Parse with a name), and
# their texts' characters together: past either, a Parse is refused with 54000 (PostgreSQL
# holds them without a bound, in a backend process of its own; here all connections share
# one process). The text bound holds a session's SQL-level PREPAREs too (engine.prepared_room).
PREPARED_STATEMENTS_PER_CONNECTION_MAX = 10_000
# SQL-level PREPAREs one session keeps in DuckDB at once (engine.prepared_room): few, since
# DuckDB keeps each one's plan with its folded constants (``SELECT repeat('x', 1e8)``: a
# 100 MB value in a 48-character statement), which no text bound sees.
SQL_PREPARED_STATEMENTS_PER_SESSION_MAX = 16
PREPARED_TEXT_CHARS_PER_CONNECTION_MAX = 16 * MIB
# Named portals (Bind with a name) one wire connection holds at once, as for cursors.
PORTALS_PER_CONNECTION_MAX = 1000

# -- the door's memo (engine.privileges.check_plan, round 10 of docs/statement_cost.md) --
# Privilege decisions a session keeps for the plans it keeps (``Session.answer_lookup``):
# at most this many, each holding its plan (kept beside it anyway) and a few small values.
DOOR_DECISIONS_MAX = 16
DOOR_DECISION_BYTES = 512

# -- the wire server's budget of held client bytes (sql.pgwire.memory_budget; round 15, H4) --
# COPY FROM STDIN data received and not yet written, and the Bind messages of the portals
# still held, across all connections of one server (``ServerLimits.held_bytes_max``): past
# it a COPY chunk or a Bind gets 53200 and the connection goes on. Each connection alone is
# bounded by COPY_IN_BYTES_MAX and its portals' messages; without this 100 connections
# could hold 25 GiB of COPY data (docs/memory_bounds.md).
WIRE_HELD_BYTES_MAX_DEFAULT = 1024 * MIB

# -- the wire server's budget of SQL cursors' spill files (sql.pgwire.spill_budget; round 26, H2) --
# A cursor's rows past spill.SPILL_BYTES go to an unlinked file in TMPDIR that lives until
# CLOSE or the connection's end. The result cap bounds each batch, not a cursor's whole
# result, and a connection keeps CURSORS_PER_CONNECTION_MAX cursors, so without a bound in
# bytes one DECLARE could fill the disk. The bytes written to spill files,
# summed over all connections of one server (``ServerLimits.spill_bytes_max``), and over the
# connections of one login, superusers included (``ServerLimits.spill_login_bytes_max``):
# past either a DECLARE gets 53400 as it writes, its file is dropped. PostgreSQL's
# analogue, ``temp_file_limit``, is per session and unlimited by default; here the disk is
# shared by every session of one process and by the data directory, so the default is
# bounded: 8 GiB for all, half of it for one user (as the held-bytes budget's login share).
CURSOR_SPILL_BYTES_MAX_DEFAULT = 8 * 1024 * MIB
CURSOR_SPILL_LOGIN_BYTES_MAX_DEFAULT = 4 * 1024 * MIB

# -- a wire connection's floor and share of the held-bytes budget (round 15, H5; review R1-6) --
# The first WIRE_HELD_BYTES_FLOOR bytes one connection holds (COPY data and Bind messages of
# held portals together) are not charged to the shared budget and never refused, so a client
# that fills the budget cannot stop the others' Binds and small COPYs; beyond it one
# connection is charged at most 1/WIRE_HELD_SHARE_DIVISOR of the budget, so it cannot fill
# the budget alone. The bytes held stay within held_bytes_max + connections_max x the floor.
WIRE_HELD_BYTES_FLOOR = 1 * MIB
WIRE_HELD_SHARE_DIVISOR = 4
# All the connections of one login together are charged at most 1/WIRE_HELD_LOGIN_DIVISOR of
# the budget (round 16): one user's parallel loads (two whole COPY_IN_BYTES_MAX COPYs beyond
# their floors at the defaults) still fit, but one user alone cannot fill the budget.
WIRE_HELD_LOGIN_DIVISOR = 2

# -- the door's facts of a session's names (engine.privileges._names_fact; round 15, lead) --
# Catalog answers one session keeps while its names do not resolve plainly (candidates of
# each name, its temporary relations): past this many they are dropped and read again.
NAMES_FACTS_MAX = 256

# -- drop-behind of written-back log bytes (storage.page_cache.drop_behind; round 16, H4) --
# A write to a partition given a drop floor (the engine's consumers' floor) drops from the
# page cache the active segment's bytes handed to writeback more than DROP_BEHIND_KEEP_BYTES
# ago (what a reader tailing the log without a consumer reads next), once at least
# DROP_BEHIND_STEP_BYTES are droppable (one DONTNEED of a few MiB, not one per frame).
DROP_BEHIND_KEEP_BYTES = 8 * 1024 * 1024
DROP_BEHIND_STEP_BYTES = 4 * 1024 * 1024

# -- a session's kept plans (engine.kept_plans; round 17, H3) --
# Plans one session keeps by statement while the topics they name are unchanged (a worker
# repeats a few statements); past this many the least recently used go. Costed by their
# text in a BoundedCache (part of TEXT_CACHES_BYTES_MAX).
KEPT_PLANS_MAX = 64

# -- zstd messages checked at staging (storage.zstd_messages; round 17, lead, review R1 F3) --
# Decompressed output the checks of client-compressed zstd frames hold at once, all threads
# together (each check's output is dropped at once; one frame declares at most
# FRAME_TARGET_BYTES + MESSAGE_BYTES_MAX): many connections sending small frames that
# declare much cannot add up past this.
ZSTD_CHECK_IN_FLIGHT_BYTES = 64 * 1024 * 1024

# -- the users file seen by open sessions (sql.pgwire.users.UsersWatch; round 18, lead) --
# The servers re-read the users file this often; a session takes the change (a superuser
# demoted, a user removed) before its next statement. A stat of a small file a second
# several times over: nothing next to the sessions' work.
USERS_FILE_POLL_S = 0.25

# -- a combined round's small batch (engine.writes; round 18, H4) --
# Up to this many values, a batch's offsets and timestamps are packed in Python (the plain
# combiner's rounds: ~7 values at 16 producers); numpy's per-call cost pays only for more.
PACKED_VALUES_MAX = 64

# -- a kept literal SELECT's flight (sql.pgwire.connection.literal_flight; round 19, H3) --
# A connection keeps the last such flight it answered: its Bind's bytes and its reply
# (BindComplete to CommandComplete), when both together take at most this many bytes; a
# bigger one is answered the longer way every time. One flight a connection.
KEPT_LITERAL_FLIGHT_BYTES_MAX = 8192

# -- own frames files vouched for by the process that staged them (engine.staged_refs
# StagedHere; round 20, H2) --
# A BulkWrites remembers the own frames files it staged and dropped from the page cache
# (storage.staged_frames.DropBehind) by identity, so its commit does not read them back
# from the disk; past this many the least recently staged are forgotten (their commit
# then reads them back, as after a restart). Two writes of 1M x 1 KiB over 4 partitions
# from 8 Spark tasks stage ~64 such files.
STAGED_HERE_FILES_MAX = 4096

# -- the staging log's pre-written window (storage.staging; round 21, H1) --
# After a small append the staging log writes zeros this far past its end (once the
# written-ahead part is below half of it), so the next appends overwrite written blocks and
# their fdatasync changes no file size (no synchronous inode write: 0.35-0.44 -> 0.22-0.29
# ms p50 for a 220 KiB sync on this machine's ext4). Appends longer than
# STAGING_PREWRITE_APPEND_BYTES_MAX (bulk writes) pre-write nothing: the zeros would double
# their bytes.
STAGING_PREWRITE_BYTES = 1 << 20
STAGING_PREWRITE_APPEND_BYTES_MAX = 64 * 1024

# -- frames whose data column is compressed whole (storage.column_codec; round 22, H1) --
# What a staged frame's compressed data values may declare as their uncompressed size,
# read from their 8-byte prefix before anything is allocated: a frame holds at most
# FRAME_TARGET_BYTES of data, or one message alone of at most MESSAGE_BYTES_MAX (both
# checked again on the decoded batch).
COLUMN_DECLARED_BYTES_MAX = max(FRAME_TARGET_BYTES, MESSAGE_BYTES_MAX)
# How many compressed frames' decoded sizes one segment remembers for the reads' budgets
# (``LogSegment.unpacked_at``): past it a read probes such frames again (~1 us each)
# instead of the memory growing with a segment of small compressed frames (a 64 MiB
# segment of ~1.2 KB frames would otherwise hold ~55k entries).
UNPACKED_REMEMBERED_MAX = 4096

# Bytes the committer holds in reserve and frees when an allocation past a commit point is
# refused under the process memory cap, to finish the transaction in-process (round 25).
COMMIT_RESERVE_BYTES = 1024 * 1024

# -- the ledger (storage.ledger; round 27, H4: issue 14, phase 1, not in the produce path) --
# A ledger file ends once it holds this many bytes (the next frame starts a new one): files
# small enough that retention deletes them one at a time behind the copy.
LEDGER_FILE_BYTES_MAX = 64 * 1024 * 1024
# A statement's frame is at most this large: a bigger statement goes to the partitions'
# segments as today (its shares are not small). The body length is a u32 in the format.
LEDGER_FRAME_BYTES_MAX = 16 * 1024 * 1024
# A share goes to the ledger only if its messages' bytes (``record_batch.data_bytes``) are at
# most this: at 1000 partitions a 5,000-message statement's shares are ~5 messages (~5 KiB),
# whose own frames cost more than their bytes (docs/scale.md, rounds 10-12).
LEDGER_SHARE_BYTES_MAX = 64 * 1024
# One copy of the ledger into the partitions' segments (``storage.ledger_copy``) reads
# whole frames until it holds this many messages: each partition then gets one frame (and
# one sync) for many statements' shares. (The read is views of the ledger's map; what a
# copy gathers at a time is ``LEDGER_COPY_PIECE_BYTES``.)
LEDGER_COPY_MESSAGES_MAX = 300_000
# A partition's copied rows go to its log in appends of at most about this many bytes (cut
# between shares), gathered this many bytes at a time: under ``BATCH_BYTES_MAX`` with room.
LEDGER_COPY_PIECE_BYTES = 16 * 1024 * 1024
# The ledger's background copier (``storage.ledger_route``; round 28, H1) runs once this
# many frames were appended since its last pass, or this long after the first of them: a
# partition's copy then carries several statements' shares (round 27 H5: ~255 ms of CPU a
# 1000-partition frame copied one frame at a time, ~40 ms at 32 frames a copy). Round 36
# (docs/scale.md): the copier's work is mostly Python per partition a pass, and it runs
# beside the statements under one interpreter lock, so fewer, larger passes cost both
# less: 48 frames and 3 s against 16 and 1 s, the copier's CPU at 1000 partitions 1.9-2.4
# against 3.0-4.4 us a message and the scale bench's produce 0.63-0.72x against 0.53-0.62x
# of 10 partitions, four alternated pairs.
LEDGER_COPY_FRAMES_MIN = 48
LEDGER_COPY_WAIT_S = 3.0
# The copier keeps the newest ledger files it has copied, up to this many bytes a topic,
# before it deletes them (``Ledger.drop_copied_files``): a consumer polling a little
# behind the producers takes their frames whole (``Ledger.whole_frames``) instead of
# reading the copies partition by partition (round 33: a 5-s backlog at 1000 partitions
# read at ~0.15x of 10 partitions from the copies, ~0.8x whole).
LEDGER_KEEP_COPIED_BYTES = 256 * 1024 * 1024
# ... and within this many shares indexed (each kept share costs ~200 bytes of index in
# memory: small messages spread over many partitions would otherwise index ~250 MiB for
# 256 MiB kept; round 34, a review). 2**17 shares: ~25 MiB, a ~10-s backlog of the scale
# bench's statements (5 messages a share).
LEDGER_KEEP_COPIED_SHARES = 2**17
# ... and only those whose last frame is at most this old (the copier's passes and the
# retention passes drop older ones; never older than the topic's own retention).
LEDGER_KEEP_COPIED_S = 60.0
# ... and past LEDGER_KEEP_COPIED_BYTES, up to this many bytes a topic while a consumer has
# not read them (``Ledger.drop_copied_files``' readers; round 35): a consumer that falls
# more than 256 MiB behind a burst (the scale bench's 5-s repetitions past ~51k msgs/s)
# still reads it whole. Disk (copies of rows the partitions hold) for a consumer's lag,
# bounded also by the shares and age limits above and the topic's retention_bytes (a
# consumer left behind for good costs a topic that much disk while producers write).
LEDGER_KEEP_UNREAD_BYTES = 512 * 1024 * 1024
# A produce statement goes to the ledger (the switch on) only if it spreads over at least
# this many partitions (one frame there instead of one per partition; fewer shares gain
# little and pay the copy).
LEDGER_SHARES_MIN = 16
# A consumer poll standing at the edges of the ledger's oldest unread frames takes them
# whole (``Ledger.whole_frames``; round 31): False makes every poll plan partition by
# partition (the read across the ledger and the segments, ``storage.bulk_scan``).
LEDGER_WHOLE_FRAMES_READ = True
# ... passing at most this many frames it has read already before it takes one (else
# the poll plans partition by partition).
LEDGER_WHOLE_WALK_MAX = 256
# -- the commit CPU (engine.commit_cpu) --------------------------------------------------
# How often (at most) a thread leaving its commit window looks for threads that appeared
# since and inherited the commit CPU from a pinned creator (Arrow's and DuckDB's pools
# start threads lazily): such a thread runs on one core for at most about this long.
COMMIT_CPU_SCAN_S = 1.0
