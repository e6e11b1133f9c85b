package io.topicbase.spark;

import java.io.IOException;
import java.io.OutputStream;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.zip.CRC32C;

import org.apache.arrow.vector.types.TimeUnit;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.FieldType;
import org.apache.arrow.vector.types.pojo.Schema;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.ByteType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampType;
import org.apache.spark.unsafe.Platform;

import com.github.luben.zstd.Zstd;
import com.github.luben.zstd.ZstdCompressCtx;

/**
 * One task's topic rows sent as staged partition frames ({@code COPY TOPIC t FROM STDIN
 * (FORMAT frames, WRITE_ID 'id')}): the rows grouped by their {@code partition} here, in the
 * task, so that the server only checks each frame and writes it as it came
 * ({@code storage.staged_frames}: no decode into rows, no grouping, no re-encoding there).
 *
 * <p>The stream is the frames file format: per frame a 24-byte little-endian header (magic
 * {@code TBs1}, the body's CRC-32C, partition i64, messages u32, body bytes u32) then the
 * body, one Arrow IPC record-batch message of the server's wire schema ({@code seq_no},
 * {@code producer_id}, {@code message_group_id}, {@code created_at}, {@code codec},
 * {@code data}, {@code metadata}; no partition column), laid out by {@link FrameBody} around
 * the partition's pending array and sent from where its pieces are (the messages' bytes are
 * copied once in the task: from Spark's row into the pending array). Invariants, as the
 * server checks:
 * <ul>
 * <li>a partition's frames hold its rows in the task's order;
 * <li>a frame holds at most {@link #TARGET_MESSAGES} messages and, unless it is one message,
 * at most {@link #TARGET_BYTES} of data (a partition's rows are cut where the server cuts);
 * <li>messages are raw (codec 1) without producer id, message group or metadata;
 * {@code created_at} is the row's or, when it has none, the task's clock when the row came.
 * </ul>
 * A row a frame cannot hold ({@link #holds}: no partition, or a producer id, message group,
 * metadata or codec given) ends the frames: the task sends what waits, ends that COPY and
 * sends its remaining rows as an Arrow stream in a second COPY of the same write id (the
 * server reads a write's files in the order they were staged). Memory is bounded: past {@link #PENDING_BYTES} of rows waiting (data, 48 bytes a row and
 * 4 KiB a partition holding rows) the partitions holding the most are sent as smaller frames
 * until 3/4 of it is left.
 */
final class WireFrames implements AutoCloseable {
    static final int TARGET_MESSAGES = 4096; // storage.limits.FRAME_TARGET_MESSAGES
    static final long TARGET_BYTES = 4L << 20; // storage.limits.FRAME_TARGET_BYTES
    static final long PENDING_BYTES = 16L << 20;
    static final long PARTITION_COST = 4096;
    static final long ROW_COST = 48;
    static final int HEADER_BYTES = 24;
    static final int SPARE_MAX = 4;
    private static final byte RAW = 1; // storage.codecs.Codec.RAW
    private static final byte ZSTD = 4; // storage.codecs.Codec.ZSTD
    /** The zstd level of {@code frameCodec=zstd} (storage.codecs compresses at 1 too). */
    static final int ZSTD_LEVEL = 1;
    /** {@code frameCodec=column} (round 22): each frame's data values are compressed as one
     * zstd frame (the body column-compressed, {@link FrameBody}; the messages stay raw); a
     * frame whose values do not come down to at most {@code COLUMN_KEEP_EIGHTHS}/8 of their
     * size goes plain (the server's check and every read would pay to decompress them for
     * little). {@code column-auto} (what {@code frameCodec=auto}, the default, is for a topic
     * that accepts raw messages) keeps compressing only where it saves CPU: once the task's
     * first {@code AUTO_SAMPLE_BYTES} of data (in whole frames) are compressed, it goes on
     * if the thread CPU time their compression took, plus the server's decompression
     * (a third of it: {@code DECODE_SHARE}), is below what sending and storing the bytes
     * saved would have cost ({@code SAVED_NS_PER_BYTE}); else every later frame goes
     * plain. Round 22 measured both on this machine (docs/spark_throughput.md): the bench's
     * rows (~0.3 ns a byte to compress, 99 % saved) pay by far; JSON log lines (~1.2 ns a
     * byte, 84 % saved) do not (+0.5-0.8 s of CPU per 1M); bytes that do not shrink never.
     * (Round 18's {@code auto} compressed each message while its first MiB came down to
     * 5 %: zstd's fixed cost a message made it pay only on nearly constant data.) */
    static final long AUTO_SAMPLE_BYTES = 1L << 20;
    static final long COLUMN_KEEP_EIGHTHS = 7;
    /** CPU a raw frame's byte costs from the task's copy to the server's disk (the JVM's
     * CRC-32C and socket write, the server's receive, check, CRC and write): ~1.4 s per GB
     * of raw frames in round 22's A/B (JVM ~0.4, server ~1.0). */
    static final double SAVED_NS_PER_BYTE = 1.4;
    /** The server's zstd decompression (its check) against the task's compression. */
    static final double DECODE_SHARE = 1.0 / 3;
    private static final ThreadMXBean THREADS = ManagementFactory.getThreadMXBean();
    /** A frame up to this size goes as one CopyData message (the server then checks and
     * writes the body where it arrived, no copy to join pieces); a larger one (a single
     * large message) in the COPY's 1 MiB pieces. */
    static final int ONE_MESSAGE_BYTES = 8 << 20;

    /** Columns a frame holds only as nulls (a row with one set goes as an Arrow stream). */
    static final List<String> NULL_ONLY = List.of("producer_id", "message_group_id", "metadata",
        "codec");

    /** Whether a task's rows of these columns may go as frames: {@code partition} given as an
     * integer, {@code data} as bytes or text, {@code seq_no} and {@code created_at} of their
     * types, and the {@link #NULL_ONLY} columns (of any type) null in the rows sent so. */
    static boolean eligible(StructType written) {
        boolean partition = false;
        for (StructField field : written.fields()) {
            DataType type = field.dataType();
            switch (field.name().toLowerCase(Locale.ROOT)) {
                case "data":
                    if (!(type instanceof BinaryType || type instanceof StringType)) {
                        return false;
                    }
                    break;
                case "partition":
                    partition = integral(type);
                    if (!partition) {
                        return false;
                    }
                    break;
                case "seq_no":
                    if (!integral(type)) {
                        return false;
                    }
                    break;
                case "created_at":
                    if (!(type instanceof TimestampType)) {
                        return false;
                    }
                    break;
                default:
                    if (!NULL_ONLY.contains(field.name().toLowerCase(Locale.ROOT))) {
                        return false;
                    }
            }
        }
        return partition;
    }

    private static boolean integral(DataType type) {
        return type instanceof LongType || type instanceof IntegerType || type instanceof ShortType
            || type instanceof ByteType;
    }

    private static long integer(InternalRow row, int at, DataType type) {
        if (type instanceof LongType) {
            return row.getLong(at);
        }
        if (type instanceof IntegerType) {
            return row.getInt(at);
        }
        if (type instanceof ShortType) {
            return row.getShort(at);
        }
        return row.getByte(at);
    }

    /** A partition's rows waiting to fill a frame: their data back to back in one array
     * (copied there once from the row: no array per row), where each ends. */
    private static final class Pending {
        byte[] values = new byte[1 << 12];
        int[] ends = new int[16];
        long[] seq = new long[16];
        boolean[] seqNull = new boolean[16];
        long[] created = new long[16];
        byte codec = RAW; // the codec of every message waiting here
        int count;
        long bytes;
        /** The rows' data before compression (= {@link #bytes} for raw messages): a frame
         * is cut by it, so a frame of zstd messages decodes to at most a frame's target
         * (plus one message), within what the server lets one frame declare. */
        long plainBytes;

        /** Room for a row of {@code length} bytes; where its data goes. */
        int reserve(int length) {
            if (count == ends.length) {
                int grown = count * 2;
                ends = Arrays.copyOf(ends, grown);
                seq = Arrays.copyOf(seq, grown);
                seqNull = Arrays.copyOf(seqNull, grown);
                created = Arrays.copyOf(created, grown);
            }
            long end = bytes + length;
            if (end > Integer.MAX_VALUE - 8) {
                throw new IllegalArgumentException("a frame's data must stay under 2 GiB");
            }
            if (end > values.length) {
                values = Arrays.copyOf(values, (int) Math.min(Integer.MAX_VALUE - 8,
                    Math.max(end, 2L * values.length)));
            }
            return (int) bytes;
        }

        /** The row whose data {@link #reserve} placed and the caller wrote. */
        void added(int length, long seqNo, boolean noSeq, long createdAt) {
            bytes += length;
            ends[count] = (int) bytes;
            seq[count] = seqNo;
            seqNull[count] = noSeq;
            created[count] = createdAt;
            count++;
        }

        void clear() {
            count = 0;
            bytes = 0;
            plainBytes = 0;
        }

        long cost() {
            return PARTITION_COST + bytes + count * ROW_COST;
        }
    }

    private final int dataAt;
    private final boolean dataIsText;
    private final int partitionAt;
    private final DataType partitionType;
    private final int seqAt;
    private final DataType seqType;
    private final int createdAt;
    private final int[] nullOnly; // where the NULL_ONLY columns are in the rows
    private final Map<Long, Pending> pending = new HashMap<>();
    private long pendingCost;
    /** Flushed partitions' arrays, given to the next partition that starts a frame (at
     * most {@link #SPARE_MAX}, none over twice a frame's target bytes). */
    private final List<Pending> spare = new ArrayList<>();
    private final FrameBody body = new FrameBody();
    private byte[] zeros = new byte[1 << 10]; // a body's tail (FrameBody.tailLength): zeros
    private final ByteBuffer header = ByteBuffer.allocate(HEADER_BYTES)
        .order(ByteOrder.LITTLE_ENDIAN);
    private final CRC32C crc = new CRC32C();
    private final ZstdCompressCtx zstd; // null: messages go raw
    private final ZstdCompressCtx column; // null: frames' data values go as they are
    private boolean columnCompressing; // new frames' data values are compressed whole
    private boolean columnSampling; // column-auto: the task's first frames are measured
    private long columnPlain; // column-auto: the sample's data, plain and compressed
    private long columnPacked;
    private long columnNanos; // column-auto: the sample's compression, thread CPU ns
    private byte[] packed = new byte[1 << 12]; // a frame's data values compressed
    private boolean compressing; // new frames' messages are compressed (zstd)
    private byte[] scratch = new byte[1 << 12]; // a row's data before zstd (off-heap rows)
    long rows;
    long frames;

    /** {@code ordinals[i]} is where {@code written}'s column i is in the rows handed over. */
    WireFrames(StructType written, int[] ordinals) {
        this(written, ordinals, "raw");
    }

    /** As above, each message compressed with {@code codec} at zstd level {@link
     * #ZSTD_LEVEL}. */
    WireFrames(StructType written, int[] ordinals, String codec) {
        this(written, ordinals, codec, ZSTD_LEVEL);
    }

    /** As above, each message compressed with {@code codec} ({@code raw}: as it is;
     * {@code zstd}: one zstd frame per message at zstd level {@code level}, its content
     * size in the frame header, which the server needs to check it; {@code column} and
     * {@code column-auto}: each frame's data values compressed whole at {@code level}, the
     * messages raw, see {@link #COLUMN_KEEP_EIGHTHS}). */
    WireFrames(StructType written, int[] ordinals, String codec, int level) {
        String kind = codec.trim().toLowerCase(Locale.ROOT);
        boolean columnKind = kind.equals("column") || kind.equals("column-auto");
        if (columnKind || kind.equals("zstd")) {
            if (level < Zstd.minCompressionLevel() || level > Zstd.maxCompressionLevel()
                    || level == 0) {
                throw new IllegalArgumentException("frameCodecLevel must be a zstd level "
                    + "(" + Zstd.minCompressionLevel() + " to -1, or 1 to "
                    + Zstd.maxCompressionLevel() + "), not " + level);
            }
        }
        if (columnKind) {
            this.column = new ZstdCompressCtx();
            column.setLevel(level);
            column.setContentSize(true); // the server checks the declared size first
            columnCompressing = true;
            columnSampling = kind.equals("column-auto");
        } else {
            this.column = null;
        }
        switch (kind) {
            case "raw":
            case "column":
            case "column-auto":
                this.zstd = null;
                break;
            case "zstd":
                this.zstd = new ZstdCompressCtx();
                zstd.setLevel(level);
                zstd.setContentSize(true);
                compressing = true;
                break;
            default:
                throw new IllegalArgumentException("a task's frame codec must be raw, zstd, "
                    + "column or column-auto, not \"" + codec + "\"");
        }
        int data = -1, partition = -1, seq = -1, created = -1;
        List<Integer> nulls = new ArrayList<>();
        DataType partitionKind = null, seqKind = null;
        boolean text = false;
        for (int i = 0; i < written.fields().length; i++) {
            StructField field = written.fields()[i];
            switch (field.name().toLowerCase(Locale.ROOT)) {
                case "data":
                    data = ordinals[i];
                    text = field.dataType() instanceof StringType;
                    break;
                case "partition":
                    partition = ordinals[i];
                    partitionKind = field.dataType();
                    break;
                case "seq_no":
                    seq = ordinals[i];
                    seqKind = field.dataType();
                    break;
                case "created_at":
                    created = ordinals[i];
                    break;
                default:
                    nulls.add(ordinals[i]);
            }
        }
        this.nullOnly = nulls.stream().mapToInt(Integer::intValue).toArray();
        this.dataAt = data;
        this.dataIsText = text;
        this.partitionAt = partition;
        this.partitionType = partitionKind;
        this.seqAt = seq;
        this.seqType = seqKind;
        this.createdAt = created;
    }

    /** The server's {@code storage.record_batch.WIRE_SCHEMA} (its buffers' layout is what
     * a body carries: the names and nullability are not in a record-batch message). */
    static Schema wireSchema() {
        Field entries = new Field("entries", FieldType.notNullable(ArrowType.Struct.INSTANCE),
            List.of(new Field("key", FieldType.notNullable(ArrowType.Utf8.INSTANCE), null),
                new Field("value", FieldType.nullable(ArrowType.Binary.INSTANCE), null)));
        List<Field> fields = new ArrayList<>();
        fields.add(new Field("seq_no", FieldType.nullable(new ArrowType.Int(64, true)), null));
        fields.add(new Field("producer_id", FieldType.nullable(ArrowType.Utf8.INSTANCE), null));
        fields.add(new Field("message_group_id", FieldType.nullable(ArrowType.Utf8.INSTANCE),
            null));
        fields.add(new Field("created_at", FieldType.nullable(
            new ArrowType.Timestamp(TimeUnit.MICROSECOND, "UTC")), null));
        fields.add(new Field("codec", FieldType.notNullable(new ArrowType.Int(8, false)), null));
        fields.add(new Field("data", FieldType.notNullable(ArrowType.Binary.INSTANCE), null));
        fields.add(new Field("metadata", FieldType.nullable(new ArrowType.Map(false)),
            List.of(entries)));
        return new Schema(fields);
    }

    /** Whether a frame can hold {@code row}: it names its partition, and its
     * {@link #NULL_ONLY} columns are null. */
    boolean holds(InternalRow row) {
        if (row.isNullAt(partitionAt)) {
            return false;
        }
        for (int at : nullOnly) {
            if (!row.isNullAt(at)) {
                return false;
            }
        }
        return true;
    }

    /** Adds a row that {@link #holds}; sends the frames it fills to {@code out}. */
    void write(InternalRow row, OutputStream out) throws IOException {
        assert holds(row);
        if (row.isNullAt(dataAt)) {
            throw new IllegalArgumentException("message data must not be NULL");
        }
        long partition = integer(row, partitionAt, partitionType);
        UnsafeRow unsafe = row instanceof UnsafeRow ? (UnsafeRow) row : null;
        byte[] value = null; // a row of another kind: its data copied out first
        int length;
        long offsetAndSize = 0;
        if (unsafe != null) { // text and bytes alike: (offset << 32 | size) in the row
            offsetAndSize = unsafe.getLong(dataAt);
            length = (int) offsetAndSize;
        } else {
            value = dataIsText ? row.getUTF8String(dataAt).getBytes() : row.getBinary(dataAt);
            length = value.length;
        }
        boolean noSeq = seqAt < 0 || row.isNullAt(seqAt);
        long seq = noSeq ? 0 : integer(row, seqAt, seqType);
        long created = createdAt >= 0 && !row.isNullAt(createdAt) ? row.getLong(createdAt)
            : System.currentTimeMillis() * 1000L;
        Pending share = pending.get(partition);
        if (share != null && share.plainBytes + length > TARGET_BYTES) {
            flush(partition, out); // the frame is full: this row starts the next one
            share = null;
        }
        if (share == null) {
            share = spare.isEmpty() ? new Pending() : spare.remove(spare.size() - 1);
            share.codec = compressing ? ZSTD : RAW;
            pending.put(partition, share);
            pendingCost += PARTITION_COST;
        }
        int stored = length;
        if (share.codec == ZSTD) {
            stored = compress(share, unsafe, offsetAndSize, value, length);
        } else {
            int at = share.reserve(length);
            if (unsafe != null) {
                Platform.copyMemory(unsafe.getBaseObject(),
                    unsafe.getBaseOffset() + (int) (offsetAndSize >> 32), share.values,
                    Platform.BYTE_ARRAY_OFFSET + at, length);
            } else {
                System.arraycopy(value, 0, share.values, at, length);
            }
        }
        share.added(stored, seq, noSeq, created);
        share.plainBytes += length;
        pendingCost += stored + ROW_COST;
        rows++;
        if (share.count >= TARGET_MESSAGES || share.plainBytes >= TARGET_BYTES) {
            flush(partition, out);
        }
        if (pendingCost > PENDING_BYTES) {
            List<Map.Entry<Long, Pending>> shares = new ArrayList<>(pending.entrySet());
            shares.sort((a, b) -> Long.compare(b.getValue().cost(), a.getValue().cost()));
            for (Map.Entry<Long, Pending> entry : shares) {
                if (pendingCost <= PENDING_BYTES * 3 / 4) {
                    break;
                }
                flush(entry.getKey(), out);
            }
        }
    }

    /** Compresses a row's data (in {@code unsafe} at {@code offsetAndSize}, else
     * {@code value}) into {@code share}'s array as one zstd frame; its size. */
    private int compress(Pending share, UnsafeRow unsafe, long offsetAndSize, byte[] value,
            int length) {
        byte[] source = value;
        int from = 0;
        if (unsafe != null) {
            Object base = unsafe.getBaseObject();
            long address = unsafe.getBaseOffset() + (int) (offsetAndSize >> 32);
            if (base instanceof byte[]) {
                source = (byte[]) base;
                from = (int) (address - Platform.BYTE_ARRAY_OFFSET);
            } else {
                if (scratch.length < length) {
                    scratch = new byte[Math.max(length, 2 * scratch.length)];
                }
                Platform.copyMemory(base, address, scratch, Platform.BYTE_ARRAY_OFFSET, length);
                source = scratch;
            }
        }
        int bound = (int) Math.min(Integer.MAX_VALUE - 8, Zstd.compressBound(length));
        int at = share.reserve(bound);
        return zstd.compressByteArray(share.values, at, bound, source, from, length);
    }

    /** Sends every waiting row (partitions in ascending order). */
    void finish(OutputStream out) throws IOException {
        List<Long> partitions = new ArrayList<>(pending.keySet());
        partitions.sort(null);
        for (long partition : partitions) {
            flush(partition, out);
        }
        assert pending.isEmpty() && pendingCost == 0;
    }

    private void flush(long partition, OutputStream out) throws IOException {
        Pending share = pending.remove(partition);
        pendingCost -= share.cost();
        int count = share.count;
        int plain = (int) share.bytes;
        int packedLength = columnCompressing && plain > 0 ? packColumn(share) : -1;
        long size = body.lay(count, share.seq, share.seqNull, share.created, share.codec,
            share.ends, share.bytes, packedLength);
        byte[] values = packedLength >= 0 ? packed : share.values;
        int bytes = packedLength >= 0 ? packedLength : plain;
        assert size % 8 == 0 && size == body.headLength + bytes + body.tailLength : size;
        if (zeros.length < body.tailLength) {
            zeros = new byte[Math.max(body.tailLength, 2 * zeros.length)];
        }
        byte[] tail = packedLength >= 0 ? body.tail : zeros;
        crc.reset();
        crc.update(body.head, 0, body.headLength);
        crc.update(values, 0, bytes);
        crc.update(tail, 0, body.tailLength);
        header.clear();
        header.put((byte) 'T').put((byte) 'B').put((byte) 's').put((byte) '1');
        header.putInt((int) crc.getValue()).putLong(partition).putInt(count).putInt((int) size);
        if (out instanceof PgWireClient.CopyIn && size <= ONE_MESSAGE_BYTES) {
            ((PgWireClient.CopyIn) out).writeMessage(
                new byte[][] {header.array(), body.head, values, tail},
                new int[] {HEADER_BYTES, body.headLength, bytes, body.tailLength});
        } else {
            out.write(header.array(), 0, HEADER_BYTES);
            out.write(body.head, 0, body.headLength);
            out.write(values, 0, bytes);
            out.write(tail, 0, body.tailLength);
        }
        WireWriteStats.framesSent(share.codec == ZSTD, packedLength >= 0, count);
        if (spare.size() < SPARE_MAX && share.values.length <= 2 * TARGET_BYTES) {
            share.clear(); // its arrays were sent (above): the next frames may reuse them
            spare.add(share);
        }
        frames++;
    }

    /** {@code share}'s data values compressed whole into {@link #packed} (one zstd frame
     * declaring its size); their length, or -1 when they did not shrink enough to be sent
     * so ({@link #COLUMN_KEEP_EIGHTHS}). Ends column-auto's sample once it is measured. */
    private int packColumn(Pending share) {
        int plain = (int) share.bytes;
        int bound = (int) Math.min(Integer.MAX_VALUE - 8, Zstd.compressBound(plain));
        if (packed.length < bound) {
            packed = new byte[Math.max(bound, 2 * packed.length)];
        }
        long started = columnSampling ? cpuNanos() : 0;
        int length = column.compressByteArray(packed, 0, bound, share.values, 0, plain);
        if (columnSampling) {
            columnNanos += cpuNanos() - started;
            columnPlain += plain;
            columnPacked += length;
            if (columnPlain >= AUTO_SAMPLE_BYTES) {
                columnSampling = false;
                columnCompressing = pays(columnNanos, columnPlain, columnPacked);
            }
        }
        return (long) length * 8 <= (long) plain * COLUMN_KEEP_EIGHTHS ? length : -1;
    }

    /** Whether compressing {@code plain} bytes to {@code packed} in {@code nanos} of CPU
     * (and the server's decompression of them) costs less than sending and storing the
     * bytes saved ({@link #SAVED_NS_PER_BYTE}). */
    static boolean pays(long nanos, long plain, long packed) {
        return nanos * (1 + DECODE_SHARE) < (plain - packed) * SAVED_NS_PER_BYTE;
    }

    /** This thread's CPU time (wall time where the JVM cannot tell it), ns. */
    private static long cpuNanos() {
        long cpu = THREADS.isCurrentThreadCpuTimeSupported() ? THREADS.getCurrentThreadCpuTime()
            : -1;
        return cpu >= 0 ? cpu : System.nanoTime();
    }

    @Override
    public void close() {
        pending.clear();
        spare.clear();
        pendingCost = 0;
        if (zstd != null) {
            zstd.close();
        }
        if (column != null) {
            column.close();
        }
    }
}
