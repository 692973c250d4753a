// Grants ALL to a principal on the given resources, through the Admin API of the
// installed kafka-clients (aiokafka speaks no CreateAcls version Kafka 4 accepts).
//
//   java -cp <kafka classpath> GrantAcls.java <client.properties> <principal> <resource>...
//
// A resource is <type>:<pattern>:<name>, type topic|group|transactional_id|cluster,
// pattern literal|prefixed; e.g. topic:prefixed:granted- group:literal:*
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
            String[] parts = args[i].split(":", 3);
            ResourceType type = ResourceType.fromString(parts[0].toUpperCase());
            PatternType pattern = PatternType.fromString(parts[1].toUpperCase());
            bindings.add(new AclBinding(
                new ResourcePattern(type, parts[2], pattern),
                new AccessControlEntry(principal, "*", AclOperation.ALL, AclPermissionType.ALLOW)));
        }
        try (Admin admin = Admin.create(properties)) {
            admin.createAcls(bindings).all().get();
        }
        System.out.println("granted " + bindings.size());
    }
}
