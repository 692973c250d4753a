// Grants a principal operations on resources, through the Admin API of the installed
// kafka-clients (aiokafka speaks no CreateAcls version Kafka 4 accepts).
//
//   java -cp <kafka classpath> GrantAcls.java <client.properties> <principal> <resource>...
//
// A resource is <type>:<pattern>:<name>[:<operation>], type topic|group|transactional_id|
// cluster, pattern literal|prefixed, operation ALL unless given; e.g.
// topic:prefixed:granted- group:literal:* cluster:literal:kafka-cluster:idempotent_write
import java.io.FileInputStream;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourceType;

public class GrantAcls {
    public static void main(String[] args) throws Exception {
        Properties properties = new Properties();
        try (FileInputStream in = new FileInputStream(args[0])) {
            properties.load(in);
        }
        String principal = args[1];
        List<AclBinding> bindings = new ArrayList<>();
        for (int i = 2; i < args.length; i++) {
            String[] parts = args[i].split(":", 4);
            AclOperation operation =
                parts.length > 3 ? AclOperation.fromString(parts[3].toUpperCase()) : AclOperation.ALL;
            ResourceType type = ResourceType.fromString(parts[0].toUpperCase());
            PatternType pattern = PatternType.fromString(parts[1].toUpperCase());
            bindings.add(new AclBinding(
                new ResourcePattern(type, parts[2], pattern),
                new AccessControlEntry(principal, "*", operation, AclPermissionType.ALLOW)));
        }
        try (Admin admin = Admin.create(properties)) {
            admin.createAcls(bindings).all().get();
        }
        System.out.println("granted " + bindings.size());
    }
}
