package io.topicbase.spark;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.regex.Pattern;

import org.apache.spark.sql.DataFrameReader;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.analysis.NoSuchNamespaceException;
import org.apache.spark.sql.catalyst.analysis.NoSuchTableException;
import org.apache.spark.sql.catalyst.analysis.TableAlreadyExistsException;
import org.apache.spark.sql.connector.catalog.CatalogV2Util;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.NamespaceChange;
import org.apache.spark.sql.connector.catalog.SupportsNamespaces;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCatalog;
import org.apache.spark.sql.connector.catalog.TableChange;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A Spark SQL catalog of one Topicbase server: its topics and tables as tables of the
 * namespace {@code main}.
 *
 * <p>Spark refuses Python classes as catalogs, so the catalog is this JVM class; everything
 * it does goes through the Python {@code topicbase} data source (spark_sql_ext), which talks
 * to the server's Arrow Flight door: scans and writes use Spark's {@code PythonDataSourceV2}
 * around the source (an internal class: pyspark's minor version is pinned), and the
 * catalog's own requests (list relations, CREATE/DROP) are one-task reads of the source with
 * the options {@code relations} or {@code execute}. Settings: {@code
 * spark.sql.catalog.<name>.url|user|password} (and {@code tlsRootCerts}, {@code tlsClientCert},
 * {@code tlsClientKey}, {@code splitRows}).
 *
 * <p>With {@code spark.sql.catalog.<name>.wire} ({@code host:port} of {@code topicbase
 * serve}'s PostgreSQL wire; {@code sslmode} {@code require}/{@code verify-full} and {@code
 * sslrootcert} for TLS) a topic is resolved over that wire in the JVM (one query, no Python)
 * and its batch scans are read there as Arrow ({@link WireScan}) and its writes (batch and
 * streaming) staged and committed there ({@link WireWrite}); tables and streaming reads
 * still go through the Python source.
 *
 * <p>{@code CREATE TABLE t (...)} makes a DuckDB table; {@code CREATE TABLE t (...)
 * TBLPROPERTIES ('kind' = 'topic', 'partitions' = '4')} makes a topic (its columns are the
 * topic relation's, whatever the statement lists).
 */
public class TopicbaseCatalog implements TableCatalog, SupportsNamespaces {
    private static final String NAMESPACE = "main";
    static final String SOURCE = "topicbase";
    /** Marks a missing relation in the source's error (spark_sql_ext.datasource.describe). */
    static final String NO_SUCH_RELATION = "TOPICBASE_NO_SUCH_RELATION";
    static final String KIND_METADATA = "topicbase.kind";
    private static final Pattern PLAIN_NAME = Pattern.compile("[A-Za-z_][A-Za-z0-9_]*");
    private static final String[] CONNECTION_KEYS = {"url", "user", "password", "tlsRootCerts",
        "tlsClientCert", "tlsClientKey", "splitRows", "wire", "sslmode", "sslrootcert"};
    /** A topic's columns (spark_sql_ext.options.TOPIC_DDL, as the Python source gives them). */
    static final StructType TOPIC_SCHEMA = StructType.fromDDL("`partition` INT, `offset` BIGINT, "
        + "seq_no BIGINT, producer_id STRING, message_group_id STRING, created_at TIMESTAMP, "
        + "written_at TIMESTAMP, codec STRING, data BINARY, metadata MAP<STRING, BINARY>");

    private String catalogName;
    private final Map<String, String> connection = new HashMap<>();

    @Override
    public void initialize(String name, CaseInsensitiveStringMap options) {
        this.catalogName = name;
        for (String key : CONNECTION_KEYS) {
            if (options.containsKey(key)) {
                connection.put(key, options.get(key));
            }
        }
        if (!connection.containsKey("url")) {
            throw new IllegalArgumentException("spark.sql.catalog." + name
                + ".url (topicbase://host:port of the Flight door) is not set");
        }
    }

    @Override
    public String name() {
        return catalogName;
    }

    @Override
    public String[] defaultNamespace() {
        return new String[] {NAMESPACE};
    }

    // -- requests through the Python source ----------------------------------------------
    private List<Row> request(String key, String value) {
        DataFrameReader reader = SparkSession.active().read().format(SOURCE);
        for (Map.Entry<String, String> entry : connection.entrySet()) {
            reader = reader.option(entry.getKey(), entry.getValue());
        }
        return reader.option(key, value).load().collectAsList();
    }

    /** Relation name to kind ("topic" or "table"). */
    private Map<String, String> relations() {
        Map<String, String> found = new HashMap<>();
        for (Row row : request("relations", "true")) {
            found.putIfAbsent(row.getString(1), row.getString(0));
        }
        return found;
    }

    private static boolean inNamespace(String[] namespace) {
        return namespace.length == 0
            || (namespace.length == 1 && namespace[0].equalsIgnoreCase(NAMESPACE));
    }

    private static String quoted(String name, char quote) {
        if (PLAIN_NAME.matcher(name).matches()) {
            return name;
        }
        if (name.indexOf(quote) >= 0) {
            throw new IllegalArgumentException("name " + name + " may not contain " + quote);
        }
        return quote + name + quote;
    }

    // -- tables ---------------------------------------------------------------------------
    @Override
    public Identifier[] listTables(String[] namespace) throws NoSuchNamespaceException {
        if (!inNamespace(namespace)) {
            throw new NoSuchNamespaceException(namespace);
        }
        List<Identifier> identifiers = new ArrayList<>();
        for (String name : relations().keySet()) {
            identifiers.add(Identifier.of(new String[] {NAMESPACE}, name));
        }
        identifiers.sort((a, b) -> a.name().compareTo(b.name()));
        return identifiers.toArray(new Identifier[0]);
    }

    @Override
    public Table loadTable(Identifier ident) throws NoSuchTableException {
        if (!inNamespace(ident.namespace())) {
            throw new NoSuchTableException(ident);
        }
        if (connection.containsKey("wire") && isTopic(ident.name())) {
            Map<String, String> properties = new HashMap<>(connection);
            properties.put("topic", ident.name());
            PythonDataSourceV2 provider = new PythonDataSourceV2();
            provider.setShortName(SOURCE);
            return new TopicbaseTable(provider.getTable(TOPIC_SCHEMA, new Transform[0],
                properties), properties);
        }
        // One call of the source's schema() with option "describe" (no Spark job): the
        // relation's columns, its kind ("topic" or "table") in the first one's metadata.
        PythonDataSourceV2 provider = new PythonDataSourceV2();
        provider.setShortName(SOURCE);
        Map<String, String> probe = new HashMap<>(connection);
        probe.put("describe", ident.name());
        StructType described;
        try {
            described = provider.inferSchema(new CaseInsensitiveStringMap(probe));
        } catch (Exception e) { // Spark's AnalysisException is checked in Java's eyes
            if (String.valueOf(e.getMessage()).contains(NO_SUCH_RELATION)) {
                throw new NoSuchTableException(ident);
            }
            throw TopicbaseCatalog.<RuntimeException>rethrow(e);
        }
        StructField[] fields = described.fields().clone();
        String kind = fields[0].metadata().getString(KIND_METADATA);
        fields[0] = new StructField(fields[0].name(), fields[0].dataType(), fields[0].nullable(),
            Metadata.empty());
        Map<String, String> properties = new HashMap<>(connection);
        properties.put(kind, ident.name());
        return new TopicbaseTable(provider.getTable(new StructType(fields), new Transform[0],
            properties), properties);
    }

    /** Whether {@code name} is a topic, asked over the wire (sys.topics). */
    private boolean isTopic(String name) {
        try {
            return PgWireClient.run(connection.get("wire"), connection,
                client -> !client.query("SELECT name FROM sys.topics WHERE name = "
                    + WireScan.quoteLiteral(name)).isEmpty());
        } catch (java.io.IOException e) {
            throw new java.io.UncheckedIOException("cannot reach " + connection.get("wire")
                + ": " + e.getMessage(), e);
        }
    }

    /** Throws {@code e} as it is (checked or not); declared to return for {@code throw}. */
    @SuppressWarnings("unchecked")
    private static <E extends Exception> E rethrow(Exception e) throws E {
        throw (E) e;
    }

    @Override
    public Table createTable(Identifier ident, Column[] columns, Transform[] partitions,
            Map<String, String> properties)
            throws TableAlreadyExistsException, NoSuchNamespaceException {
        if (!inNamespace(ident.namespace())) {
            throw new NoSuchNamespaceException(ident.namespace());
        }
        if (relations().containsKey(ident.name())) {
            throw new TableAlreadyExistsException(ident);
        }
        String kind = properties.getOrDefault("kind", "table").toLowerCase(Locale.ROOT);
        if (kind.equals("topic")) {
            String partitionCount = properties.getOrDefault("partitions", "1");
            Integer.parseInt(partitionCount); // a number, or NumberFormatException
            request("execute", "CREATE TOPIC " + quoted(ident.name(), '`')
                + " WITH (min_active_partitions = " + partitionCount + ")");
        } else {
            StructType schema = CatalogV2Util.v2ColumnsToStructType(columns);
            List<String> definitions = new ArrayList<>();
            for (StructField field : schema.fields()) {
                definitions.add(quoted(field.name(), '"') + " " + duckdbType(field));
            }
            request("execute", "CREATE TABLE " + quoted(ident.name(), '"') + " ("
                + String.join(", ", definitions) + ")");
        }
        try {
            return loadTable(ident);
        } catch (NoSuchTableException e) {
            throw new IllegalStateException("created " + ident + " but cannot load it", e);
        }
    }

    /** The DuckDB type of a Spark column (Spark's SQL type names, mapped where they differ). */
    private static String duckdbType(StructField field) {
        String type = field.dataType().sql();
        switch (type) {
            case "STRING": return "VARCHAR";
            case "BINARY": return "BLOB";
            case "TIMESTAMP": return "TIMESTAMPTZ";
            case "TIMESTAMP_NTZ": return "TIMESTAMP";
            case "FLOAT": return "REAL";
            default: return type;
        }
    }

    @Override
    public Table alterTable(Identifier ident, TableChange... changes) {
        throw new UnsupportedOperationException("ALTER TABLE is not supported by the "
            + "Topicbase catalog: alter tables and topics over SQL (topicbase serve)");
    }

    @Override
    public boolean dropTable(Identifier ident) {
        String kind = inNamespace(ident.namespace()) ? relations().get(ident.name()) : null;
        if (kind == null) {
            return false;
        }
        String statement = kind.equals("topic")
            ? "DROP TOPIC " + quoted(ident.name(), '`')
            : "DROP TABLE " + quoted(ident.name(), '"');
        request("execute", statement);
        return true;
    }

    @Override
    public void renameTable(Identifier oldIdent, Identifier newIdent) {
        throw new UnsupportedOperationException("RENAME is not supported by the Topicbase catalog");
    }

    // -- namespaces: one, main ------------------------------------------------------------
    @Override
    public String[][] listNamespaces() {
        return new String[][] {{NAMESPACE}};
    }

    @Override
    public String[][] listNamespaces(String[] namespace) throws NoSuchNamespaceException {
        if (!inNamespace(namespace) || namespace.length == 0) {
            if (namespace.length == 0) {
                return listNamespaces();
            }
            throw new NoSuchNamespaceException(namespace);
        }
        return new String[0][];
    }

    @Override
    public Map<String, String> loadNamespaceMetadata(String[] namespace)
            throws NoSuchNamespaceException {
        if (!inNamespace(namespace) || namespace.length == 0) {
            throw new NoSuchNamespaceException(namespace);
        }
        return new HashMap<>();
    }

    @Override
    public void createNamespace(String[] namespace, Map<String, String> metadata) {
        throw new UnsupportedOperationException("the Topicbase catalog has one namespace, main");
    }

    @Override
    public void alterNamespace(String[] namespace, NamespaceChange... changes) {
        throw new UnsupportedOperationException("the Topicbase catalog has one namespace, main");
    }

    @Override
    public boolean dropNamespace(String[] namespace, boolean cascade) {
        throw new UnsupportedOperationException("the Topicbase catalog has one namespace, main");
    }
}
