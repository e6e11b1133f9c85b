package io.topicbase.spark;

/**
 * Figures of this JVM's last wire write's driver commit, for benchmarks (bench/spark_bench.py
 * reads them through py4j): how long {@code COMMIT WRITES} took end to end (the server's
 * publish plus one round trip), with how many task writes and rows; and the frames' codec
 * the driver chose for its last write ({@code raw} or {@code zstd}: {@code frameCodec=auto}
 * resolved).
 */
public final class WireWriteStats {
    private static volatile double commitSeconds;
    private static volatile int writes;
    private static volatile long rows;
    private static volatile String frameCodec = "";
    private static final java.util.concurrent.atomic.AtomicLong ZSTD_MESSAGES =
        new java.util.concurrent.atomic.AtomicLong();
    private static final java.util.concurrent.atomic.AtomicLong RAW_MESSAGES =
        new java.util.concurrent.atomic.AtomicLong();

    private WireWriteStats() {
    }

    static void commitDone(double seconds, int writeCount, long rowCount) {
        commitSeconds = seconds;
        writes = writeCount;
        rows = rowCount;
    }

    static void frameCodecChosen(String codec) {
        frameCodec = codec;
    }

    private static final java.util.concurrent.atomic.AtomicLong COLUMN_MESSAGES =
        new java.util.concurrent.atomic.AtomicLong();

    /** Messages sent in frames by this JVM's tasks (in local mode, the driver's JVM):
     * zstd-compressed each, or raw, in a column-compressed frame ({@code column}) or not. */
    static void framesSent(boolean zstd, boolean column, long messages) {
        (zstd ? ZSTD_MESSAGES : RAW_MESSAGES).addAndGet(messages);
        if (column) {
            COLUMN_MESSAGES.addAndGet(messages);
        }
    }

    /** Messages this JVM's tasks sent raw in frames whose data column was compressed whole
     * (counted among {@link #rawMessagesSent} too), so far. */
    public static long columnMessagesSent() {
        return COLUMN_MESSAGES.get();
    }

    /** Messages this JVM's tasks sent zstd-compressed in frames, so far. */
    public static long zstdMessagesSent() {
        return ZSTD_MESSAGES.get();
    }

    /** Messages this JVM's tasks sent raw in frames, so far. */
    public static long rawMessagesSent() {
        return RAW_MESSAGES.get();
    }

    /** The frames' codec policy of the last write built in this JVM's driver: raw, zstd
     * or auto (zstd while it pays; a topic that accepts zstd); "" before any. */
    public static String lastFrameCodec() {
        return frameCodec;
    }

    public static double lastCommitSeconds() {
        return commitSeconds;
    }

    public static int lastCommitWrites() {
        return writes;
    }

    public static long lastCommitRows() {
        return rows;
    }
}
