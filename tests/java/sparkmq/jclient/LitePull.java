package sparkmq.jclient;

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.protocol.heartbeat.MessageModel;
import sparkmq.jutil.Args;
import sparkmq.jutil.JsonOut;
import sparkmq.jutil.StopSignal;

/**
 * {@code litepull}: a DefaultLitePullConsumer, either assigned queues ({@code --assign all} or
 * {@code --assign 0,2}; then {@code --seek Q:OFFSET} (repeatable), {@code --seek-begin} or {@code --seek-end},
 * done while the queues are paused, {@code --seek-settle-ms} after the assignment)
 * or subscribed ({@code --subscribe}, with {@code --tags}/{@code --sql}, the group's offsets).  Every polled
 * message is a {@code received} event.  {@code --commit sync|async|none} after each non-empty poll (with
 * {@code --auto-commit false}); at the end a {@code committed} event lists the group's committed offset of each
 * queue as the broker reports it.  Stops after {@code --count} messages, {@code --duration-s}, {@code --idle-ms}
 * without a message, or when stdin closes ({@code --stdin-stop}).
 */
final class LitePull {
    private LitePull() {
    }

    static int run(Args args) throws Exception {
        String group = args.require("group");
        String topic = args.require("topic");
        boolean withBody = !args.flag("no-body");
        long count = args.longValue("count", 0);
        long idleMs = args.longValue("idle-ms", 0);
        String commit = args.get("commit", "none");
        boolean subscribe = args.flag("subscribe");
        StopSignal stop = new StopSignal(args.doubleValue("duration-s", 0), args.flag("stdin-stop"));

        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(group, Common.rpcHook(args));
        Common.configure(consumer, args);
        consumer.setAutoCommit(args.has("auto-commit") ? args.flag("auto-commit") : commit.equals("none"));
        consumer.setPullBatchSize(args.intValue("pull-batch", 32));
        consumer.setPollTimeoutMillis(args.longValue("poll-ms", 1000));
        // RocketMQ's default (20): each queue's pull task holds a thread through its long poll (20 s), so with
        // fewer threads than queues the queues past the first threads' wait that long
        consumer.setPullThreadNums(args.intValue("pull-threads", 20));
        consumer.setConsumeFromWhere(args.get("from", "first").equals("last")
                ? ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET : ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        if (args.get("model", "clustering").equalsIgnoreCase("broadcasting")) {
            consumer.setMessageModel(MessageModel.BROADCASTING);
        }
        if (subscribe) {
            consumer.subscribe(topic, Common.selector(args));
        }
        String assign = args.get("assign", subscribe ? null : "all");
        List<String> seeks = args.all("seek");
        boolean seekBegin = args.flag("seek-begin");
        boolean seekEnd = args.flag("seek-end");
        long seekSettleMs = args.longValue("seek-settle-ms", 500);
        args.rejectUnknown();
        try {
            consumer.start();
        } catch (MQClientException e) {
            throw new Driver.StartFailed(e);
        }
        List<MessageQueue> assigned = new ArrayList<>();
        if (assign != null) {
            Collection<MessageQueue> all = consumer.fetchMessageQueues(topic);
            List<MessageQueue> sorted = new ArrayList<>(all);
            java.util.Collections.sort(sorted);
            for (MessageQueue mq : sorted) {
                if (assign.equals("all") || List.of(assign.split(",")).contains(Integer.toString(mq.getQueueId()))) {
                    assigned.add(mq);
                }
            }
            consumer.assign(assigned);
            if (seekBegin || seekEnd || !seeks.isEmpty()) {
                // The client's seek cancels a queue's pull task by interrupting the thread that task last ran on
                // (PullTaskImpl.tryInterrupt), which may by then run another queue's task -- and an interrupted
                // task is never scheduled again: that queue would go silent.  Paused tasks only reschedule
                // themselves, so pause, let the first pulls finish, seek, resume.
                consumer.pause(assigned);
                Thread.sleep(seekSettleMs);
            }
            for (MessageQueue mq : assigned) {
                if (seekBegin) {
                    consumer.seekToBegin(mq);
                } else if (seekEnd) {
                    consumer.seekToEnd(mq);
                }
            }
            for (String spec : seeks) {
                String[] parts = spec.split(":");
                for (MessageQueue mq : assigned) {
                    if (Integer.toString(mq.getQueueId()).equals(parts[0])) {
                        consumer.seek(mq, Long.parseLong(parts[1]));
                    }
                }
            }
            consumer.resume(assigned);
        }
        Map<String, Object> started = JsonOut.event("started");
        started.put("mode", subscribe ? "litepull_subscribe" : "litepull_assign");
        started.put("group", group);
        started.put("clientId", consumer.buildMQClientId());
        started.put("pid", ProcessHandle.current().pid());
        started.put("assigned", Common.queues(assigned));
        JsonOut.emit(started);

        long received = 0;
        long lastMessage = System.currentTimeMillis();
        int errors = 0;
        while (!stop.fired()) {
            List<MessageExt> batch = consumer.poll();
            for (MessageExt m : batch) {
                JsonOut.emit(Common.received(m, withBody));
            }
            received += batch.size();
            if (!batch.isEmpty()) {
                lastMessage = System.currentTimeMillis();
                try {
                    if (commit.equals("sync")) {
                        consumer.commitSync();
                    } else if (commit.equals("async")) {
                        consumer.commit();
                    }
                } catch (RuntimeException e) {
                    errors++;
                    JsonOut.error("commit", e, null);
                }
            }
            if (count > 0 && received >= count) {
                stop.fire("count");
            } else if (idleMs > 0 && System.currentTimeMillis() - lastMessage > idleMs) {
                stop.fire("idle");
            }
        }
        if (!commit.equals("none") || consumer.isAutoCommit()) {
            consumer.commitSync();
        }
        Map<String, Object> ev = JsonOut.event("committed");
        List<Map<String, Object>> offsets = new ArrayList<>();
        Collection<MessageQueue> queues = assign != null ? assigned : consumer.assignment();
        for (MessageQueue mq : queues) {
            Map<String, Object> q = Common.queue(mq);
            try {
                q.put("offset", consumer.committed(mq));
            } catch (MQClientException e) {
                q.put("error", e.getMessage());
            }
            offsets.add(q);
        }
        ev.put("queues", offsets);
        JsonOut.emit(ev);
        Map<String, Object> stopping = JsonOut.event("stopping");
        stopping.put("reason", stop.reason());
        stopping.put("received", received);
        JsonOut.emit(stopping);
        consumer.shutdown();
        return errors == 0 ? 0 : 1;
    }
}
