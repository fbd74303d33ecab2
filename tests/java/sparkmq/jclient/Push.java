package sparkmq.jclient;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.impl.consumer.ProcessQueue;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.protocol.heartbeat.MessageModel;
import sparkmq.jutil.Args;
import sparkmq.jutil.JsonOut;
import sparkmq.jutil.StopSignal;

/**
 * {@code push}: a DefaultMQPushConsumer (clustering or {@code --model broadcasting}, concurrently or
 * {@code --orderly}) that reports every delivery as a {@code received} event with the listener's answer
 * ({@code status}), and its queue assignment as an {@code assignment} event whenever it changes (with the
 * orderly lock of each queue).
 *
 * <p>The listener answers RECONSUME_LATER (orderly: SUSPEND_CURRENT_QUEUE_A_MOMENT) for messages chosen with
 * {@code --later-keys k1,k2}, {@code --later-tags T}, or {@code --later-all}, until the message's reconsume
 * times reach {@code --later-until} (default: always).  {@code --max-reconsume-times N} sets the consumer's
 * maximum (then the broker moves the message to {@code %DLQ%<group>}).  It stops after {@code --count} deliveries
 * answered CONSUME_SUCCESS (and {@code --linger-ms}), after {@code --duration-s}, or when stdin closes
 * ({@code --stdin-stop}).
 */
final class Push {
    private Push() {
    }

    static int run(Args args) throws Exception {
        String group = args.require("group");
        String topic = args.require("topic");
        boolean orderly = args.flag("orderly");
        boolean withBody = !args.flag("no-body");
        long count = args.longValue("count", 0);
        long lingerMs = args.longValue("linger-ms", 0);
        long sleepMs = args.longValue("consume-sleep-ms", 0);
        Set<String> laterKeys = new HashSet<>(List.of(args.get("later-keys", "").split(",")));
        laterKeys.remove("");
        Set<String> laterTags = new HashSet<>(List.of(args.get("later-tags", "").split(",")));
        laterTags.remove("");
        boolean laterAll = args.flag("later-all");
        int laterUntil = args.intValue("later-until", Integer.MAX_VALUE);
        StopSignal stop = new StopSignal(args.doubleValue("duration-s", 0), args.flag("stdin-stop"));

        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(group, Common.rpcHook(args),
                new AllocateMessageQueueAveragely());
        Common.configure(consumer, args);
        consumer.setMessageModel(args.get("model", "clustering").equalsIgnoreCase("broadcasting")
                ? MessageModel.BROADCASTING : MessageModel.CLUSTERING);
        String from = args.get("from", "first");
        if (from.equals("first")) {
            consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        } else if (from.equals("last")) {
            consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET);
        } else if (from.startsWith("timestamp:")) {
            consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_TIMESTAMP);
            consumer.setConsumeTimestamp(from.substring("timestamp:".length()));
        } else {
            throw new Args.UsageError("--from takes first, last or timestamp:yyyyMMddHHmmss, got " + from);
        }
        consumer.setConsumeThreadMin(args.intValue("threads", 4));
        consumer.setConsumeThreadMax(args.intValue("threads", 4));
        consumer.setConsumeMessageBatchMaxSize(args.intValue("consume-batch", 1));
        consumer.setPullBatchSize(args.intValue("pull-batch", 32));
        if (args.has("max-reconsume-times")) {
            consumer.setMaxReconsumeTimes(args.intValue("max-reconsume-times", 16));
        }
        if (args.has("suspend-ms")) {
            consumer.setSuspendCurrentQueueTimeMillis(args.longValue("suspend-ms", 1000));
        }
        consumer.setAwaitTerminationMillisWhenShutdown(args.longValue("await-shutdown-ms", 0));
        consumer.subscribe(topic, Common.selector(args));
        for (Map.Entry<String, String> sub : Common.extraSubscriptions(args).entrySet()) {
            consumer.subscribe(sub.getKey(), sub.getValue());
        }
        args.rejectUnknown();

        AtomicLong succeeded = new AtomicLong();
        Later later = m -> (laterAll || laterTags.contains(String.valueOf(m.getTags()))
                || (m.getKeys() != null && laterKeys.contains(m.getKeys())))
                && m.getReconsumeTimes() < laterUntil;
        if (orderly) {
            consumer.registerMessageListener((MessageListenerOrderly) (msgs, context) -> {
                boolean retry = false;
                long startMs = System.currentTimeMillis();
                for (MessageExt m : msgs) {
                    retry |= later.test(m);
                }
                sleep(sleepMs);
                String status = retry ? "SUSPEND_CURRENT_QUEUE_A_MOMENT" : "SUCCESS";
                for (MessageExt m : msgs) {
                    emit(m, withBody, status, startMs);
                }
                if (!retry) {
                    done(succeeded.addAndGet(msgs.size()), count, lingerMs, stop);
                }
                return retry ? ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT : ConsumeOrderlyStatus.SUCCESS;
            });
        } else {
            consumer.registerMessageListener((MessageListenerConcurrently) (msgs, context) -> {
                boolean retry = false;
                long startMs = System.currentTimeMillis();
                for (MessageExt m : msgs) {
                    retry |= later.test(m);
                }
                sleep(sleepMs);
                String status = retry ? "RECONSUME_LATER" : "CONSUME_SUCCESS";
                for (MessageExt m : msgs) {
                    emit(m, withBody, status, startMs);
                }
                if (!retry) {
                    done(succeeded.addAndGet(msgs.size()), count, lingerMs, stop);
                }
                return retry ? ConsumeConcurrentlyStatus.RECONSUME_LATER : ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
        }
        try {
            consumer.start();
        } catch (MQClientException e) {
            throw new Driver.StartFailed(e);
        }
        Map<String, Object> started = JsonOut.event("started");
        started.put("mode", orderly ? "push_orderly" : "push");
        started.put("group", group);
        started.put("clientId", consumer.buildMQClientId());
        started.put("pid", ProcessHandle.current().pid());
        JsonOut.emit(started);

        String last = "";
        while (!stop.await(100)) {
            last = reportAssignment(consumer, last, orderly);
        }
        Map<String, Object> ev = JsonOut.event("stopping");
        ev.put("reason", stop.reason());
        ev.put("succeeded", succeeded.get());
        JsonOut.emit(ev);
        consumer.shutdown();
        return 0;
    }

    private interface Later {
        boolean test(MessageExt m);
    }

    private static void sleep(long ms) {
        if (ms > 0) {
            try {
                Thread.sleep(ms);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }

    private static void emit(MessageExt m, boolean withBody, String status, long startMs) {
        Map<String, Object> ev = Common.received(m, withBody);
        ev.put("status", status);
        ev.put("startMs", startMs);
        JsonOut.emit(ev);
    }

    private static void done(long succeeded, long count, long lingerMs, StopSignal stop) {
        if (count > 0 && succeeded >= count) {
            if (lingerMs <= 0) {
                stop.fire("count");
                return;
            }
            Thread t = new Thread(() -> {
                sleep(lingerMs);
                stop.fire("count");
            });
            t.setDaemon(true);
            t.start();
        }
    }

    /** Emits an {@code assignment} event when the consumer's queues (or their orderly locks) changed. */
    private static String reportAssignment(DefaultMQPushConsumer consumer, String last, boolean orderly) {
        Map<MessageQueue, ProcessQueue> table =
                consumer.getDefaultMQPushConsumerImpl().getRebalanceImpl().getProcessQueueTable();
        List<MessageQueue> mqs = new ArrayList<>();
        List<Map<String, Object>> queues = new ArrayList<>();
        for (Map.Entry<MessageQueue, ProcessQueue> e : table.entrySet()) {
            if (!e.getValue().isDropped()) {
                mqs.add(e.getKey());
            }
        }
        java.util.Collections.sort(mqs);
        for (MessageQueue mq : mqs) {
            Map<String, Object> q = Common.queue(mq);
            ProcessQueue pq = table.get(mq);
            if (orderly) {
                q.put("locked", pq != null && pq.isLocked());
            }
            queues.add(q);
        }
        String text = JsonOut.encode(queues);
        if (!text.equals(last)) {
            Map<String, Object> ev = JsonOut.event("assignment");
            ev.put("queues", queues);
            ev.put("ms", System.currentTimeMillis());
            JsonOut.emit(ev);
        }
        return text;
    }
}
