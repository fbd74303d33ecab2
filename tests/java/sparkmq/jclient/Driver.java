package sparkmq.jclient;

import java.util.Map;
import sparkmq.jutil.Args;
import sparkmq.jutil.JsonOut;

/**
 * The Java test driver: RocketMQ's own remoting clients, run from the command line, reporting every event as
 * one JSON line on stdout.
 *
 * <pre>
 *   java sparkmq.jclient.Driver produce     --namesrv 127.0.0.1:9876 --topic T --count 10 [--send sync|async|oneway|batch|ordered] ...
 *   java sparkmq.jclient.Driver transaction --namesrv ... --topic T --states commit,rollback,unknown --check-answer commit
 *   java sparkmq.jclient.Driver push        --namesrv ... --group G --topic T [--orderly] [--model broadcasting] ...
 *   java sparkmq.jclient.Driver litepull    --namesrv ... --group G --topic T [--assign all --seek 0:5] [--subscribe] ...
 * </pre>
 *
 * Global options: {@code --serialize-type JSON|ROCKETMQ} (the header encoding the client sends), {@code --ak
 * --sk} (sign every request with {@code AclClientRPCHook}), {@code --rebalance-ms} (the consumers' rebalance
 * period, default 20000), and the client settings of {@code Common.configure}.  Exit codes: 0 done without errors, 1 some operation
 * failed (its {@code error} event says which), 2 bad command line, 3 the client could not start.
 */
public final class Driver {
    private Driver() {
    }

    /** Runs one mode; see the class comment. */
    public static void main(String[] argv) {
        JsonOut.event("init"); // routes System.out to stderr before any client class prints
        Args args = new Args(argv);
        int code;
        try {
            String serialize = args.get("serialize-type", null);
            if (serialize != null) {
                System.setProperty("rocketmq.serialize.type", serialize);
            }
            if (args.has("rebalance-ms")) { // read once by the client's RebalanceService: set before it loads
                System.setProperty("rocketmq.client.rebalance.waitInterval", args.get("rebalance-ms", null));
            }
            if (args.positional().isEmpty()) {
                throw new Args.UsageError("a mode is required: produce, transaction, push, litepull");
            }
            String mode = args.positional().get(0);
            switch (mode) {
                case "produce": code = Produce.run(args, false); break;
                case "transaction": code = Produce.run(args, true); break;
                case "push": code = Push.run(args); break;
                case "litepull": code = LitePull.run(args); break;
                default: throw new Args.UsageError("unknown mode " + mode);
            }
        } catch (Args.UsageError e) {
            Map<String, Object> ev = JsonOut.event("usage_error");
            ev.put("message", e.getMessage());
            JsonOut.emit(ev);
            code = 2;
        } catch (StartFailed e) {
            JsonOut.error("start", e.getCause() == null ? e : e.getCause(), null);
            code = 3;
        } catch (Throwable e) {
            JsonOut.error("driver", e, null);
            code = 1;
        }
        Map<String, Object> ev = JsonOut.event("exit");
        ev.put("code", code);
        JsonOut.emit(ev);
        System.exit(code); // the clients' non-daemon threads must not keep the process alive
    }

    /** A client's {@code start()} failed: exit code 3. */
    static final class StartFailed extends RuntimeException {
        StartFailed(Throwable cause) {
            super(cause);
        }
    }
}
