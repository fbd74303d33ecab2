package sparkmq.jclient;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageClientIDSetter;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import sparkmq.jutil.Args;
import sparkmq.jutil.JsonOut;
import sparkmq.jutil.StopSignal;

/**
 * {@code produce}: DefaultMQProducer sends ({@code --send sync|async|oneway|batch|ordered}); {@code transaction}:
 * TransactionMQProducer half messages whose local transaction answers {@code --states} (cycled per message).  A
 * check-back answers what the message's local transaction decided; for one left UNKNOW it answers UNKNOW
 * {@code --check-unknown-first K} times, then {@code --check-answer}.  The producer stays online after its sends
 * until {@code --wait-checks N} check-backs came, {@code --wait-resolved} (every UNKNOW one answered for good),
 * {@code --duration-s}, or stdin closes.
 *
 * <p>Message i has body {@code --body} (default {@code msg-<i>}; {@code {i}} is replaced by i) padded with
 * {@code x} to {@code --body-size}, tag {@code --tags} (comma list, cycled), keys {@code --keys-prefix}+i, user
 * properties {@code --prop k=v} (repeatable) and {@code i=<i>}, delay {@code --delay-level} or
 * {@code --delay-ms}.  Each send (each message of a batch) is reported as a {@code sent} event with the ids and
 * the queue; a failed one as an {@code error} event with {@code i}.
 */
final class Produce {
    private Produce() {
    }

    static int run(Args args, boolean transactional) throws Exception {
        String topic = args.require("topic");
        String group = args.get("group", transactional ? "sparkmq_tx_producer" : "sparkmq_producer");
        int count = args.intValue("count", 1);
        String send = transactional ? "transaction" : args.get("send", "sync");
        int batchSize = args.intValue("batch-size", 16);
        int orderKeys = args.intValue("order-keys", 4);
        double rate = args.doubleValue("rate", 0);
        int timeoutMs = args.intValue("timeout-ms", 3000);
        int inflight = args.intValue("async-inflight", 256);
        boolean withBody = !args.flag("no-body");
        String[] states = args.get("states", "commit").split(",");
        String checkAnswer = args.get("check-answer", "commit");
        int unknownFirst = args.intValue("check-unknown-first", 0);
        int waitChecks = args.intValue("wait-checks", 0);
        boolean waitResolved = args.flag("wait-resolved");
        double duration = args.doubleValue("duration-s", 0);
        boolean stdinStop = args.flag("stdin-stop");
        String brokerName = args.get("broker-name", null);
        int queueId = args.intValue("queue-id", -1);
        Messages messages = new Messages(args, topic);

        DefaultMQProducer producer;
        AtomicInteger checks = new AtomicInteger();
        java.util.concurrent.atomic.AtomicBoolean sendsDone = new java.util.concurrent.atomic.AtomicBoolean();
        StopSignal stop = new StopSignal(duration, stdinStop);
        if (transactional) {
            TransactionMQProducer tx = new TransactionMQProducer(group, Common.rpcHook(args));
            Map<String, AtomicInteger> seen = new ConcurrentHashMap<>();
            // the "local transactions": what each message's local transaction decided, by UNIQ_KEY; a check-back
            // answers from it (the broker may check a message it was already told about: the answer must agree)
            Map<String, String> local = new ConcurrentHashMap<>();
            tx.setTransactionListener(new TransactionListener() {
                @Override
                public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                    local.put(MessageClientIDSetter.getUniqID(msg), (String) arg);
                    return state((String) arg);
                }

                @Override
                public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                    String uniq = MessageClientIDSetter.getUniqID(msg);
                    int n = seen.computeIfAbsent(uniq == null ? msg.getMsgId() : uniq, k -> new AtomicInteger())
                            .incrementAndGet();
                    String decided = local.getOrDefault(uniq, "unknown");
                    LocalTransactionState answer = !decided.equals("unknown") ? state(decided)
                            : n <= unknownFirst ? LocalTransactionState.UNKNOW : state(checkAnswer);
                    if (!decided.equals("unknown") || answer != LocalTransactionState.UNKNOW) {
                        local.put(uniq, answer == LocalTransactionState.UNKNOW ? "unknown"
                                : answer == LocalTransactionState.COMMIT_MESSAGE ? "commit" : "rollback");
                    }
                    Map<String, Object> ev = Common.received(msg, withBody);
                    ev.put("event", "check");
                    ev.put("msgId", uniq);
                    ev.put("offsetMsgId", msg.getMsgId());
                    ev.put("transactionId", msg.getTransactionId());
                    ev.put("checkNumber", n);
                    ev.put("answer", answer.name());
                    ev.put("localState", decided);
                    JsonOut.emit(ev);
                    if (waitChecks > 0 && checks.incrementAndGet() >= waitChecks) {
                        stop.fire("checks");
                    }
                    if (waitResolved && sendsDone.get() && !local.containsValue("unknown")) {
                        stop.fire("resolved");
                    }
                    return answer;
                }
            });
            producer = tx;
        } else {
            producer = new DefaultMQProducer(group, Common.rpcHook(args));
        }
        Common.configure(producer, args);
        producer.setSendMsgTimeout(timeoutMs);
        producer.setRetryTimesWhenSendFailed(args.intValue("retries", 2));
        producer.setRetryTimesWhenSendAsyncFailed(args.intValue("retries", 2));
        if (args.has("compress-over")) {
            producer.setCompressMsgBodyOverHowmuch(args.intValue("compress-over", 4096));
        }
        args.rejectUnknown();
        try {
            producer.start();
        } catch (MQClientException e) {
            throw new Driver.StartFailed(e);
        }
        Map<String, Object> started = JsonOut.event("started");
        started.put("mode", send);
        started.put("group", group);
        started.put("clientId", producer.buildMQClientId());
        started.put("pid", ProcessHandle.current().pid());
        JsonOut.emit(started);

        AtomicInteger errors = new AtomicInteger();
        Semaphore window = new Semaphore(inflight);
        long t0 = System.nanoTime();
        int i = 0;
        while (i < count) {
            if (rate > 0) {
                long due = t0 + (long) (i * 1e9 / rate);
                long wait = due - System.nanoTime();
                if (wait > 0) {
                    TimeUnit.NANOSECONDS.sleep(wait);
                }
            }
            final int index = i;
            if (send.equals("batch")) {
                int n = Math.min(batchSize, count - i);
                List<Message> batch = new ArrayList<>(n);
                for (int k = 0; k < n; k++) {
                    batch.add(messages.make(i + k));
                }
                try {
                    long started0 = System.nanoTime();
                    SendResult r = brokerName != null
                            ? producer.send(batch, new MessageQueue(topic, brokerName, queueId), timeoutMs)
                            : producer.send(batch, timeoutMs);
                    reportBatch(r, index, batch, System.nanoTime() - started0);
                } catch (Exception e) {
                    errors.incrementAndGet();
                    JsonOut.error("send", e, Map.of("i", index, "batch", n));
                }
                i += n;
                continue;
            }
            Message msg = messages.make(i);
            long sent0 = System.nanoTime();
            try {
                switch (send) {
                    case "sync": {
                        SendResult r = brokerName != null
                                ? producer.send(msg, new MessageQueue(topic, brokerName, queueId), timeoutMs)
                                : producer.send(msg, timeoutMs);
                        report(r, index, msg, System.nanoTime() - sent0, null);
                        break;
                    }
                    case "ordered": {
                        int key = index % orderKeys;
                        SendResult r = producer.send(msg, (mqs, m, arg) -> mqs.get((Integer) arg % mqs.size()),
                                key, timeoutMs);
                        report(r, index, msg, System.nanoTime() - sent0, key);
                        break;
                    }
                    case "async": {
                        window.acquire();
                        producer.send(msg, new SendCallback() {
                            @Override
                            public void onSuccess(SendResult r) {
                                report(r, index, msg, System.nanoTime() - sent0, null);
                                window.release();
                            }

                            @Override
                            public void onException(Throwable e) {
                                errors.incrementAndGet();
                                JsonOut.error("send", e, Map.of("i", index));
                                window.release();
                            }
                        }, timeoutMs);
                        break;
                    }
                    case "oneway": {
                        producer.sendOneway(msg);
                        Map<String, Object> ev = JsonOut.event("sent");
                        ev.put("i", index);
                        ev.put("msgId", MessageClientIDSetter.getUniqID(msg));
                        ev.put("oneway", true);
                        ev.put("topic", topic);
                        ev.put("tags", msg.getTags());
                        ev.put("keys", msg.getKeys());
                        JsonOut.emit(ev);
                        break;
                    }
                    case "transaction": {
                        String state = states[index % states.length];
                        TransactionSendResult r = ((TransactionMQProducer) producer)
                                .sendMessageInTransaction(msg, state);
                        Map<String, Object> ev = sentEvent(r, index, msg, System.nanoTime() - sent0);
                        ev.put("localState", r.getLocalTransactionState().name());
                        ev.put("requestedState", state);
                        JsonOut.emit(ev);
                        break;
                    }
                    default:
                        throw new Args.UsageError("--send takes sync, async, oneway, batch or ordered, got " + send);
                }
            } catch (Args.UsageError e) {
                throw e;
            } catch (Exception e) {
                errors.incrementAndGet();
                JsonOut.error("send", e, Map.of("i", index));
            }
            i++;
        }
        if (send.equals("async")) {
            window.acquire(inflight); // every callback has run
            window.release(inflight);
        }
        sendsDone.set(true);
        Map<String, Object> done = JsonOut.event("sends_done");
        done.put("count", count);
        done.put("errors", errors.get());
        done.put("seconds", (System.nanoTime() - t0) / 1e9);
        JsonOut.emit(done);
        if (transactional && (waitChecks > 0 || waitResolved || duration > 0 || stdinStop)) {
            Map<String, Object> ev = JsonOut.event("stopping");
            ev.put("reason", stop.await());
            ev.put("checks", checks.get());
            JsonOut.emit(ev);
            // the last check-back's answer (a one-way END_TRANSACTION sent after the listener returns) must leave
            // before shutdown closes the connection
            Thread.sleep(1000);
        } else if (!transactional && (duration > 0 || stdinStop)) {
            stop.await(); // stay online (e.g. as the group's producer) until told
        }
        producer.shutdown();
        return errors.get() == 0 ? 0 : 1;
    }

    private static LocalTransactionState state(String name) {
        switch (name) {
            case "commit": return LocalTransactionState.COMMIT_MESSAGE;
            case "rollback": return LocalTransactionState.ROLLBACK_MESSAGE;
            case "unknown": return LocalTransactionState.UNKNOW;
            default: throw new Args.UsageError("transaction states are commit, rollback, unknown; got " + name);
        }
    }

    private static Map<String, Object> sentEvent(SendResult r, int index, Message msg, long nanos) {
        Map<String, Object> ev = JsonOut.event("sent");
        ev.put("i", index);
        ev.put("msgId", r.getMsgId());
        ev.put("offsetMsgId", r.getOffsetMsgId());
        ev.put("status", r.getSendStatus().name());
        ev.put("topic", r.getMessageQueue().getTopic());
        ev.put("brokerName", r.getMessageQueue().getBrokerName());
        ev.put("queueId", r.getMessageQueue().getQueueId());
        ev.put("queueOffset", r.getQueueOffset());
        ev.put("transactionId", r.getTransactionId());
        ev.put("regionId", r.getRegionId());
        ev.put("tags", msg.getTags());
        ev.put("keys", msg.getKeys());
        ev.put("sendMs", nanos / 1e6);
        return ev;
    }

    private static void report(SendResult r, int index, Message msg, long nanos, Integer orderKey) {
        Map<String, Object> ev = sentEvent(r, index, msg, nanos);
        if (orderKey != null) {
            ev.put("orderKey", orderKey);
        }
        JsonOut.emit(ev);
    }

    /** One {@code sent} event per message of a batch: the result's ids are comma-joined, its offset the first. */
    private static void reportBatch(SendResult r, int first, List<Message> batch, long nanos) {
        String[] ids = r.getMsgId() == null ? new String[0] : r.getMsgId().split(",");
        String[] offsetIds = r.getOffsetMsgId() == null ? new String[0] : r.getOffsetMsgId().split(",");
        for (int k = 0; k < batch.size(); k++) {
            Map<String, Object> ev = sentEvent(r, first + k, batch.get(k), nanos);
            ev.put("msgId", k < ids.length ? ids[k] : null);
            ev.put("offsetMsgId", k < offsetIds.length ? offsetIds[k] : null);
            ev.put("queueOffset", r.getQueueOffset() + k);
            ev.put("batchIndex", k);
            ev.put("batchSize", batch.size());
            JsonOut.emit(ev);
        }
    }

    /** Builds message i from the command line's template. */
    static final class Messages {
        private final String topic;
        private final String body;
        private final int bodySize;
        private final String[] tags;
        private final String keysPrefix;
        private final List<String[]> props = new ArrayList<>();
        private final int delayLevel;
        private final long delayMs;

        Messages(Args args, String topic) {
            this.topic = topic;
            this.body = args.get("body", "msg-{i}");
            this.bodySize = args.intValue("body-size", 0);
            String t = args.get("tags", null);
            this.tags = t == null ? null : t.split(",");
            this.keysPrefix = args.get("keys-prefix", null);
            for (String p : args.all("prop")) {
                int eq = p.indexOf('=');
                if (eq <= 0) {
                    throw new Args.UsageError("--prop takes k=v, got " + p);
                }
                props.add(new String[] {p.substring(0, eq), p.substring(eq + 1)});
            }
            this.delayLevel = args.intValue("delay-level", 0);
            this.delayMs = args.longValue("delay-ms", 0);
        }

        Message make(int i) {
            byte[] text = body.replace("{i}", Integer.toString(i)).getBytes(StandardCharsets.UTF_8);
            byte[] payload = text;
            if (bodySize > text.length) {
                payload = new byte[bodySize];
                java.util.Arrays.fill(payload, (byte) 'x');
                System.arraycopy(text, 0, payload, 0, text.length);
            }
            Message m = new Message(topic, payload);
            if (tags != null) {
                m.setTags(tags[i % tags.length]);
            }
            if (keysPrefix != null) {
                m.setKeys(keysPrefix + i);
            }
            for (String[] kv : props) {
                m.putUserProperty(kv[0], kv[1].replace("{i}", Integer.toString(i)));
            }
            m.putUserProperty("i", Integer.toString(i));
            if (delayLevel > 0) {
                m.setDelayTimeLevel(delayLevel);
            }
            if (delayMs > 0) {
                m.setDelayTimeMs(delayMs);
            }
            return m;
        }
    }
}
