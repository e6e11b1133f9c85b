package io.topicbase.spark;

import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * A batch scan of one topic through the JVM: the driver cuts the topic into ranges of at
 * most {@code splitRows} messages ({@code [start, end)} of one partition, from {@code
 * sys.partitions} over one PostgreSQL-wire connection), and each Spark task reads its range
 * with {@link WireBatchReader} ({@code COPY ... TO STDOUT (FORMAT arrow)}) as columnar
 * batches. No Python worker takes part.
 *
 * <p>The end offsets of one {@code sys.partitions} query are one consistent cut (taken under
 * the server's publish lock, as the Flight door's; docs/copy_arrow.md): a transaction's
 * publish across partitions is in it whole or not at all. Every range is read exactly as
 * cut: messages that retention removed since fail the task (the server's 22023), none are
 * skipped.
 */
class WireScan implements Scan, Batch {
    /** The Python source's default (spark_sql_ext.options.DEFAULT_SPLIT_ROWS). */
    static final long DEFAULT_SPLIT_ROWS = 1_000_000L;

    private final StructType schema;
    private final HashMap<String, String> options;
    private final String topic;
    private final WireBounds bounds;

    WireScan(StructType schema, Map<String, String> options, WireBounds bounds) {
        assert options.containsKey("wire") && options.containsKey("topic");
        this.schema = schema;
        this.options = new HashMap<>(options);
        this.topic = options.get("topic");
        this.bounds = bounds;
    }

    @Override
    public StructType readSchema() {
        return schema;
    }

    @Override
    public String description() {
        return "TopicbaseWireScan(topic=" + topic + ", " + bounds + "columns="
            + String.join(",", columns()) + ")";
    }

    @Override
    public Batch toBatch() {
        return this;
    }

    private List<String> columns() {
        List<String> names = new ArrayList<>();
        for (StructField field : schema.fields()) {
            names.add(field.name());
        }
        return names;
    }

    static String quoteIdentifier(String name) {
        return '"' + name.replace("\"", "\"\"") + '"';
    }

    static String quoteLiteral(String value) {
        return "'" + value.replace("'", "''") + "'";
    }

    private long splitRows() {
        String given = options.get("splitRows");
        long rows = given == null ? DEFAULT_SPLIT_ROWS : Long.parseLong(given.trim());
        if (rows < 1) {
            throw new IllegalArgumentException("splitRows must be at least 1, not " + given);
        }
        return rows;
    }

    /** One range of a partition: messages [start, end). */
    static final class Range implements InputPartition, Serializable {
        private static final long serialVersionUID = 1L;
        final int partition;
        final long start;
        final long end;

        Range(int partition, long start, long end) {
            assert start < end;
            this.partition = partition;
            this.start = start;
            this.end = end;
        }
    }

    @Override
    public InputPartition[] planInputPartitions() {
        long split = splitRows();
        List<InputPartition> ranges = new ArrayList<>();
        List<String[]> rows;
        try {
            rows = PgWireClient.run(options.get("wire"), options, client -> {
                List<String[]> found = client.query("SELECT partition, start_offset, "
                    + "end_offset FROM sys.partitions WHERE topic = " + quoteLiteral(topic)
                    + " ORDER BY partition");
                if (found.isEmpty()) { // a missing topic (dropped since it was resolved)
                    client.query("SELECT count(*) FROM TOPIC " + quoteIdentifier(topic)
                        + " WHERE false");
                }
                return found;
            });
        } catch (IOException e) {
            throw new UncheckedIOException("cannot cut topic " + topic + " at "
                + options.get("wire") + ": " + e.getMessage(), e);
        }
        for (String[] row : rows) {
            int partition = Integer.parseInt(row[0]);
            if (!bounds.wants(partition)) {
                continue;
            }
            long start = bounds.from(Long.parseLong(row[1]));
            long end = bounds.to(Long.parseLong(row[2]));
            for (long at = start; at < end; at += split) {
                ranges.add(new Range(partition, at, Math.min(end, at + split)));
            }
        }
        return ranges.toArray(new InputPartition[0]);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new WireBatchReader.Factory(options, topic, schema);
    }
}
