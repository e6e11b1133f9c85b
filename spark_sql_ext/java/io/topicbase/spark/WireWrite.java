package io.topicbase.spark;

import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.UUID;

import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowStreamWriter;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.SupportsTruncate;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.connector.write.streaming.StreamingDataWriterFactory;
import org.apache.spark.sql.connector.write.streaming.StreamingWrite;
import org.apache.spark.sql.execution.arrow.ArrowWriter;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.ArrowUtils;

/**
 * A catalog topic's batch write in the JVM, over the PostgreSQL wire (no Python worker):
 * the staged-write protocol of {@code topicbase serve} spoken in SQL.
 *
 * <ul>
 * <li>Each task ({@link TaskWriter}) whose rows name their partition (and whose columns
 * {@link WireFrames#eligible} allows) groups them by partition itself and sends them as
 * staged partition frames in {@code COPY TOPIC t FROM STDIN (FORMAT frames, WRITE_ID
 * '<id>')} ({@link WireFrames}): the server checks each frame and writes it as it came.
 * Other tasks turn their rows into Arrow record batches of at most {@code writeBatchRows}
 * rows (default 4096) with Spark's {@link ArrowWriter} and stream them as ONE Arrow IPC
 * stream in {@code COPY TOPIC t (columns) FROM STDIN (FORMAT arrow, WRITE_ID '<id>')}; so
 * does a frames task from its first row that a frame cannot hold (a second COPY of the same
 * id), and every task with the option {@code writeFrames=false}. Either way each task uses
 * its own connection, the server stages the rows under the task's write id and publishes
 * nothing. Its commit message carries the id; a task without rows stages nothing. A failing
 * task gives its COPY up (CopyFail) and sends {@code ABORT WRITES}.
 * <li>The driver's commit ({@link Batch#commit}) publishes every task's write at once:
 * {@code COMMIT WRITES ('id', ...) SINK '<sink>' BATCH <n>}, one transaction with the
 * idempotency record (sink, batch): a replay of the same record publishes nothing. The sink
 * id is the option {@code sinkId} or made once per write (a UUID); the batch is {@code
 * batchId} or 0. The driver's abort sends {@code ABORT WRITES} of the tasks' ids and of the
 * job's prefix (below).
 * </ul>
 *
 * <p>Columns: the written rows' columns that a topic write takes ({@link #WRITE_COLUMNS},
 * as the Python source's {@code _writable}): a read's {@code offset} or {@code written_at}
 * are the server's to set and are left out; {@code data} is required. Truncation
 * (overwrite, refused) stays with the Python source's write.
 *
 * <p>Streaming writes ({@link Streaming}) stage the same way and commit each micro-batch as
 * {@code (sinkId, epoch id)}: the option {@code sinkId} is required (the same for every run
 * of one query), so a micro-batch replayed after a restart publishes nothing.
 *
 * <p>A write id is {@code <prefix>-<partition>-<task id>} with the prefix made once per
 * write: attempts of one partition differ. The driver's abort discards every id with the
 * prefix ({@code ABORT WRITES ('<prefix>-*')}), so a task that staged its rows just as the
 * job failed (its commit message dropped by Spark) leaves nothing staged either; an attempt
 * killed with its executor after that abort leaves its staged write to the server's
 * collection of abandoned writes.
 */
final class WireWrite implements Write {
    static final String[] WRITE_COLUMNS = {"data", "producer_id", "seq_no", "message_group_id",
        "partition", "created_at", "metadata", "codec"};
    static final int DEFAULT_BATCH_ROWS = 4096;

    /** The builder: a wire write, but truncation goes to the Python source's (which refuses). */
    static final class Builder implements WriteBuilder, SupportsTruncate {
        private final Map<String, String> options;
        private final StructType schema;
        private final WriteBuilder python;

        Builder(Map<String, String> options, StructType schema, WriteBuilder python) {
            this.options = options;
            this.schema = schema;
            this.python = python;
        }

        @Override
        public WriteBuilder truncate() {
            return ((SupportsTruncate) python).truncate();
        }

        @Override
        public Write build() {
            return new WireWrite(options, schema);
        }
    }

    private final HashMap<String, String> options;
    private final String topic;
    private final StructType written; // the columns sent
    private final int[] ordinals; // their places in the rows Spark hands over

    WireWrite(Map<String, String> options, StructType schema) {
        this.options = new HashMap<>(options);
        this.topic = options.get("topic");
        List<StructField> fields = new ArrayList<>();
        List<Integer> places = new ArrayList<>();
        for (String name : WRITE_COLUMNS) {
            for (int i = 0; i < schema.fields().length; i++) {
                if (schema.fields()[i].name().toLowerCase(Locale.ROOT).equals(name)) {
                    StructField field = schema.fields()[i];
                    fields.add(new StructField(name, field.dataType(), true, field.metadata()));
                    places.add(i);
                    break;
                }
            }
        }
        if (fields.isEmpty() || !fields.get(0).name().equals("data")) {
            throw new IllegalArgumentException("a write to a topic needs a \"data\" column");
        }
        this.written = new StructType(fields.toArray(new StructField[0]));
        this.ordinals = places.stream().mapToInt(Integer::intValue).toArray();
        String level = options.get("frameCodecLevel");
        if (level != null && !level.trim().matches("-?[0-9]{1,7}")) {
            throw new IllegalArgumentException("frameCodecLevel must be a zstd level (an "
                + "integer), not \"" + level + "\"");
        }
        String codec = frameCodec(this.options, topic);
        this.options.put("frameCodec", codec); // auto resolved for the tasks
        WireWriteStats.frameCodecChosen(codec);
    }

    /**
     * The codec policy of the write's frames, on the driver: the option {@code frameCodec}
     * ({@code raw}, {@code zstd}, {@code column}, or {@code auto}, the default). {@code
     * auto} is resolved from the topic's {@code supported_codecs} (its settings in
     * sys.topics, one query; {@link #autoCodec}): as Parquet compresses its pages by
     * default, a topic that accepts raw messages gets frames whose data column is
     * compressed whole where that pays (round 22: {@code column-auto}, the messages stay
     * raw, {@link WireFrames#COLUMN_KEEP_EIGHTHS}), one that accepts zstd and not raw
     * gets each message compressed (before round 22 the default went raw after a sample,
     * which such a topic refused); readers get them back decoded. A topic that cannot be
     * looked up (not visible to the user) gets raw: the server's staging decides either way
     * (22P04 / 22023 for a codec the topic refuses). The tasks get raw, zstd, column or
     * column-auto (resolved), never an invalid value.
     */
    static String frameCodec(Map<String, String> options, String topic) {
        String given = options.getOrDefault("frameCodec", "auto").trim().toLowerCase(Locale.ROOT);
        switch (given) {
            case "raw":
            case "zstd":
            case "column":
                return given;
            case "auto":
                break;
            default:
                throw new IllegalArgumentException("frameCodec must be auto, raw, zstd or "
                    + "column, not \"" + options.get("frameCodec") + "\"");
        }
        List<String[]> found;
        try {
            found = PgWireClient.run(options.get("wire"), options, client -> client.query(
                "SELECT settings FROM sys.topics WHERE name = "
                    + WireScan.quoteLiteral(topic)));
        } catch (IOException e) {
            throw new UncheckedIOException("cannot look up topic " + topic + ": "
                + e.getMessage(), e);
        }
        return found.isEmpty() ? "raw" : autoCodec(found.get(0)[0]);
    }

    /** {@code auto}'s policy for a topic whose settings are {@code settings} (sys.topics'
     * JSON, e.g. {@code {"supported_codecs": ["raw", "gzip", "zstd"], ...}}):
     * {@code column-auto} (frames' data columns compressed whole while the task's first
     * data shows it pays, the messages raw: round 22) when its {@code supported_codecs}
     * list names raw, or when the key is absent (the engine's codecs then are raw only:
     * engine/ddl.py); else zstd (each message compressed: the topic refuses raw ones) when
     * it names zstd; else raw (the server refuses it, as it would any codec). */
    static String autoCodec(String settings) {
        String key = "\"supported_codecs\"";
        int at = settings == null ? -1 : settings.indexOf(key);
        if (at < 0) {
            return "column-auto";
        }
        int open = settings.indexOf('[', at + key.length());
        int close = open < 0 ? -1 : settings.indexOf(']', open);
        if (close < 0) {
            return "column-auto";
        }
        boolean zstd = false;
        for (String codec : settings.substring(open + 1, close).split(",")) {
            String name = codec.trim().replace("\"", "");
            if (name.equalsIgnoreCase("raw")) {
                return "column-auto";
            }
            zstd |= name.equalsIgnoreCase("zstd");
        }
        return zstd ? "zstd" : "raw";
    }

    @Override
    public String description() {
        return "TopicbaseWireWrite(" + topic + ")";
    }

    @Override
    public BatchWrite toBatch() {
        return new Batch(this);
    }

    @Override
    public StreamingWrite toStreaming() {
        String sink = options.get("sinkId");
        if (sink == null || sink.isEmpty()) {
            throw new IllegalArgumentException("a streaming write needs the option \"sinkId\": "
                + "the same for every run of one query (its batches are recognised by it after "
                + "a restart), unique per query");
        }
        return new Streaming(this, sink);
    }

    /** What a task staged: its write id (null without rows) and row count. */
    static final class Staged implements WriterCommitMessage {
        private static final long serialVersionUID = 1L;
        final String writeId;
        final long rows;

        Staged(String writeId, long rows) {
            this.writeId = writeId;
            this.rows = rows;
        }
    }

    /** The driver's side: the tasks' factory, then COMMIT WRITES or ABORT WRITES. */
    static final class Batch implements BatchWrite {
        private final WireWrite write;
        private final String prefix = "spark-" + UUID.randomUUID().toString().replace("-", "");
        private final String sinkId;
        private final long batchId;
        /** The server's answer to the commit: "committed" or "duplicate", and the rows. */
        String status;
        long rows;

        Batch(WireWrite write) {
            this.write = write;
            String sink = write.options.get("sinkId");
            this.sinkId = sink == null || sink.isEmpty() ? prefix : sink;
            String batch = write.options.get("batchId");
            this.batchId = batch == null ? 0 : Long.parseLong(batch.trim());
        }

        @Override
        public DataWriterFactory createBatchWriterFactory(PhysicalWriteInfo info) {
            return new Factory(write.options, write.topic, write.written, write.ordinals, prefix);
        }

        @Override
        public void commit(WriterCommitMessage[] messages) {
            String sql = "COMMIT WRITES (" + idList(messages) + ") SINK "
                + WireScan.quoteLiteral(sinkId) + " BATCH " + batchId;
            long started = System.nanoTime();
            List<String[]> answer = run(write, sql);
            status = answer.get(0)[0];
            rows = Long.parseLong(answer.get(0)[1]);
            int writes = idList(messages).isEmpty() ? 0 : idList(messages).split(", ").length;
            WireWriteStats.commitDone((System.nanoTime() - started) / 1e9, writes, rows);
        }

        /**
         * Every write of this job is aborted: the tasks' ids that reached the driver, and
         * every id with the job's prefix ({@code 'prefix-*'}): a task that staged its rows
         * just as the job failed has its commit message dropped by Spark, its write would
         * otherwise wait for the server's collection of abandoned writes.
         */
        @Override
        public void abort(WriterCommitMessage[] messages) {
            run(write, "ABORT WRITES (" + jobIds(messages, prefix + "-") + ")");
        }

        /** The messages' ids and the pattern of every id starting with {@code prefix}. */
        static String jobIds(WriterCommitMessage[] messages, String prefix) {
            String ids = idList(messages);
            String pattern = WireScan.quoteLiteral(prefix + "*");
            return ids.isEmpty() ? pattern : ids + ", " + pattern;
        }

        static List<String[]> run(WireWrite write, String sql) {
            try {
                return PgWireClient.run(write.options.get("wire"), write.options,
                    client -> client.query(sql));
            } catch (IOException e) {
                throw new UncheckedIOException(e.getMessage(), e);
            }
        }

        static String idList(WriterCommitMessage[] messages) {
            List<String> ids = new ArrayList<>();
            for (WriterCommitMessage message : messages) {
                if (message instanceof Staged && ((Staged) message).writeId != null) {
                    ids.add(WireScan.quoteLiteral(((Staged) message).writeId));
                }
            }
            return String.join(", ", ids);
        }
    }

    /**
     * A streaming write: each micro-batch (epoch) as a batch write of its own, published as
     * {@code (sinkId, epoch)}, so a micro-batch that Spark replays after a restart (the same
     * epoch id) publishes nothing. Its tasks' write ids carry the epoch.
     */
    static final class Streaming implements StreamingWrite {
        private final WireWrite write;
        private final String prefix = "spark-" + UUID.randomUUID().toString().replace("-", "");
        private final String sinkId;

        Streaming(WireWrite write, String sinkId) {
            this.write = write;
            this.sinkId = sinkId;
        }

        @Override
        public StreamingDataWriterFactory createStreamingWriterFactory(PhysicalWriteInfo info) {
            Factory batches = new Factory(write.options, write.topic, write.written,
                write.ordinals, prefix);
            return (partitionId, taskId, epochId) ->
                batches.writer("b" + epochId + "-" + partitionId + "-" + taskId);
        }

        @Override
        public void commit(long epochId, WriterCommitMessage[] messages) {
            Batch.run(write, "COMMIT WRITES (" + Batch.idList(messages) + ") SINK "
                + WireScan.quoteLiteral(sinkId) + " BATCH " + epochId);
        }

        @Override
        public void abort(long epochId, WriterCommitMessage[] messages) {
            // The epoch's every write, as a batch write's abort (its tasks' ids carry it).
            Batch.run(write, "ABORT WRITES (" + Batch.jobIds(messages, prefix + "-b" + epochId
                + "-") + ")");
        }
    }

    /** Serializable: sent to the executors. */
    static final class Factory implements DataWriterFactory, Serializable {
        private static final long serialVersionUID = 1L;
        private final HashMap<String, String> options;
        private final String topic;
        private final StructType written;
        private final int[] ordinals;
        private final String prefix;

        Factory(HashMap<String, String> options, String topic, StructType written, int[] ordinals,
                String prefix) {
            this.options = options;
            this.topic = topic;
            this.written = written;
            this.ordinals = ordinals;
            this.prefix = prefix;
        }

        @Override
        public DataWriter<InternalRow> createWriter(int partitionId, long taskId) {
            return writer(partitionId + "-" + taskId);
        }

        DataWriter<InternalRow> writer(String suffix) {
            return new TaskWriter(options, topic, written, ordinals, prefix + "-" + suffix);
        }
    }

    /** One task's rows: one COPY of one Arrow stream under the task's write id. */
    static final class TaskWriter implements DataWriter<InternalRow> {
        private final Map<String, String> options;
        private final String copySql;
        private final String framesSql; // null: the task's columns cannot go as frames
        private WireFrames frames; // the task's rows go as partition frames
        private long stagedBefore; // rows of the task's frames COPY, when it switched
        private final StructType written;
        private final int[] ordinals;
        private final DataType[] types;
        private final boolean projected;
        private final String writeId;
        private final int batchRows;
        private BufferAllocator allocator;
        private VectorSchemaRoot root;
        private ArrowWriter arrow;
        private ArrowStreamWriter stream;
        private PgWireClient client;
        private PgWireClient.CopyIn copy;
        private GenericInternalRow row;
        private int pending;
        private long rows;

        TaskWriter(Map<String, String> options, String topic, StructType written, int[] ordinals,
                String writeId) {
            this.options = options;
            this.written = written;
            this.ordinals = ordinals;
            this.writeId = writeId;
            String given = options.get("writeBatchRows");
            this.batchRows = given == null ? DEFAULT_BATCH_ROWS : Integer.parseInt(given.trim());
            if (batchRows < 1) {
                throw new IllegalArgumentException("writeBatchRows must be at least 1");
            }
            List<String> columns = new ArrayList<>();
            this.types = new DataType[ordinals.length];
            boolean inPlace = true;
            for (int i = 0; i < ordinals.length; i++) {
                columns.add(WireScan.quoteIdentifier(written.fields()[i].name()));
                types[i] = written.fields()[i].dataType();
                inPlace = inPlace && ordinals[i] == i;
            }
            this.projected = !inPlace;
            this.copySql = "COPY TOPIC " + WireScan.quoteIdentifier(topic) + " ("
                + String.join(", ", columns) + ") FROM STDIN (FORMAT arrow, WRITE_ID "
                + WireScan.quoteLiteral(writeId) + ")";
            boolean framed = !"false".equalsIgnoreCase(options.getOrDefault("writeFrames", "true"))
                && WireFrames.eligible(written);
            this.framesSql = framed ? "COPY TOPIC " + WireScan.quoteIdentifier(topic)
                + " FROM STDIN (FORMAT frames, WRITE_ID " + WireScan.quoteLiteral(writeId) + ")"
                : null;
        }

        /**
         * The COPY of the task, opened at its first row: as partition frames
         * ({@link WireFrames}) when the columns allow it and that row names its partition
         * (then every row must), else as one Arrow stream.
         */
        private void open(InternalRow first) throws IOException {
            String level = options.get("frameCodecLevel");
            WireFrames framed = framesSql == null ? null : new WireFrames(written, ordinals,
                options.getOrDefault("frameCodec", "raw"), level == null ? WireFrames.ZSTD_LEVEL
                    : Integer.parseInt(level.trim()));
            if (framed != null && !framed.holds(first)) {
                framed.close();
                framed = null;
            }
            String sql = framed != null ? framesSql : copySql;
            client = PgWireClient.borrow(options.get("wire"), options);
            try {
                copy = client.copyIn(sql);
            } catch (IOException e) {
                if (!client.wasReused() || e instanceof PgWireClient.PgWireException) {
                    throw e;
                }
                client.close(); // kept idle and closed by the server meanwhile: once more
                client = PgWireClient.borrowNew(options.get("wire"), options);
                copy = client.copyIn(sql);
            }
            frames = framed;
            if (framed == null) {
                openArrow();
            }
        }

        /** A row frames cannot hold: the frames sent, their COPY ended, the rest of the
         * task's rows go as an Arrow stream in a new COPY of the same write id. */
        private void switchToArrow() throws IOException {
            frames.finish(copy);
            long staged = copy.finish();
            if (staged != rows) {
                throw new IOException("the server staged " + staged + " frames' rows of " + rows);
            }
            stagedBefore = staged;
            frames.close();
            frames = null;
            copy = client.copyIn(copySql);
            openArrow();
        }

        private void openArrow() throws IOException {
            allocator = new RootAllocator();
            root = VectorSchemaRoot.create(ArrowUtils.toArrowSchema(written, "UTC", true),
                allocator);
            arrow = ArrowWriter.create(root);
            stream = new ArrowStreamWriter(root, null, copy);
            stream.start();
            row = new GenericInternalRow(ordinals.length);
        }

        @Override
        public void write(InternalRow record) throws IOException {
            if (copy == null) {
                open(record);
            }
            if (frames != null) {
                if (frames.holds(record)) {
                    frames.write(record, copy);
                    rows++;
                    return;
                }
                switchToArrow();
            }
            if (projected) {
                for (int i = 0; i < ordinals.length; i++) {
                    row.update(i, record.isNullAt(ordinals[i]) ? null
                        : record.get(ordinals[i], types[i]));
                }
                arrow.write(row);
            } else {
                arrow.write(record);
            }
            rows++;
            if (++pending >= batchRows) {
                flushBatch();
            }
        }

        private void flushBatch() throws IOException {
            arrow.finish();
            stream.writeBatch();
            arrow.reset();
            pending = 0;
        }

        @Override
        public WriterCommitMessage commit() throws IOException {
            if (copy == null) {
                return new Staged(null, 0);
            }
            if (frames != null) {
                frames.finish(copy);
            } else {
                if (pending > 0) {
                    flushBatch();
                }
                stream.end();
            }
            long staged = stagedBefore + copy.finish();
            if (staged != rows) {
                throw new IOException("the server staged " + staged + " rows of " + rows);
            }
            PgWireClient done = client;
            client = null;
            done.release();
            return new Staged(writeId, rows);
        }

        @Override
        public void abort() throws IOException {
            if (copy == null) {
                return; // nothing was staged
            }
            PgWireClient held = client;
            client = null;
            try {
                if (held != null) {
                    copy.fail("the Spark task failed");
                    held.query("ABORT WRITES (" + WireScan.quoteLiteral(writeId) + ")");
                    held.release();
                    return;
                }
            } catch (IOException e) {
                held.close(); // the connection is lost: abort on a new one
            }
            PgWireClient.run(options.get("wire"), options,
                c -> c.query("ABORT WRITES (" + WireScan.quoteLiteral(writeId) + ")"));
        }

        @Override
        public void close() throws IOException {
            try {
                if (frames != null) {
                    frames.close();
                    frames = null;
                }
                if (root != null) {
                    root.close();
                }
                if (allocator != null) {
                    allocator.close();
                }
            } finally {
                root = null;
                allocator = null;
                if (client != null) { // neither committed nor aborted: the COPY is half-sent
                    client.close();
                    client = null;
                }
            }
        }
    }
}
