// Reads hex-encoded keys, one per line, from stdin; prints for each the Java client's
// murmur2 hash and the partition its built-in partitioner picks among 1..64 partitions,
// so the Python routing core can be compared with the real kafka-clients jar.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.HexFormat;
import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;
import org.apache.kafka.common.utils.Utils;

public class Murmur2Vectors {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        StringBuilder out = new StringBuilder();
        for (String line; (line = in.readLine()) != null; ) {
            byte[] key = HexFormat.of().parseHex(line.trim());
            out.append(Utils.murmur2(key));
            for (int n = 1; n <= 64; n++) {
                out.append(' ').append(BuiltInPartitioner.partitionForKey(key, n));
            }
            out.append('\n');
        }
        System.out.print(out);
    }
}
