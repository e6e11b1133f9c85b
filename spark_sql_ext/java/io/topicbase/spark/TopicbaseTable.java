package io.topicbase.spark;

import java.util.HashMap;
import java.util.Map;
import java.util.Optional;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A topic or table of the catalog: Spark's Python table around the {@code topicbase} source,
 * with the relation's connection options merged into every scan and write, each of which
 * gets a Python table of its own. (Spark hands a Python table's writer only the write's own
 * options, so an {@code INSERT INTO} would otherwise reach the source without its url,
 * credentials and target; and a Python table keeps the data source it first made, so a
 * {@code readStream.table(...).option("startingOffsets", ...)} would lose its options.)
 *
 * <p>With the catalog's {@code wire} option a topic's batch scans ({@link WireScan}) and
 * its writes, batch and streaming ({@link WireWrite}), run in the JVM over the PostgreSQL
 * wire; streaming reads and tables keep the Python source.
 */
final class TopicbaseTable implements SupportsRead, SupportsWrite {
    private final Table delegate;
    private final Map<String, String> options;

    TopicbaseTable(Table delegate, Map<String, String> options) {
        if (!(delegate instanceof SupportsRead) || !(delegate instanceof SupportsWrite)) {
            throw new IllegalStateException("the Python table reads and writes");
        }
        this.delegate = delegate;
        this.options = options;
    }

    private Table fresh(CaseInsensitiveStringMap all) {
        PythonDataSourceV2 provider = new PythonDataSourceV2();
        provider.setShortName(TopicbaseCatalog.SOURCE);
        return provider.getTable(schema(), new Transform[0], all.asCaseSensitiveMap());
    }

    private CaseInsensitiveStringMap merged(CaseInsensitiveStringMap given) {
        Map<String, String> all = new HashMap<>(options);
        all.putAll(given.asCaseSensitiveMap());
        return new CaseInsensitiveStringMap(all);
    }

    @Override
    public String name() {
        return delegate.name();
    }

    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
        return delegate.schema();
    }

    @Override
    public Column[] columns() {
        return delegate.columns();
    }

    @Override
    public Transform[] partitioning() {
        return delegate.partitioning();
    }

    @Override
    public Map<String, String> properties() {
        Map<String, String> shown = new HashMap<>(delegate.properties());
        shown.remove("password");
        return shown;
    }

    @Override
    public Set<TableCapability> capabilities() {
        return delegate.capabilities();
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap given) {
        return new PruningScanBuilder(schema(), merged(given));
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        CaseInsensitiveStringMap all = merged(info.options());
        LogicalWriteInfo withOptions = new LogicalWriteInfo() {
            @Override
            public CaseInsensitiveStringMap options() {
                return all;
            }

            @Override
            public String queryId() {
                return info.queryId();
            }

            @Override
            public StructType schema() {
                return info.schema();
            }

            @Override
            public Optional<StructType> rowIdSchema() {
                return info.rowIdSchema();
            }

            @Override
            public Optional<StructType> metadataSchema() {
                return info.metadataSchema();
            }
        };
        WriteBuilder python = ((SupportsWrite) fresh(all)).newWriteBuilder(withOptions);
        if (all.containsKey("wire") && all.containsKey("topic")) {
            return new WireWrite.Builder(all.asCaseSensitiveMap(), info.schema(), python);
        }
        return python;
    }
}
