package io.topicbase.spark;

import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.ReadableByteChannel;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.compression.NoCompressionCodec;
import org.apache.arrow.vector.ipc.ArrowStreamReader;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.ArrowUtils;
import org.apache.spark.sql.vectorized.ArrowColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * One task's read of a range: {@code COPY (SELECT <columns> FROM TOPIC t WHERE partition = p
 * AND offset >= a AND offset < b) TO STDOUT (FORMAT arrow)} over its own PostgreSQL-wire
 * connection, the CopyData payloads read as one Arrow IPC stream, each record batch handed
 * to Spark as a {@link ColumnarBatch} of {@link ArrowColumnVector}s over the Arrow buffers
 * (no copy, no rows).
 *
 * <p>When the server announces {@code topicbase_copy_compression} (a ParameterStatus at
 * startup naming {@code zstd}), the COPY asks for {@code COMPRESSION zstd}: frames stored
 * with their data column compressed whole come as stored, their record batches declaring
 * Arrow IPC body compression ZSTD, and the stream reader decompresses them here (Arrow's
 * own codec over zstd-jni, both shipped with Spark) instead of the server sending the
 * decoded bytes. Without that announcement (an older server) the COPY asks for nothing and
 * the reader takes no compressed batch (Arrow refuses one).
 *
 * <p>Invariants: the batch returned by {@link #get} is valid until the next {@link #next}
 * (the stream reader reuses one root); the columns arrive in the requested order with the
 * types of the scan's schema (engine.bulk_read.project_schema), which is checked against
 * the stream's schema before the first batch; {@link #close} frees every Arrow buffer.
 */
final class WireBatchReader implements PartitionReader<ColumnarBatch> {
    /** Serializable: sent to the executors with the connection options. */
    static final class Factory implements PartitionReaderFactory {
        private static final long serialVersionUID = 1L;
        private final HashMap<String, String> options;
        private final String topic;
        private final StructType schema;

        Factory(Map<String, String> options, String topic, StructType schema) {
            this.options = new HashMap<>(options);
            this.topic = topic;
            this.schema = schema;
        }

        @Override
        public boolean supportColumnarReads(InputPartition partition) {
            return true;
        }

        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            throw new UnsupportedOperationException("the Topicbase wire scan reads columnar "
                + "batches only");
        }

        @Override
        public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
            return new WireBatchReader(options, topic, schema, (WireScan.Range) partition);
        }
    }

    /** The ParameterStatus by which a server says it takes {@code COMPRESSION zstd}. */
    static final String COMPRESSION_PARAMETER = "topicbase_copy_compression";

    private final Map<String, String> options;
    private final String copy;
    private final StructType schema;
    private final String where;
    private final long expected;
    private long received;
    private BufferAllocator allocator;
    private PgWireClient client;
    private ArrowStreamReader reader;
    private ColumnarBatch batch;
    private InputStream copyData;

    WireBatchReader(Map<String, String> options, String topic, StructType schema,
            WireScan.Range range) {
        this.options = options;
        this.schema = schema;
        List<String> quoted = new ArrayList<>();
        for (String column : schema.fieldNames()) {
            quoted.add(WireScan.quoteIdentifier(column));
        }
        this.expected = range.end - range.start;
        this.where = "partition " + range.partition + " [" + range.start + ", " + range.end
            + ") of topic " + topic;
        this.copy = "COPY (SELECT " + String.join(", ", quoted) + " FROM TOPIC "
            + WireScan.quoteIdentifier(topic) + " WHERE \"partition\" = " + range.partition
            + " AND \"offset\" >= " + range.start + " AND \"offset\" < " + range.end
            + ") TO STDOUT (FORMAT arrow)";
    }

    private void open() throws IOException {
        allocator = new RootAllocator(Long.MAX_VALUE);
        client = PgWireClient.borrow(options.get("wire"), options);
        PgWireClient.CopyStream data;
        try {
            data = client.copyOut(copyFor(client));
        } catch (PgWireClient.PgWireException e) {
            throw e;
        } catch (IOException e) { // a reused connection closed while idle: once more, anew
            if (!client.wasReused()) {
                throw e;
            }
            client.close();
            client = PgWireClient.borrowNew(options.get("wire"), options);
            data = client.copyOut(copyFor(client));
        }
        copyData = data;
        reader = new ArrowStreamReader(checkedStart(data), allocator,
            takesCompression(client) ? BoundedZstdCodecs.INSTANCE
                : NoCompressionCodec.Factory.INSTANCE);
        VectorSchemaRoot root = reader.getVectorSchemaRoot();
        List<FieldVector> vectors = root.getFieldVectors();
        if (vectors.size() != schema.size()) {
            throw new IOException("the server sent " + vectors.size() + " columns for "
                + schema.size() + " (" + root.getSchema() + ")");
        }
        ColumnVector[] columns = new ColumnVector[vectors.size()];
        for (int i = 0; i < columns.length; i++) {
            DataType sent = ArrowUtils.fromArrowField(vectors.get(i).getField());
            DataType expected = schema.fields()[i].dataType();
            if (!sent.simpleString().equals(expected.simpleString())) { // nullability aside
                throw new IOException("column " + schema.fields()[i].name() + " came as "
                    + sent.simpleString() + ", not " + expected.simpleString());
            }
            columns[i] = new ArrowColumnVector(vectors.get(i));
        }
        batch = new ColumnarBatch(columns);
    }

    /** Whether {@code client}'s server announced that it sends zstd-compressed batches. */
    static boolean takesCompression(PgWireClient client) {
        String codecs = client.serverParameter(COMPRESSION_PARAMETER);
        return codecs != null && List.of(codecs.split(",")).contains("zstd");
    }

    /** The COPY for {@code client}: asking for compressed batches when its server takes it. */
    private String copyFor(PgWireClient client) {
        if (!takesCompression(client)) {
            return copy;
        }
        return copy.substring(0, copy.length() - 1) + ", COMPRESSION zstd)";
    }

    /** The first message's metadata is at most this long (a schema's flatbuffer: small). */
    private static final int SCHEMA_BYTES_MAX = 1 << 24;

    /**
     * {@code data} after a check that it starts as an Arrow IPC stream does (continuation
     * marker, a plausible schema length): Arrow allocates a message's metadata on the heap at
     * the length it reads, so other bytes (a server without FORMAT arrow) could exhaust the
     * JVM's heap, which ends the whole Spark application, instead of failing the task. The
     * stream is read as a channel (the COPY's payloads go straight into Arrow's buffers).
     */
    private static ReadableByteChannel checkedStart(PgWireClient.CopyStream data)
            throws IOException {
        byte[] head = data.readNBytes(8);
        int marker = head.length < 8 ? 0 : ByteBuffer.wrap(head, 0, 4).getInt();
        int length = head.length < 8 ? -1
            : ByteBuffer.wrap(head, 4, 4).order(ByteOrder.LITTLE_ENDIAN).getInt();
        if (head.length < 8 || marker != -1 || length <= 0 || length > SCHEMA_BYTES_MAX) {
            throw new IOException("the COPY data is not an Arrow IPC stream (does the server "
                + "support COPY ... (FORMAT arrow)?)");
        }
        return new ReadableByteChannel() {
            private final ByteBuffer first = ByteBuffer.wrap(head);

            @Override
            public int read(ByteBuffer target) throws IOException {
                if (!first.hasRemaining()) {
                    return data.read(target);
                }
                int n = Math.min(first.remaining(), target.remaining());
                ByteBuffer piece = first.slice();
                piece.limit(n);
                target.put(piece);
                first.position(first.position() + n);
                return n;
            }

            @Override
            public boolean isOpen() {
                return true;
            }

            @Override
            public void close() {
                // the COPY stream is the connection's, released with it
            }
        };
    }

    @Override
    public boolean next() throws IOException {
        try {
            if (reader == null) {
                open();
            }
            if (!reader.loadNextBatch()) {
                if (received != expected) { // offsets are dense: each one is a message
                    throw new IOException(received + " messages came of the " + expected
                        + " cut (deleted by retention since the cut?)");
                }
                // past the stream's end: CopyDone, CommandComplete, ReadyForQuery, so
                // that the connection can be reused
                if (copyData.read(new byte[1]) >= 0) {
                    throw new IOException("data after the Arrow stream's end");
                }
                return false;
            }
            int rows = reader.getVectorSchemaRoot().getRowCount();
            received += rows;
            batch.setNumRows(rows);
            return true;
        } catch (IOException e) {
            throw new IOException("reading " + where + ": " + e.getMessage(), e);
        }
    }

    @Override
    public ColumnarBatch get() {
        return batch;
    }

    @Override
    public void close() throws IOException {
        // batch's vectors belong to the reader's root: closing the reader frees them
        try {
            if (reader != null) {
                reader.close();
            }
        } finally {
            try {
                if (client != null) {
                    client.release(); // kept only if the COPY was read to its end
                }
            } finally {
                if (allocator != null) {
                    allocator.close();
                }
            }
        }
    }
}
