package io.topicbase.spark;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.execution.datasources.v2.python.PythonScanBuilder;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The scan of a catalog relation with column pruning, which Spark's Python tables lack: the
 * Python source is asked for the columns the query needs (its option {@code columns}), so a
 * {@code SELECT count(*)} or a {@code GROUP BY partition} over a topic moves no message data
 * (the Flight door answers {@code partition} and {@code offset} from the range alone).
 *
 * <p>Filters go to the Python scan over the whole schema, as before; when it keeps any of
 * them (filter pushdown on), the scan is not pruned, since a pushed filter may name a column
 * the query does not read. An empty column list (a count) reads {@code partition} of a topic;
 * a table is then read whole.
 *
 * <p>With the catalog's {@code wire} option (host:port of the PostgreSQL-wire server), a
 * batch scan of a topic is a {@link WireScan} instead: read in the JVM, pruned the same way;
 * filters on {@code partition} and {@code offset} narrow its cut ({@link WireBounds}) and
 * Spark still applies every filter. Options the wire scan does not implement
 * ({@code startingOffsets}, {@code endingOffsets}, {@code pushFilters}) keep the Python
 * scan; so do streaming reads, which Spark asks of the Python scan (its {@code
 * toMicroBatchStream}).
 */
final class PruningScanBuilder implements SupportsPushDownFilters, SupportsPushDownRequiredColumns {
    private final StructType schema;
    private final Map<String, String> options;
    private final PythonScanBuilder whole;
    private StructType required;
    private final boolean wire;
    private WireBounds bounds = WireBounds.of(new Filter[0]);
    private static final String[] PYTHON_ONLY = {"startingOffsets", "endingOffsets", "pushFilters"};

    PruningScanBuilder(StructType schema, CaseInsensitiveStringMap options) {
        this.schema = schema;
        this.options = new HashMap<>(options.asCaseSensitiveMap());
        this.whole = new PythonScanBuilder(provider(), TopicbaseCatalog.SOURCE, schema, options);
        this.required = schema;
        boolean overWire = options.containsKey("wire") && options.containsKey("topic");
        for (String key : PYTHON_ONLY) {
            overWire = overWire && !options.containsKey(key);
        }
        this.wire = overWire;
    }

    private static PythonDataSourceV2 provider() {
        PythonDataSourceV2 provider = new PythonDataSourceV2();
        provider.setShortName(TopicbaseCatalog.SOURCE);
        return provider;
    }

    @Override
    public Filter[] pushFilters(Filter[] filters) {
        if (wire) {
            bounds = WireBounds.of(filters);
            return filters; // all still evaluated by Spark: the bounds only narrow the cut
        }
        return whole.pushFilters(filters);
    }

    @Override
    public Filter[] pushedFilters() {
        return wire ? bounds.used() : whole.pushedFilters();
    }

    @Override
    public void pruneColumns(StructType requiredSchema) {
        required = requiredSchema;
    }

    @Override
    public Scan build() {
        StructType read = readSchema();
        if (wire) {
            return new WireScan(read, options, bounds) {
                @Override
                public org.apache.spark.sql.connector.read.streaming.MicroBatchStream
                        toMicroBatchStream(String checkpointLocation) {
                    return whole.build().toMicroBatchStream(checkpointLocation);
                }
            };
        }
        if (whole.pushedFilters().length > 0 || read.fields().length == schema.fields().length) {
            return whole.build();
        }
        List<String> names = new ArrayList<>();
        for (StructField field : read.fields()) {
            names.add(field.name());
        }
        Map<String, String> narrowed = new HashMap<>(options);
        narrowed.put("columns", String.join(",", names));
        return new PythonScanBuilder(provider(), TopicbaseCatalog.SOURCE, read,
            new CaseInsensitiveStringMap(narrowed)).build();
    }

    /** The columns to read: the required ones in the relation's order. */
    private StructType readSchema() {
        List<StructField> fields = new ArrayList<>();
        for (StructField field : schema.fields()) {
            if (required.getFieldIndex(field.name()).isDefined()) {
                fields.add(field);
            }
        }
        if (fields.isEmpty() && options.containsKey("topic")) {
            fields.add(schema.apply("partition"));
        }
        return fields.isEmpty() ? schema : new StructType(fields.toArray(new StructField[0]));
    }
}
