package io.topicbase.spark;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.ByteArrayOutputStream;
import java.io.Closeable;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.channels.ReadableByteChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import javax.crypto.Mac;
import javax.crypto.SecretKeyFactory;
import javax.crypto.spec.PBEKeySpec;
import javax.crypto.spec.SecretKeySpec;
import javax.net.ssl.SNIHostName;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;
import javax.net.ssl.TrustManagerFactory;

/**
 * A small PostgreSQL-wire (protocol 3.0) client of {@code topicbase serve}, JDK only: the
 * startup, password authentication (SCRAM-SHA-256 of RFC 5802/7677 with the server's
 * signature verified, md5 and cleartext when the server asks for them), the simple query
 * protocol with text results, {@code COPY ... TO STDOUT} read as one {@link InputStream}
 * over the CopyData payloads, and {@code COPY ... FROM STDIN} written through an {@link
 * OutputStream} cut into CopyData messages ({@link #copyIn}). TLS: with {@code sslmode} {@code require} or {@code
 * verify-full} the client sends SSLRequest and wraps the socket, trusting the certificates
 * of the PEM file {@code sslrootcert} (the JDK's trust store without one) and checking the
 * host name (verify-full and require alike: a wrong host is refused).
 *
 * <p>Invariants: one statement at a time; after {@link #query} or the end of a COPY stream
 * the connection is at ReadyForQuery again. A server error becomes a {@link
 * PgWireException} carrying its SQLSTATE; after an error inside a COPY the connection is
 * closed (the stream's reader is in an unknown place).
 *
 * <p>Reuse: {@link #borrow} hands out an idle connection of the same address, user,
 * password and TLS settings when this JVM has one (a login costs the server ~4 ms of CPU
 * and the client a PBKDF2; a scan made 6 per query), {@link #release} keeps a connection
 * that is at ReadyForQuery (at most {@code IDLE_MAX} per key, for {@code IDLE_MS}) and
 * closes any other. A reused connection that the server has closed meanwhile fails with an
 * I/O error, not a server error: {@link #run} then retries once on a new connection.
 */
final class PgWireClient implements Closeable {
    static final int CONNECT_TIMEOUT_MS = 30_000;
    private static final int PROTOCOL_3 = 196608;
    private static final int SSL_REQUEST = 80877103;
    private static final int MESSAGE_MAX = 1 << 30;

    /** An ErrorResponse of the server (or a failure of the exchange, SQLSTATE 08xxx). */
    static final class PgWireException extends IOException {
        final String sqlstate;

        PgWireException(String sqlstate, String message) {
            super(message + " (SQLSTATE " + sqlstate + ")");
            this.sqlstate = sqlstate;
        }
    }

    private final Socket socket;
    /** The plaintext socket's channel (null with TLS): COPY data is read from it directly. */
    private final SocketChannel channel;
    private final WireInput wire;
    private final DataInputStream in;
    private final OutputStream out;
    private boolean broken;
    /** At ReadyForQuery: nothing of a statement is left to read. */
    private boolean ready;
    // ParameterStatus reports (name -> value) since the connection started
    private final Map<String, String> parameters = new HashMap<>();
    private String poolKey;
    private boolean reused;
    private long idleSince;

    static final int IDLE_MAX = 4;
    static final long IDLE_MS = 30_000;
    private static final Map<String, ArrayDeque<PgWireClient>> IDLE = new HashMap<>();
    private static Thread reaper;

    /** Closes the idle connections older than IDLE_MS; runs while any are kept. */
    private static void reap() {
        while (true) {
            try {
                Thread.sleep(IDLE_MS / 2);
            } catch (InterruptedException e) {
                return;
            }
            List<PgWireClient> stale = new ArrayList<>();
            boolean done;
            synchronized (IDLE) {
                long now = System.currentTimeMillis();
                for (ArrayDeque<PgWireClient> idle : IDLE.values()) {
                    idle.removeIf(c -> now - c.idleSince >= IDLE_MS && stale.add(c));
                }
                IDLE.values().removeIf(ArrayDeque::isEmpty);
                done = IDLE.isEmpty();
                if (done) {
                    reaper = null;
                }
            }
            for (PgWireClient c : stale) {
                try {
                    c.close();
                } catch (IOException e) {
                    // closing anyway
                }
            }
            if (done) {
                return;
            }
        }
    }

    /** A statement on a connection (checked exceptions pass through). */
    interface Work<T> {
        T apply(PgWireClient client) throws IOException;
    }

    /**
     * {@code work} on a borrowed connection, released after it; a reused connection that
     * fails with an I/O error that is not the server's (it was closed while idle) is
     * replaced by a new one and {@code work} runs again, once.
     */
    static <T> T run(String address, Map<String, String> options, Work<T> work)
            throws IOException {
        PgWireClient client = borrow(address, options);
        try {
            T result;
            try {
                result = work.apply(client);
            } catch (IOException e) {
                if (!client.reused || e instanceof PgWireException) {
                    throw e;
                }
                client.close();
                client = fresh(address, options);
                result = work.apply(client);
            }
            client.release();
            return result;
        } catch (IOException | RuntimeException e) {
            client.close();
            throw e;
        }
    }

    private static String poolKey(String address, Map<String, String> options)
            throws IOException {
        StringBuilder key = new StringBuilder(address);
        for (String name : new String[] {"user", "database", "sslmode", "sslrootcert"}) {
            key.append('\0').append(options.getOrDefault(name, ""));
        }
        try { // the password only as a digest
            byte[] digest = MessageDigest.getInstance("SHA-256").digest(
                options.getOrDefault("password", "").getBytes(StandardCharsets.UTF_8));
            return key.append('\0').append(hex(digest)).toString();
        } catch (GeneralSecurityException e) {
            throw new IOException(e);
        }
    }

    /** An idle connection of the same settings if there is one, else a new one. */
    static PgWireClient borrow(String address, Map<String, String> options) throws IOException {
        String key = poolKey(address, options);
        long now = System.currentTimeMillis();
        List<PgWireClient> stale = new ArrayList<>();
        PgWireClient found = null;
        synchronized (IDLE) {
            ArrayDeque<PgWireClient> idle = IDLE.get(key);
            while (found == null && idle != null && !idle.isEmpty()) {
                PgWireClient candidate = idle.pollLast();
                if (now - candidate.idleSince < IDLE_MS) {
                    found = candidate;
                } else {
                    stale.add(candidate);
                }
            }
        }
        for (PgWireClient old : stale) {
            old.close();
        }
        if (found != null) {
            found.reused = true;
            return found;
        }
        return fresh(address, options);
    }

    /** Whether this connection came from the idle ones (it may have been closed since). */
    boolean wasReused() {
        return reused;
    }

    /** A new connection that {@link #release} may keep. */
    static PgWireClient borrowNew(String address, Map<String, String> options)
            throws IOException {
        return fresh(address, options);
    }

    private static PgWireClient fresh(String address, Map<String, String> options)
            throws IOException {
        PgWireClient client = connect(address, options);
        client.poolKey = poolKey(address, options);
        return client;
    }

    /** Keeps this connection for {@link #borrow} if it is at ReadyForQuery, else closes it. */
    void release() {
        if (poolKey != null && ready && !broken && !socket.isClosed()) {
            synchronized (IDLE) {
                ArrayDeque<PgWireClient> idle = IDLE.computeIfAbsent(poolKey,
                    k -> new ArrayDeque<>());
                if (idle.size() < IDLE_MAX) {
                    idleSince = System.currentTimeMillis();
                    reused = false;
                    idle.addLast(this);
                    if (reaper == null) {
                        reaper = new Thread(PgWireClient::reap, "topicbase-pgwire-idle");
                        reaper.setDaemon(true);
                        reaper.start();
                    }
                    return;
                }
            }
        }
        try {
            close();
        } catch (IOException e) {
            // closing anyway
        }
    }

    private PgWireClient(Socket socket, SocketChannel channel) throws IOException {
        this.socket = socket;
        this.channel = channel;
        this.wire = new WireInput(socket.getInputStream());
        this.in = new DataInputStream(wire);
        this.out = new BufferedOutputStream(socket.getOutputStream(), 1 << 14);
    }

    /**
     * A connection to {@code host:port} as {@code user}, authenticated and ready for a query.
     * {@code sslmode}: null or "disable" for plaintext, "require"/"verify-full" for TLS.
     */
    static PgWireClient connect(String host, int port, String user, String password,
            String database, String sslmode, String sslrootcert) throws IOException {
        SocketChannel channel = SocketChannel.open(); // blocking; its socket is the stream API
        Socket plain = channel.socket();
        Socket socket = plain;
        try {
            plain.setTcpNoDelay(true);
            plain.connect(new InetSocketAddress(host, port), CONNECT_TIMEOUT_MS);
            if (sslmode != null && !sslmode.equals("disable")) {
                if (!sslmode.equals("require") && !sslmode.equals("verify-full")) {
                    throw new IllegalArgumentException("sslmode " + sslmode
                        + " is not supported (disable, require or verify-full)");
                }
                socket = startTls(plain, host, port, sslrootcert);
                channel = null; // the bytes must pass the TLS socket
            }
            PgWireClient client = new PgWireClient(socket, channel);
            client.startup(user, password == null ? "" : password,
                database == null ? "topicbase" : database);
            return client;
        } catch (IOException | RuntimeException e) {
            socket.close();
            throw e;
        }
    }

    /** "host:port" (a bare host means port 5432). */
    static PgWireClient connect(String address, Map<String, String> options) throws IOException {
        int colon = address.lastIndexOf(':');
        String host = colon < 0 ? address : address.substring(0, colon);
        int port;
        try {
            port = colon < 0 ? 5432 : Integer.parseInt(address.substring(colon + 1));
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("wire address " + address + " is not host:port");
        }
        if (options.get("user") == null) {
            throw new IllegalArgumentException("no user for the wire at " + address);
        }
        return connect(host, port, options.get("user"), options.get("password"),
            options.get("database"), options.get("sslmode"), options.get("sslrootcert"));
    }

    // -- TLS --------------------------------------------------------------------------------
    private static Socket startTls(Socket plain, String host, int port, String rootCert)
            throws IOException {
        DataInputStream in = new DataInputStream(plain.getInputStream());
        OutputStream out = plain.getOutputStream();
        byte[] request = new byte[8];
        putInt(request, 0, 8);
        putInt(request, 4, SSL_REQUEST);
        out.write(request);
        out.flush();
        int answer = in.read();
        if (answer != 'S') {
            throw new PgWireException("08004", "the server at " + host + ":" + port
                + " does not offer TLS (sslmode asks for it)");
        }
        try {
            SSLContext context = SSLContext.getInstance("TLS");
            TrustManagerFactory trust =
                TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
            trust.init(rootCert == null ? null : trustStore(rootCert));
            context.init(null, trust.getTrustManagers(), new SecureRandom());
            SSLSocket tls = (SSLSocket) context.getSocketFactory()
                .createSocket(plain, host, port, true);
            SSLParameters parameters = tls.getSSLParameters();
            parameters.setEndpointIdentificationAlgorithm("HTTPS"); // host name checked
            if (!host.isEmpty() && !Character.isDigit(host.charAt(0)) && host.indexOf(':') < 0) {
                parameters.setServerNames(List.of(new SNIHostName(host)));
            }
            parameters.setProtocols(new String[] {"TLSv1.3", "TLSv1.2"});
            tls.setSSLParameters(parameters);
            tls.startHandshake();
            return tls;
        } catch (GeneralSecurityException e) {
            throw new IOException("cannot set up TLS with " + rootCert + ": " + e, e);
        }
    }

    private static KeyStore trustStore(String pemFile) throws IOException, GeneralSecurityException {
        KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
        store.load(null, null);
        try (FileInputStream file = new FileInputStream(pemFile)) {
            int n = 0;
            for (Certificate certificate : CertificateFactory.getInstance("X.509")
                    .generateCertificates(file)) {
                store.setCertificateEntry("ca" + n++, certificate);
            }
            if (n == 0) {
                throw new IOException("no certificate in " + pemFile);
            }
        }
        return store;
    }

    // -- messages -----------------------------------------------------------------------------
    private static void putInt(byte[] buffer, int at, int value) {
        buffer[at] = (byte) (value >>> 24);
        buffer[at + 1] = (byte) (value >>> 16);
        buffer[at + 2] = (byte) (value >>> 8);
        buffer[at + 3] = (byte) value;
    }

    private void send(char type, byte[] body) throws IOException {
        byte[] header = new byte[5];
        header[0] = (byte) type;
        putInt(header, 1, body.length + 4);
        out.write(header);
        out.write(body);
    }

    private static byte[] cstring(String s) {
        byte[] bytes = s.getBytes(StandardCharsets.UTF_8);
        return Arrays.copyOf(bytes, bytes.length + 1);
    }

    /** One message from the server: its type and body. */
    private static final class Message {
        final char type;
        final byte[] body;
        int at;

        Message(char type, byte[] body) {
            this.type = type;
            this.body = body;
        }

        int int32() {
            int v = ((body[at] & 0xff) << 24) | ((body[at + 1] & 0xff) << 16)
                | ((body[at + 2] & 0xff) << 8) | (body[at + 3] & 0xff);
            at += 4;
            return v;
        }

        int int16() {
            int v = ((body[at] & 0xff) << 8) | (body[at + 1] & 0xff);
            at += 2;
            return v;
        }

        String cstring() {
            int end = at;
            while (body[end] != 0) {
                end++;
            }
            String s = new String(body, at, end - at, StandardCharsets.UTF_8);
            at = end + 1;
            return s;
        }

        String rest() {
            return new String(body, at, body.length - at, StandardCharsets.UTF_8);
        }
    }

    private Message receive() throws IOException {
        char type;
        int length;
        try {
            type = (char) in.readUnsignedByte();
            length = in.readInt();
        } catch (EOFException e) {
            broken = true;
            throw new EOFException("the server closed the connection");
        }
        if (length < 4 || length > MESSAGE_MAX) {
            broken = true;
            throw new PgWireException("08P01", "bad message length " + length + " from server");
        }
        byte[] body = new byte[length - 4];
        in.readFully(body);
        return new Message(type, body);
    }

    /** The next message that is not a notice or a parameter status (kept: {@link
     * #serverParameter}). */
    private Message receiveRelevant() throws IOException {
        while (true) {
            Message message = receive();
            if (message.type == 'S') {
                try {
                    String name = message.cstring();
                    parameters.put(name, message.cstring());
                } catch (ArrayIndexOutOfBoundsException e) {
                    broken = true;
                    throw new PgWireException("08P01", "malformed ParameterStatus from server");
                }
            } else if (message.type != 'N' && message.type != 'A') {
                return message;
            }
        }
    }

    /** The value the server last reported for {@code name} (ParameterStatus), or null. */
    String serverParameter(String name) {
        return parameters.get(name);
    }

    private static PgWireException error(Message message) {
        Map<Character, String> fields = new HashMap<>();
        while (message.at < message.body.length && message.body[message.at] != 0) {
            char code = (char) message.body[message.at++];
            fields.put(code, message.cstring());
        }
        String detail = fields.containsKey('D') ? " (" + fields.get('D') + ")" : "";
        return new PgWireException(fields.getOrDefault('C', "XX000"),
            fields.getOrDefault('M', "error") + detail);
    }

    /** Reads up to ReadyForQuery, then throws {@code failure}. */
    private PgWireException afterError(PgWireException failure) throws IOException {
        while (receive().type != 'Z') {
            // skip to the end of the statement
        }
        ready = true;
        return failure;
    }

    // -- startup and authentication --------------------------------------------------------
    private void startup(String user, String password, String database) throws IOException {
        ByteArrayOutputStream body = new ByteArrayOutputStream();
        byte[] version = new byte[4];
        putInt(version, 0, PROTOCOL_3);
        body.write(version);
        for (String s : new String[] {"user", user, "database", database,
                "application_name", "topicbase-spark", "client_encoding", "UTF8"}) {
            body.write(cstring(s));
        }
        body.write(0);
        byte[] startup = body.toByteArray();
        byte[] length = new byte[4];
        putInt(length, 0, startup.length + 4);
        out.write(length);
        out.write(startup);
        out.flush();
        Scram scram = null;
        while (true) {
            Message message = receiveRelevant();
            if (message.type == 'E') {
                throw error(message);
            }
            if (message.type == 'Z') {
                ready = true;
                return;
            }
            if (message.type == 'K') {
                continue;
            }
            if (message.type != 'R') {
                throw new PgWireException("08P01", "unexpected message " + message.type
                    + " during startup");
            }
            int code = message.int32();
            switch (code) {
                case 0: // AuthenticationOk
                    break;
                case 3: // cleartext
                    send('p', cstring(password));
                    out.flush();
                    break;
                case 5: { // md5
                    byte[] salt = Arrays.copyOfRange(message.body, 4, 8);
                    send('p', cstring(md5Response(user, password, salt)));
                    out.flush();
                    break;
                }
                case 10: { // SASL: the mechanisms offered
                    List<String> mechanisms = new ArrayList<>();
                    for (String m = message.cstring(); !m.isEmpty(); m = message.cstring()) {
                        mechanisms.add(m);
                    }
                    if (!mechanisms.contains(Scram.MECHANISM)) {
                        throw new PgWireException("28000", "the server offers " + mechanisms
                            + ", not " + Scram.MECHANISM);
                    }
                    scram = new Scram(password);
                    byte[] first = scram.clientFirst().getBytes(StandardCharsets.UTF_8);
                    ByteArrayOutputStream initial = new ByteArrayOutputStream();
                    initial.write(cstring(Scram.MECHANISM));
                    byte[] n = new byte[4];
                    putInt(n, 0, first.length);
                    initial.write(n);
                    initial.write(first);
                    send('p', initial.toByteArray());
                    out.flush();
                    break;
                }
                case 11: // SASLContinue
                    if (scram == null) {
                        throw new PgWireException("08P01", "SASLContinue before SASL");
                    }
                    send('p', scram.clientFinal(message.rest()).getBytes(StandardCharsets.UTF_8));
                    out.flush();
                    break;
                case 12: // SASLFinal
                    if (scram == null) {
                        throw new PgWireException("08P01", "SASLFinal before SASL");
                    }
                    scram.verifyServerFinal(message.rest());
                    break;
                default:
                    throw new PgWireException("28000", "authentication method " + code
                        + " is not supported");
            }
        }
    }

    private static String md5Response(String user, String password, byte[] salt)
            throws IOException {
        try {
            MessageDigest md5 = MessageDigest.getInstance("MD5");
            String inner = hex(md5.digest((password + user).getBytes(StandardCharsets.UTF_8)));
            md5.update(inner.getBytes(StandardCharsets.US_ASCII));
            md5.update(salt);
            return "md5" + hex(md5.digest());
        } catch (GeneralSecurityException e) {
            throw new IOException(e);
        }
    }

    private static String hex(byte[] bytes) {
        StringBuilder s = new StringBuilder();
        for (byte b : bytes) {
            s.append(String.format("%02x", b & 0xff));
        }
        return s.toString();
    }

    /** The client side of SCRAM-SHA-256 without channel binding (gs2 header "n,,"). */
    static final class Scram {
        static final String MECHANISM = "SCRAM-SHA-256";
        private final String password;
        private final String clientNonce;
        private String clientFirstBare;
        private byte[] serverSignature;

        Scram(String password) {
            this.password = password;
            byte[] random = new byte[18];
            new SecureRandom().nextBytes(random);
            this.clientNonce = Base64.getEncoder().encodeToString(random);
        }

        String clientFirst() {
            clientFirstBare = "n=,r=" + clientNonce; // PostgreSQL takes the startup's user
            return "n,," + clientFirstBare;
        }

        String clientFinal(String serverFirst) throws IOException {
            String nonce = null;
            String salt = null;
            int iterations = -1;
            for (String part : serverFirst.split(",")) {
                if (part.startsWith("r=")) {
                    nonce = part.substring(2);
                } else if (part.startsWith("s=")) {
                    salt = part.substring(2);
                } else if (part.startsWith("i=")) {
                    iterations = Integer.parseInt(part.substring(2));
                }
            }
            if (nonce == null || salt == null || iterations < 1 || !nonce.startsWith(clientNonce)
                    || nonce.length() == clientNonce.length()) {
                throw new PgWireException("08P01", "malformed SCRAM server-first message");
            }
            String withoutProof = "c=biws,r=" + nonce;
            String authMessage = clientFirstBare + "," + serverFirst + "," + withoutProof;
            try {
                SecretKeyFactory pbkdf2 = SecretKeyFactory.getInstance("PBKDF2WithHmacSHA256");
                byte[] salted = pbkdf2.generateSecret(new PBEKeySpec(password.toCharArray(),
                    Base64.getDecoder().decode(salt), iterations, 256)).getEncoded();
                byte[] clientKey = hmac(salted, "Client Key".getBytes(StandardCharsets.UTF_8));
                byte[] storedKey = MessageDigest.getInstance("SHA-256").digest(clientKey);
                byte[] signature = hmac(storedKey, authMessage.getBytes(StandardCharsets.UTF_8));
                byte[] proof = new byte[clientKey.length];
                for (int i = 0; i < proof.length; i++) {
                    proof[i] = (byte) (clientKey[i] ^ signature[i]);
                }
                byte[] serverKey = hmac(salted, "Server Key".getBytes(StandardCharsets.UTF_8));
                serverSignature = hmac(serverKey, authMessage.getBytes(StandardCharsets.UTF_8));
                return withoutProof + ",p=" + Base64.getEncoder().encodeToString(proof);
            } catch (GeneralSecurityException | IllegalArgumentException e) {
                throw new PgWireException("08P01", "SCRAM: " + e);
            }
        }

        void verifyServerFinal(String serverFinal) throws IOException {
            if (serverFinal.startsWith("e=")) {
                throw new PgWireException("28P01", "SCRAM: " + serverFinal.substring(2));
            }
            byte[] given;
            try {
                given = serverFinal.startsWith("v=")
                    ? Base64.getDecoder().decode(serverFinal.substring(2).split(",")[0])
                    : new byte[0];
            } catch (IllegalArgumentException e) {
                given = new byte[0];
            }
            if (serverSignature == null || !MessageDigest.isEqual(given, serverSignature)) {
                throw new PgWireException("28000", "SCRAM: the server's signature is wrong "
                    + "(it does not know the password)");
            }
        }

        private static byte[] hmac(byte[] key, byte[] data) throws GeneralSecurityException {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(key, "HmacSHA256"));
            return mac.doFinal(data);
        }
    }

    // -- simple queries -------------------------------------------------------------------------
    /** The rows of {@code sql} (the last result's), every value as text (null for NULL). */
    List<String[]> query(String sql) throws IOException {
        ready = false;
        send('Q', cstring(sql));
        out.flush();
        List<String[]> rows = new ArrayList<>();
        PgWireException failure = null;
        while (true) {
            Message message = receiveRelevant();
            switch (message.type) {
                case 'T':
                    rows.clear();
                    break;
                case 'D': {
                    int n = message.int16();
                    String[] row = new String[n];
                    for (int i = 0; i < n; i++) {
                        int length = message.int32();
                        if (length >= 0) {
                            row[i] = new String(message.body, message.at, length,
                                StandardCharsets.UTF_8);
                            message.at += length;
                        }
                    }
                    rows.add(row);
                    break;
                }
                case 'E':
                    failure = error(message);
                    break;
                case 'H': // a COPY TO in a simple query: not what query() is for
                    broken = true;
                    throw new PgWireException("08P01", "query() got a COPY result");
                case 'Z':
                    ready = true;
                    if (failure != null) {
                        throw failure;
                    }
                    return rows;
                default: // C, I and the like
                    break;
            }
        }
    }

    // -- COPY TO STDOUT ---------------------------------------------------------------------------
    /**
     * Runs {@code copy} (a {@code COPY ... TO STDOUT}) and returns its data as one stream: the
     * CopyData payloads back to back, end of stream after CopyDone and ReadyForQuery. An error
     * before the data is thrown here; one during it is thrown by the stream's read.
     */
    CopyStream copyOut(String copy) throws IOException {
        ready = false;
        send('Q', cstring(copy));
        out.flush();
        while (true) {
            Message message = receiveRelevant();
            if (message.type == 'E') {
                throw afterError(error(message));
            }
            if (message.type == 'H') {
                return new CopyStream();
            }
            if (message.type == 'Z') {
                ready = true;
                throw new PgWireException("08P01", "no COPY data for " + copy);
            }
        }
    }

    /**
     * The COPY's data: the CopyData payloads back to back, as an {@link InputStream} and as a
     * {@link ReadableByteChannel}. On a plaintext connection the channel reads a payload from
     * the socket straight into the caller's direct buffer (an Arrow buffer: the only copy is
     * the kernel's), and each CopyData header is read alone (5 bytes) so that the buffered
     * stream does not read ahead into the next payload; what it holds is copied out first.
     */
    final class CopyStream extends InputStream implements ReadableByteChannel {
        private int left; // bytes of the current CopyData still unread
        private boolean done;
        private byte[] scratch; // the heap path's transfer buffer (TLS, heap buffers)

        /** Moves to the next CopyData with data; false at the end of the COPY. */
        private boolean advance() throws IOException {
            while (left == 0) {
                if (done) {
                    return false;
                }
                if (channel != null) {
                    wire.fillAtMost(5); // the header alone, not the payload after it
                }
                char type = (char) in.readUnsignedByte();
                int length = in.readInt();
                if (length < 4 || length > MESSAGE_MAX) { // a clear error, not a negative read
                    done = true;
                    broken = true;
                    throw new PgWireException("08P01", "bad message length " + length
                            + " from server in a COPY");
                }
                if (type == 'd') {
                    left = length - 4;
                    continue;
                }
                byte[] body = new byte[length - 4];
                in.readFully(body);
                Message message = new Message(type, body);
                if (type == 'E') {
                    done = true;
                    broken = true;
                    throw error(message);
                }
                if (type == 'Z') {
                    done = true;
                    ready = true;
                }
                // c (CopyDone), C (CommandComplete), N, S: read on
            }
            return true;
        }

        @Override
        public int read() throws IOException {
            if (!advance()) {
                return -1;
            }
            left--;
            return in.readUnsignedByte();
        }

        @Override
        public int read(byte[] buffer, int offset, int length) throws IOException {
            if (length == 0) {
                return 0;
            }
            if (!advance()) {
                return -1;
            }
            int n = in.read(buffer, offset, Math.min(length, left));
            return took(n);
        }

        @Override
        public int read(ByteBuffer target) throws IOException {
            if (!target.hasRemaining()) {
                return 0;
            }
            if (!advance()) {
                return -1;
            }
            int want = Math.min(target.remaining(), left);
            int n;
            if (wire.buffered() > 0) {
                n = wire.drainTo(target, want);
            } else if (channel != null && target.isDirect()) {
                int limit = target.limit();
                target.limit(target.position() + want);
                try {
                    n = channel.read(target);
                } finally {
                    target.limit(limit);
                }
            } else {
                if (scratch == null) {
                    scratch = new byte[1 << 16];
                }
                n = in.read(scratch, 0, Math.min(want, scratch.length));
                if (n > 0) {
                    target.put(scratch, 0, n);
                }
            }
            return took(n);
        }

        /** Counts {@code n} bytes read of the current CopyData; a closed connection (-1) is an error. */
        private int took(int n) throws IOException {
            if (n < 0) {
                broken = true;
                throw new EOFException("the server closed the connection during COPY");
            }
            left -= n;
            return n;
        }

        @Override
        public boolean isOpen() {
            return true; // the connection's, released with it
        }
    }

    /** The socket's buffered input, whose buffered bytes the COPY stream can take directly. */
    private static final class WireInput extends BufferedInputStream {
        WireInput(InputStream socket) {
            super(socket, 1 << 16);
        }

        /** Bytes read from the socket and not yet consumed. */
        int buffered() {
            return count - pos;
        }

        /** Moves up to {@code max} buffered bytes into {@code target}; how many. */
        int drainTo(ByteBuffer target, int max) {
            int n = Math.min(max, count - pos);
            target.put(buf, pos, n);
            pos += n;
            return n;
        }

        /** With nothing buffered, reads at most {@code max} bytes (blocking for one). */
        void fillAtMost(int max) throws IOException {
            if (count - pos > 0 || markpos >= 0) {
                return;
            }
            pos = 0;
            count = 0;
            int n = in.read(buf, 0, max);
            if (n > 0) {
                count = n;
            }
        }
    }

    // -- COPY FROM STDIN ---------------------------------------------------------------------------
    /**
     * Runs {@code copy} (a {@code COPY ... FROM STDIN}) and returns the stream its data is
     * written to: the bytes go to the server as CopyData messages of at most {@code
     * CopyIn.CHUNK} bytes. {@link CopyIn#finish} ends the COPY (CopyDone) and returns its row
     * count; {@link CopyIn#fail} gives it up (CopyFail). An error before the data (privileges,
     * an unknown target) is thrown here; one during it by {@code finish}.
     */
    CopyIn copyIn(String copy) throws IOException {
        ready = false;
        send('Q', cstring(copy));
        out.flush();
        while (true) {
            Message message = receiveRelevant();
            if (message.type == 'E') {
                throw afterError(error(message));
            }
            if (message.type == 'G') {
                return new CopyIn();
            }
            if (message.type == 'Z') {
                ready = true;
                throw new PgWireException("08P01", "no COPY IN for " + copy);
            }
        }
    }

    /** The data of a COPY FROM STDIN; not thread-safe (one writer). */
    final class CopyIn extends OutputStream {
        static final int CHUNK = 1 << 20;
        private final byte[] buffer = new byte[CHUNK];
        private int used;
        private boolean ended;

        @Override
        public void write(int b) throws IOException {
            if (used == CHUNK) {
                flushChunk();
            }
            buffer[used++] = (byte) b;
        }

        @Override
        public void write(byte[] data, int offset, int length) throws IOException {
            while (length > 0) {
                if (used == 0 && length >= CHUNK) { // a whole chunk straight from the caller
                    sendData(data, offset, CHUNK);
                    offset += CHUNK;
                    length -= CHUNK;
                    continue;
                }
                int n = Math.min(length, CHUNK - used);
                System.arraycopy(data, offset, buffer, used, n);
                used += n;
                offset += n;
                length -= n;
                if (used == CHUNK) {
                    flushChunk();
                }
            }
        }

        private void flushChunk() throws IOException {
            if (used > 0) {
                sendData(buffer, 0, used);
                used = 0;
            }
        }

        private void sendData(byte[] data, int offset, int length) throws IOException {
            if (ended) {
                throw new IOException("the COPY has ended");
            }
            byte[] header = new byte[5];
            header[0] = (byte) 'd';
            putInt(header, 1, length + 4);
            try {
                out.write(header);
                out.write(data, offset, length);
            } catch (IOException e) {
                broken = true;
                throw e;
            }
        }

        /**
         * {@code pieces[i]}'s first {@code lengths[i]} bytes, in order, as ONE CopyData
         * message of their own (what was written before goes first): a receiver gets the
         * unit whole, without joining pieces (a staged frame: {@link WireFrames}, whose
         * header, body metadata, pending data and padding are sent from where they are).
         * Keep it well under the server's message limit ({@code message_bytes_max}, 64 MiB
         * by default).
         */
        void writeMessage(byte[][] pieces, int[] lengths) throws IOException {
            flushChunk();
            if (ended) {
                throw new IOException("the COPY has ended");
            }
            assert pieces.length == lengths.length;
            long length = 4;
            for (int piece : lengths) {
                length += piece;
            }
            if (length > Integer.MAX_VALUE) {
                throw new IOException("a CopyData message must stay under 2 GiB");
            }
            byte[] header = new byte[5];
            header[0] = (byte) 'd';
            putInt(header, 1, (int) length);
            try {
                out.write(header);
                for (int i = 0; i < pieces.length; i++) {
                    out.write(pieces[i], 0, lengths[i]);
                }
            } catch (IOException e) {
                broken = true;
                throw e;
            }
        }

        /** Sends what is left and CopyDone; the COPY's row count (its tag, {@code COPY n}). */
        long finish() throws IOException {
            flushChunk();
            ended = true;
            send('c', new byte[0]);
            out.flush();
            return endOfCopy(null);
        }

        /** Gives the COPY up (CopyFail with {@code reason}); the server's answer is read. */
        void fail(String reason) throws IOException {
            if (ended) {
                return;
            }
            ended = true;
            send('f', cstring(reason));
            out.flush();
            try {
                endOfCopy(reason);
            } catch (PgWireException expected) {
                // 57014, or the error that had ended the COPY already
            }
        }

        private long endOfCopy(String failed) throws IOException {
            long rows = -1;
            PgWireException failure = null;
            while (true) {
                Message message = receiveRelevant();
                switch (message.type) {
                    case 'C': {
                        String tag = message.cstring();
                        if (tag.startsWith("COPY ")) {
                            rows = Long.parseLong(tag.substring(5).trim());
                        }
                        break;
                    }
                    case 'E':
                        failure = error(message);
                        break;
                    case 'Z':
                        ready = true;
                        if (failure != null) {
                            throw failure;
                        }
                        return rows;
                    default:
                        break;
                }
            }
        }

        @Override
        public void close() {
            // finish or fail end the COPY; closing the stream alone does nothing
        }
    }

    @Override
    public void close() throws IOException {
        ready = false;
        try {
            if (!broken && !socket.isClosed()) {
                send('X', new byte[0]);
                out.flush();
            }
        } catch (IOException e) {
            // closing anyway
        } finally {
            socket.close();
        }
    }
}
