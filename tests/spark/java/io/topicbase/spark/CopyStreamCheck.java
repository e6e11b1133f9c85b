package io.topicbase.spark;

import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.ByteBuffer;
import java.nio.channels.ReadableByteChannel;

/**
 * Reads a {@code COPY ... TO STDOUT} of the server at {@code args[0]} ("host:port") through
 * {@link PgWireClient.CopyStream} as a channel into direct buffers of uneven sizes (and now
 * and then as an InputStream, and into a heap buffer), writes every byte it got to
 * {@code args[1]}, then prints whether the connection is at ReadyForQuery again
 * (tests/spark/test_copy_stream.py compares the bytes with what the server sent).
 */
public final class CopyStreamCheck {
    public static void main(String[] args) throws IOException {
        PgWireClient client = PgWireClient.connect(args[0], java.util.Map.of("user", "u",
            "password", "p"));
        PgWireClient.CopyStream data = client.copyOut("COPY (SELECT 1) TO STDOUT");
        ReadableByteChannel channel = data;
        int[] sizes = {1, 7, 65536, 3, 200000, 5, 4096, 131072, 11};
        long total = 0;
        try (OutputStream out = new FileOutputStream(args[1])) {
            for (int turn = 0; ; turn++) {
                byte[] got;
                if (turn % 5 == 4) { // the InputStream side of the same stream
                    got = new byte[sizes[turn % sizes.length]];
                    int n = data.read(got, 0, got.length);
                    if (n < 0) {
                        break;
                    }
                    out.write(got, 0, n);
                    total += n;
                    continue;
                }
                ByteBuffer target = turn % 7 == 6
                    ? ByteBuffer.allocate(sizes[turn % sizes.length])
                    : ByteBuffer.allocateDirect(sizes[turn % sizes.length]);
                target.position(turn % 3); // a buffer not read from its start
                int n = channel.read(target);
                if (n < 0) {
                    break;
                }
                if (n != target.position() - turn % 3) {
                    throw new AssertionError("read " + n + ", position moved "
                        + (target.position() - turn % 3));
                }
                target.flip();
                target.position(turn % 3);
                got = new byte[target.remaining()];
                target.get(got);
                out.write(got);
                total += n;
            }
        }
        System.out.println("bytes " + total + " ready " + client.query("SELECT 2").size());
        client.close();
    }
}
