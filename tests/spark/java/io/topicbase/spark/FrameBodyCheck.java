package io.topicbase.spark;

import java.io.ByteArrayOutputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.Channels;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.zip.CRC32C;

import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.TimeStampMicroTZVector;
import org.apache.arrow.vector.UInt1Vector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.VectorUnloader;
import org.apache.arrow.vector.ipc.WriteChannel;
import org.apache.arrow.vector.ipc.message.ArrowRecordBatch;
import org.apache.arrow.vector.ipc.message.MessageSerializer;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

import com.github.luben.zstd.ZstdCompressCtx;

/**
 * {@code tests/spark/test_frame_body.py}'s Java side: rows through {@link WireFrames} (its
 * bodies laid out by hand around the pending data, {@link FrameBody}) and, for the same rows
 * of each frame, the body the writer made before (rounds 16-18: the rows filled into a
 * {@code VectorSchemaRoot} of the wire schema, {@code VectorUnloader},
 * {@code MessageSerializer}); every body must be equal byte for byte and every header's
 * CRC-32C the body's. Cases: raw and zstd messages, Spark's {@code UnsafeRow}s and other
 * rows, null and given {@code seq_no}, empty messages to one of 5 MB, frames cut by count
 * and by bytes, and many partitions (the pending bound's early frames).
 *
 * <p>Usage: {@code java -cp ... io.topicbase.spark.FrameBodyCheck <directory>}: writes
 * case i's frames stream to {@code <directory>/i.frames}, prints {@code frames F rows R};
 * exits 1 at the first difference.
 */
public final class FrameBodyCheck {
    private static final StructType WRITTEN = new StructType()
        .add("data", DataTypes.BinaryType, false)
        .add("partition", DataTypes.IntegerType, false)
        .add("seq_no", DataTypes.LongType, true)
        .add("created_at", DataTypes.TimestampType, true);

    /** One row as written: its partition and values. */
    private record Row(byte[] data, int partition, Long seq, long created) {
        InternalRow internal() {
            return new GenericInternalRow(new Object[] {data, partition, seq, created});
        }
    }

    private static long framesSeen;
    private static long rowsSeen;

    public static void main(String[] args) throws Exception {
        String out = args[0];
        check(out + "/0.frames", rows(9001, 3, 2048), "raw", true);
        check(out + "/1.frames", rows(9001, 3, 2048), "zstd", true);
        check(out + "/2.frames", rows(700, 2, 300), "raw", false); // not UnsafeRows
        check(out + "/3.frames", rows(20000, 2, 40), "raw", true); // cut at 4,096 messages
        check(out + "/4.frames", rows(6000, 60, 2048), "raw", true); // the pending bound
        List<Row> large = new ArrayList<>(rows(40, 2, 100));
        byte[] big = new byte[5_000_000];
        Arrays.fill(big, (byte) 'q');
        large.add(20, new Row(big, 1, 7L, 1_700_000_000_000_000L));
        check(out + "/5.frames", large, "raw", true);
        // round 22: frames whose data column is compressed whole (checked on the Python side)
        check(out + "/6.frames", rows(9001, 3, 2048), "column", true);
        check(out + "/7.frames", large, "column", false);
        System.out.println("frames " + framesSeen + " rows " + rowsSeen);
    }

    /** {@code count} rows over {@code partitions}: data of 0 to {@code maxLength - 1}
     * bytes (text, digits first), every 5th {@code seq_no} null. */
    private static List<Row> rows(int count, int partitions, int maxLength) {
        List<Row> rows = new ArrayList<>(count);
        for (int i = 0; i < count; i++) {
            int length = (int) ((i * 2654435761L) % maxLength);
            byte[] data = new byte[length];
            byte[] digits = Integer.toString(i).getBytes();
            for (int b = 0; b < length; b++) {
                data[b] = b < digits.length ? digits[b] : (byte) ('a' + (i + b / 64) % 26);
            }
            rows.add(new Row(data, (int) ((i * 7L) % partitions), i % 5 == 0 ? null : (long) i,
                1_700_000_000_000_000L + 1000L * i));
        }
        return rows;
    }

    private static void check(String path, List<Row> rows, String codec, boolean unsafe)
            throws IOException {
        UnsafeProjection project = UnsafeProjection.create(WRITTEN);
        ByteArrayOutputStream sent = new ByteArrayOutputStream();
        try (WireFrames frames = new WireFrames(WRITTEN, new int[] {0, 1, 2, 3}, codec)) {
            for (Row row : rows) {
                InternalRow internal = row.internal();
                frames.write(unsafe ? project.apply(internal) : internal, sent);
            }
            frames.finish(sent);
        }
        byte[] stream = sent.toByteArray();
        try (OutputStream file = new FileOutputStream(path)) {
            file.write(stream);
        }
        Map<Integer, ArrayDeque<Row>> waiting = new HashMap<>();
        for (Row row : rows) {
            waiting.computeIfAbsent(row.partition(), p -> new ArrayDeque<>()).add(row);
        }
        ByteBuffer in = ByteBuffer.wrap(stream).order(ByteOrder.LITTLE_ENDIAN);
        while (in.hasRemaining()) {
            byte[] magic = new byte[4];
            in.get(magic);
            require(Arrays.equals(magic, "TBs1".getBytes()), "a frame's magic");
            int crcSent = in.getInt();
            int partition = (int) in.getLong();
            int count = in.getInt();
            int size = in.getInt();
            byte[] body = new byte[size];
            in.get(body);
            CRC32C crc = new CRC32C();
            crc.update(body);
            require((int) crc.getValue() == crcSent, "the header's CRC-32C is the body's");
            List<Row> mine = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                mine.add(waiting.get(partition).remove());
            }
            byte[] before = codec.equals("column") ? body : oldBody(mine, codec.equals("zstd"));
            if (!Arrays.equals(body, before)) {
                int at = Arrays.mismatch(body, before);
                throw fail("frame " + framesSeen + " (" + codec + ", partition " + partition
                    + ", " + count + " rows, " + size + " bytes, the old path's "
                    + before.length + ") differs from byte " + at);
            }
            framesSeen++;
            rowsSeen += count;
        }
        for (ArrayDeque<Row> left : waiting.values()) {
            require(left.isEmpty(), "every row sent");
        }
    }

    /** The body the writer sent before rounds 19's change for these rows (its
     * {@code flush}: the rows in Arrow vectors of the wire schema, then Arrow's
     * serializer), each message compressed as one zstd frame at level 1 when {@code zstd}. */
    private static byte[] oldBody(List<Row> rows, boolean zstd) throws IOException {
        try (BufferAllocator allocator = new RootAllocator();
             VectorSchemaRoot root = VectorSchemaRoot.create(WireFrames.wireSchema(), allocator);
             ZstdCompressCtx compress = new ZstdCompressCtx()) {
            compress.setLevel(WireFrames.ZSTD_LEVEL);
            compress.setContentSize(true);
            root.allocateNew();
            BigIntVector seq = (BigIntVector) root.getVector(0);
            TimeStampMicroTZVector created = (TimeStampMicroTZVector) root.getVector(3);
            UInt1Vector codec = (UInt1Vector) root.getVector(4);
            VarBinaryVector data = (VarBinaryVector) root.getVector(5);
            for (int i = 0; i < rows.size(); i++) {
                Row row = rows.get(i);
                if (row.seq() == null) {
                    seq.setNull(i);
                } else {
                    seq.setSafe(i, row.seq());
                }
                created.setSafe(i, row.created());
                codec.setSafe(i, zstd ? 4 : 1);
                data.setSafe(i, zstd ? compress.compress(row.data()) : row.data());
            }
            root.setRowCount(rows.size());
            ByteArrayOutputStream body = new ByteArrayOutputStream();
            try (ArrowRecordBatch batch = new VectorUnloader(root).getRecordBatch()) {
                MessageSerializer.serialize(new WriteChannel(Channels.newChannel(body)), batch);
            }
            return body.toByteArray();
        }
    }

    private static void require(boolean holds, String what) {
        if (!holds) {
            throw fail(what);
        }
    }

    private static IllegalStateException fail(String what) {
        System.out.println("MISMATCH " + what);
        System.out.flush();
        Runtime.getRuntime().halt(1);
        return new IllegalStateException(what);
    }
}
