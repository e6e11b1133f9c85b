package io.topicbase.spark;

import org.apache.arrow.compression.CommonsCompressionFactory;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.compression.CompressionCodec;
import org.apache.arrow.vector.compression.CompressionUtil;

/**
 * The codecs the wire reader decodes compressed batches with: Arrow's own zstd codec, but a
 * buffer whose 8-byte prefix declares more than {@link #DECLARED_BYTES_MAX} decoded bytes is
 * refused before anything is allocated for it.
 *
 * <p>Arrow's codec allocates the declared length and decompresses into it, so without the
 * bound a few KB of zstd from whatever answers at {@code wire} could make a task allocate
 * and fill gigabytes. Topicbase itself never sends more: a stored frame's compressed column
 * declares at most {@code storage.limits.COLUMN_DECLARED_BYTES_MAX} (16 MiB, checked at
 * ingest), and the server sends such frames as stored. Other codecs (LZ4) are refused: the
 * reader only ever asks for zstd.
 */
final class BoundedZstdCodecs implements CompressionCodec.Factory {
    /** {@code storage.limits.COLUMN_DECLARED_BYTES_MAX}: the most a stored column declares. */
    static final long DECLARED_BYTES_MAX = 16L << 20;

    static final BoundedZstdCodecs INSTANCE = new BoundedZstdCodecs();

    private BoundedZstdCodecs() {}

    @Override
    public CompressionCodec createCodec(CompressionUtil.CodecType type) {
        if (type == CompressionUtil.CodecType.NO_COMPRESSION) {
            return CommonsCompressionFactory.INSTANCE.createCodec(type);
        }
        if (type != CompressionUtil.CodecType.ZSTD) {
            throw new IllegalArgumentException("the server sent " + type
                + "-compressed batches; the reader asked for zstd only");
        }
        return new Bounded(CommonsCompressionFactory.INSTANCE.createCodec(type));
    }

    @Override
    public CompressionCodec createCodec(CompressionUtil.CodecType type, int level) {
        return createCodec(type);
    }

    /** A zstd codec that checks each buffer's declared length before decoding it. */
    private static final class Bounded implements CompressionCodec {
        private final CompressionCodec inner;

        Bounded(CompressionCodec inner) {
            this.inner = inner;
        }

        @Override
        public ArrowBuf compress(BufferAllocator allocator, ArrowBuf buffer) {
            return inner.compress(allocator, buffer);
        }

        @Override
        public ArrowBuf decompress(BufferAllocator allocator, ArrowBuf buffer) {
            if (buffer.writerIndex() >= CompressionUtil.SIZE_OF_UNCOMPRESSED_LENGTH) {
                long declared = buffer.getLong(0); // little-endian, as Arrow's IPC writes it
                if (declared > DECLARED_BYTES_MAX) {
                    buffer.close();
                    throw new IllegalStateException("a compressed buffer declares " + declared
                        + " decoded bytes, more than the " + DECLARED_BYTES_MAX
                        + " a Topicbase frame may hold: refused before decoding");
                }
            }
            return inner.decompress(allocator, buffer);
        }

        @Override
        public CompressionUtil.CodecType getCodecType() {
            return inner.getCodecType();
        }
    }
}
