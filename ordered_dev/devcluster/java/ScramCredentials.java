// Creates, changes or deletes a user's SCRAM credential while the cluster runs, through
// the Admin API of the installed kafka-clients (aiokafka has no AlterUserScramCredentials).
//
//   java -cp <kafka classpath> ScramCredentials.java <client.properties> upsert <user> <mechanism>
//       (the password is read from standard input, so it is not on a command line)
//   java -cp <kafka classpath> ScramCredentials.java <client.properties> delete <user> <mechanism>
//
// mechanism: SCRAM-SHA-256 or SCRAM-SHA-512.
import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.InputStreamReader;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.UserScramCredentialAlteration;
import org.apache.kafka.clients.admin.UserScramCredentialDeletion;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;

public class ScramCredentials {
    public static void main(String[] args) throws Exception {
        Properties properties = new Properties();
        try (FileInputStream in = new FileInputStream(args[0])) {
            properties.load(in);
        }
        String action = args[1];
        String user = args[2];
        ScramMechanism mechanism = ScramMechanism.fromMechanismName(args[3]);
        UserScramCredentialAlteration alteration;
        if (action.equals("upsert")) {
            String password = new BufferedReader(new InputStreamReader(System.in)).readLine();
            alteration = new UserScramCredentialUpsertion(
                user, new ScramCredentialInfo(mechanism, 4096), password);
        } else if (action.equals("delete")) {
            alteration = new UserScramCredentialDeletion(user, mechanism);
        } else {
            throw new IllegalArgumentException("action must be upsert or delete: " + action);
        }
        try (Admin admin = Admin.create(properties)) {
            admin.alterUserScramCredentials(List.of(alteration)).all().get();
        }
        System.out.println(action + " " + user + " " + args[3]);
    }
}
