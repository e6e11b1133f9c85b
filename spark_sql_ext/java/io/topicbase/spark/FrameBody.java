package io.topicbase.spark;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.WritableByteChannel;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.ReferenceManager;
import org.apache.arrow.flatbuf.BodyCompressionMethod;
import org.apache.arrow.flatbuf.CompressionType;
import org.apache.arrow.vector.compression.NoCompressionCodec;
import org.apache.arrow.vector.ipc.WriteChannel;
import org.apache.arrow.vector.ipc.message.ArrowBodyCompression;
import org.apache.arrow.vector.ipc.message.ArrowBuffer;
import org.apache.arrow.vector.ipc.message.ArrowFieldNode;
import org.apache.arrow.vector.ipc.message.ArrowRecordBatch;
import org.apache.arrow.vector.ipc.message.MessageSerializer;

/**
 * One staged frame's body (an Arrow IPC record-batch message of the server's wire schema,
 * {@link WireFrames#wireSchema}) laid out by hand around the partition's pending data, so
 * the messages' bytes go from the pending array to the socket with no copy in between
 * (before: pending array -> an Arrow data vector -> the serialized body -> the socket).
 *
 * <p>The body is three pieces sent one after the other: {@link #head} (the message's
 * metadata, then every buffer before the data column's values: {@code seq_no},
 * {@code producer_id}, {@code message_group_id}, {@code created_at}, {@code codec}, the
 * data's validity and offsets), the pending values themselves, then {@link #tailLength}
 * zero bytes (the values' padding and the {@code metadata} column's buffers: every row's
 * metadata is null, so they are zeros). Invariants:
 * <ul>
 * <li>the bytes are exactly what Arrow Java's {@code VectorUnloader} and
 * {@code MessageSerializer} write for the same rows filled into a {@code VectorSchemaRoot}
 * of the wire schema (the metadata is Arrow's own, from {@link ArrowRecordBatch} over
 * buffers that carry only their lengths; the buffers are placed at Arrow's layout offsets;
 * {@code tests/spark/test_frame_body.py} compares the two byte for byte);
 * <li>a body's size is a multiple of 8 (each buffer and the metadata padded to 8).
 * </ul>
 *
 * <p>A <em>column-compressed</em> body ({@link #lay} given the data values' zstd length,
 * round 22: the server's {@code storage.column_codec}) declares Arrow's body compression
 * (codec ZSTD, method BUFFER): every non-empty buffer starts with its int64 uncompressed
 * length, -1 for the buffers stored as they are (all but the data's values), the data's
 * values are one zstd frame. Then the head ends with the values' 8-byte length prefix, the
 * pending piece is the zstd frame, and the tail ({@link #tail}) holds the padding and the
 * {@code metadata} column's buffers, each non-empty one behind its -1 prefix.
 */
final class FrameBody {
    /** The buffer of the data column's values, in the order Arrow lays a batch out. */
    static final int DATA_VALUES = 14;
    private static final int BUFFERS = 24;
    private static final int OFFSET = Integer.BYTES;

    /** The metadata and every buffer before the data's values; its first {@link
     * #headLength} bytes are this frame's. */
    byte[] head = new byte[1 << 16];
    int headLength;
    /** Bytes after the data's values, to the body's end: zeros for a plain body; for a
     * column-compressed one the first {@code tailLength} bytes of {@link #tail}. */
    int tailLength;
    /** A column-compressed body's tail (see the class doc); unused for a plain body. */
    byte[] tail = new byte[1 << 10];
    private static final ArrowBodyCompression ZSTD_BUFFERS = new ArrowBodyCompression(
        CompressionType.ZSTD, BodyCompressionMethod.BUFFER);
    /** A buffer's length prefix: stored as it is. */
    private static final long NOT_COMPRESSED = -1L;
    private static final int PREFIX = Long.BYTES;
    private final long[] lengths = new long[BUFFERS];
    private final List<ArrowFieldNode> nodes = new ArrayList<>(10);
    private final List<ArrowBuf> descriptors = new ArrayList<>(BUFFERS);
    private final Head channel = new Head();

    /** The body of {@code count} rows: their {@code seq_no} ({@code seqNull[i]}: null,
     * {@code seq[i]} then 0), {@code created_at}, every message of {@code codec}, the
     * data's value ends {@code ends} over {@code bytes} bytes. Returns the body's size. */
    long lay(int count, long[] seq, boolean[] seqNull, long[] created, byte codec, int[] ends,
            long bytes) throws IOException {
        return lay(count, seq, seqNull, created, codec, ends, bytes, -1);
    }

    /** As above; {@code packed} >= 0: the data's values go as a zstd frame of {@code packed}
     * bytes (the pending piece), the body column-compressed (the class doc). */
    long lay(int count, long[] seq, boolean[] seqNull, long[] created, byte codec, int[] ends,
            long bytes, int packed) throws IOException {
        boolean compressed = packed >= 0;
        int shift = compressed ? PREFIX : 0; // where a buffer's contents start in it
        assert count > 0 && bytes == ends[count - 1] : count + " rows, " + bytes + " bytes";
        int nullSeq = 0;
        for (int i = 0; i < count; i++) {
            if (seqNull[i]) {
                nullSeq++;
            }
        }
        long validity = (count + 7) / 8;
        long offsets = (long) (count + 1) * OFFSET;
        long[] sizes = {
            validity, 8L * count, // seq_no
            validity, offsets, 0, // producer_id (every row null)
            validity, offsets, 0, // message_group_id (every row null)
            validity, 8L * count, // created_at
            validity, count, // codec
            validity, offsets, bytes, // data
            validity, offsets, // metadata (every row null): a map of no entries
            0, // its entries (a struct of no rows)
            0, OFFSET, 0, // their keys
            0, OFFSET, 0, // their values
        };
        assert sizes.length == BUFFERS && DATA_VALUES == 14 && sizes[DATA_VALUES] == bytes;
        if (compressed) {
            for (int i = 0; i < BUFFERS; i++) {
                if (i == DATA_VALUES) {
                    sizes[i] = bytes == 0 ? 0 : PREFIX + (long) packed;
                } else if (sizes[i] > 0) {
                    sizes[i] += PREFIX;
                }
            }
        }
        System.arraycopy(sizes, 0, lengths, 0, BUFFERS);
        nodes.clear();
        nodes.add(new ArrowFieldNode(count, nullSeq));
        nodes.add(new ArrowFieldNode(count, count));
        nodes.add(new ArrowFieldNode(count, count));
        nodes.add(new ArrowFieldNode(count, 0));
        nodes.add(new ArrowFieldNode(count, 0));
        nodes.add(new ArrowFieldNode(count, 0));
        nodes.add(new ArrowFieldNode(count, count));
        nodes.add(new ArrowFieldNode(0, 0));
        nodes.add(new ArrowFieldNode(0, 0));
        nodes.add(new ArrowFieldNode(0, 0));
        descriptors.clear();
        for (long length : lengths) {
            descriptors.add(lengthOnly(length));
        }
        // Arrow's own metadata and layout for these lengths (the buffers are never read).
        ArrowRecordBatch batch = new ArrowRecordBatch(count, nodes, descriptors,
            compressed ? ZSTD_BUFFERS : NoCompressionCodec.DEFAULT_BODY_COMPRESSION,
            new ArrayList<>(), true, false);
        List<ArrowBuffer> layout = batch.getBuffersLayout();
        channel.used = 0;
        WriteChannel out = new WriteChannel(channel);
        ByteBuffer metadata = MessageSerializer.serializeMetadata(batch);
        MessageSerializer.writeMessageBuffer(out, metadata.remaining(), metadata);
        int bodyAt = channel.used;
        assert bodyAt % 8 == 0 : bodyAt;
        long dataAt = layout.get(DATA_VALUES).getOffset();
        long bodyLength = batch.computeBodyLength();
        if (bodyAt + dataAt > Integer.MAX_VALUE - 8) {
            throw new IllegalArgumentException("a frame's metadata must stay under 2 GiB");
        }
        long valuesLength = lengths[DATA_VALUES] - (compressed && bytes > 0 ? PREFIX : 0);
        int valuesPrefix = compressed && bytes > 0 ? PREFIX : 0; // in the head, last
        headLength = (int) (bodyAt + dataAt) + valuesPrefix;
        tailLength = (int) (bodyLength - dataAt - valuesPrefix - valuesLength);
        assert tailLength >= 0 && tailLength < 64 + 2 * offsets + 2 * validity + 16 * PREFIX
            : tailLength;
        if (head.length < headLength) {
            head = Arrays.copyOf(head, Math.max(headLength, 2 * head.length));
        }
        Arrays.fill(head, bodyAt, headLength, (byte) 0); // padding and null rows: zeros
        ByteBuffer at = ByteBuffer.wrap(head).order(ByteOrder.LITTLE_ENDIAN);
        if (compressed) {
            for (int i = 0; i < DATA_VALUES; i++) {
                if (lengths[i] > 0) {
                    at.putLong(bodyAt + (int) layout.get(i).getOffset(), NOT_COMPRESSED);
                }
            }
            if (bytes > 0) {
                at.putLong(headLength - PREFIX, bytes); // the values' uncompressed length
            }
            layTail(layout, dataAt + valuesPrefix + valuesLength, bodyLength);
        }
        int seqValidity = bodyAt + (int) layout.get(0).getOffset() + shift;
        int seqValues = bodyAt + (int) layout.get(1).getOffset() + shift;
        int createdValidity = bodyAt + (int) layout.get(8).getOffset() + shift;
        int createdValues = bodyAt + (int) layout.get(9).getOffset() + shift;
        int codecValidity = bodyAt + (int) layout.get(10).getOffset() + shift;
        int codecValues = bodyAt + (int) layout.get(11).getOffset() + shift;
        int dataValidity = bodyAt + (int) layout.get(12).getOffset() + shift;
        int dataOffsets = bodyAt + (int) layout.get(13).getOffset() + shift;
        for (int i = 0; i < count; i++) {
            if (!seqNull[i]) {
                head[seqValidity + (i >> 3)] |= (byte) (1 << (i & 7));
                at.putLong(seqValues + 8 * i, seq[i]);
            }
            at.putLong(createdValues + 8 * i, created[i]);
            at.putInt(dataOffsets + OFFSET * (i + 1), ends[i]);
        }
        allSet(createdValidity, count);
        allSet(codecValidity, count);
        allSet(dataValidity, count);
        Arrays.fill(head, codecValues, codecValues + count, codec);
        return bodyAt + bodyLength;
    }

    /** A column-compressed body's tail, from body position {@code from} (the data's
     * values' end) to {@code bodyLength}: zeros, and -1 at the start of every non-empty
     * buffer after the data's values (the {@code metadata} column's: all rows null). */
    private void layTail(List<ArrowBuffer> layout, long from, long bodyLength) {
        int length = (int) (bodyLength - from);
        if (tail.length < length) {
            tail = new byte[Math.max(length, 2 * tail.length)];
        }
        Arrays.fill(tail, 0, length, (byte) 0);
        ByteBuffer at = ByteBuffer.wrap(tail).order(ByteOrder.LITTLE_ENDIAN);
        for (int i = DATA_VALUES + 1; i < BUFFERS; i++) {
            if (lengths[i] > 0) {
                at.putLong((int) (layout.get(i).getOffset() - from), NOT_COMPRESSED);
            }
        }
    }

    /** The first {@code count} bits from {@code at} set (the rest of the byte stays 0). */
    private void allSet(int at, int count) {
        Arrays.fill(head, at, at + count / 8, (byte) 0xFF);
        if (count % 8 != 0) {
            head[at + count / 8] = (byte) ((1 << (count % 8)) - 1);
        }
    }

    /** A buffer that only states its length, for Arrow to lay the batch out and write its
     * metadata; it owns no memory and nothing reads it. */
    private static ArrowBuf lengthOnly(long length) {
        ArrowBuf buffer = new ArrowBuf(ReferenceManager.NO_OP, null, length, 0L);
        buffer.writerIndex(length);
        return buffer;
    }

    /** Where the message's metadata is written: the start of {@link #head}. */
    private final class Head implements WritableByteChannel {
        int used;

        @Override
        public int write(ByteBuffer source) {
            int length = source.remaining();
            if (head.length - used < length) {
                head = Arrays.copyOf(head, Math.max(head.length * 2, used + length));
            }
            source.get(head, used, length);
            used += length;
            return length;
        }

        @Override
        public boolean isOpen() {
            return true;
        }

        @Override
        public void close() {
            // nothing held
        }
    }
}
