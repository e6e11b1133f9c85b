package io.topicbase.spark;

/**
 * Figures of this JVM's last wire write's driver commit, for benchmarks (bench/spark_bench.py
 * reads them through py4j): how long {@code COMMIT WRITES} took end to end (the server's
 * publish plus one round trip), with how many task writes and rows.
 */
public final class WireWriteStats {
    private static volatile double commitSeconds;
    private static volatile int writes;
    private static volatile long rows;

    private WireWriteStats() {
    }

    static void commitDone(double seconds, int writeCount, long rowCount) {
        commitSeconds = seconds;
        writes = writeCount;
        rows = rowCount;
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
