// What the PostgreSQL JDBC driver (Spark's JDBC writer) sends, run against Topicbase.
// Usage: java -cp postgresql.jar JdbcStatements.java PORT; prints "ok" when every step passed.
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.Statement;

public class JdbcStatements {
    public static void main(String[] args) throws Exception {
        String url = "jdbc:postgresql://127.0.0.1:" + args[0] + "/topicbase?user=tester&sslmode=disable";
        try (Connection connection = DriverManager.getConnection(url)) {
            // setTransactionIsolation sends SET SESSION CHARACTERISTICS AS TRANSACTION ...
            connection.setTransactionIsolation(Connection.TRANSACTION_READ_COMMITTED);
            try (Statement statement = connection.createStatement()) {
                // executeUpdate fails with "A result was returned when none was expected"
                // if a statement without rows answers with rows.
                statement.executeUpdate("CREATE TABLE jdbc_t (id INTEGER, body jsonb)");
                statement.executeUpdate("ALTER TABLE jdbc_t ADD COLUMN note VARCHAR");
                statement.executeUpdate("CREATE VIEW jdbc_v AS SELECT id FROM jdbc_t");
                statement.executeUpdate("DROP VIEW jdbc_v");
            }
            connection.setAutoCommit(false);
            try (PreparedStatement insert = connection.prepareStatement(
                    "INSERT INTO jdbc_t (id, note) VALUES (?, ?)")) {
                for (int i = 0; i < 3; i++) {
                    insert.setInt(1, i);
                    insert.setString(2, "n" + i);
                    insert.addBatch();
                }
                int[] counts = insert.executeBatch();
                if (counts.length != 3) throw new AssertionError("batch counts " + counts.length);
            }
            connection.commit();
            connection.setAutoCommit(true);
            try (Statement statement = connection.createStatement()) {
                try (ResultSet rows = statement.executeQuery("SELECT count(*) FROM jdbc_t")) {
                    rows.next();
                    if (rows.getLong(1) != 3) throw new AssertionError("count " + rows.getLong(1));
                }
                statement.executeUpdate("TRUNCATE TABLE ONLY jdbc_t");
                try (ResultSet rows = statement.executeQuery("SELECT count(*) FROM jdbc_t")) {
                    rows.next();
                    if (rows.getLong(1) != 0) throw new AssertionError("truncate left rows");
                }
                statement.executeUpdate("DROP TABLE jdbc_t");
            }
        }
        System.out.println("ok");
    }
}
