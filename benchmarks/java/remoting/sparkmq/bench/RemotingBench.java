package sparkmq.bench;

import java.util.ArrayList;
import java.util.BitSet;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import sparkmq.jutil.Args;
import sparkmq.jutil.JsonOut;
import sparkmq.jutil.Latencies;

/**
 * Benchmarks with RocketMQ's remoting Java client (rocketmq-client 5.5.0), the same program against Apache RocketMQ
 * and against sparkmq.  Each run prints one {@code result} JSON line on stdout (progress on stderr).
 *
 * <pre>
 *   produce-batch --namesrv NS --topic T [--threads 32] [--batch 64] [--size 1024] [--seconds 20] [--warmup-s 5] [--total N]
 *   produce-sync  --namesrv NS --topic T [--threads 64] [--size 1024] [--seconds 20] [--warmup-s 5]
 *   drain         --namesrv NS --topic T --group G --count N [--pull-batch 32] [--timeout-s 600]
 *   e2e           --namesrv NS --topic T --group G [--rate 2000] [--seconds 30] [--warmup-s 5] [--size 1024]
 * </pre>
 *
 * Figures: {@code msgs_per_s} counts messages acknowledged SEND_OK (produce) or delivered (drain) over the
 * measured window ({@code distinct}: the drain's messages counted once per queue offset); produce latencies are
 * per send call (a batch is one call); e2e latency is from the producer's {@code send} call to the listener's first
 * line, both in this JVM ({@code System.nanoTime} carried in the body), and {@code b2r} the same from the message's
 * born timestamp (ms clock).
 */
public final class RemotingBench {
    private RemotingBench() {
    }

    /** Runs one benchmark; see the class comment. */
    public static void main(String[] argv) throws Exception {
        JsonOut.event("init");
        Args args = new Args(argv);
        String mode = args.positional().isEmpty() ? "" : args.positional().get(0);
        Map<String, Object> result;
        switch (mode) {
            case "produce-batch": result = produce(args, true); break;
            case "produce-sync": result = produce(args, false); break;
            case "drain": result = drain(args); break;
            case "e2e": result = e2e(args); break;
            default:
                System.err.println("modes: produce-batch, produce-sync, drain, e2e");
                System.exit(2);
                return;
        }
        JsonOut.emit(result);
        System.exit(0);
    }

    private static DefaultMQProducer producer(Args args, String group) throws Exception {
        DefaultMQProducer producer = new DefaultMQProducer(group);
        producer.setNamesrvAddr(args.require("namesrv"));
        producer.setInstanceName("bench-" + ProcessHandle.current().pid() + "-" + group);
        producer.setSendMsgTimeout(args.intValue("timeout-ms", 10_000));
        producer.setCompressMsgBodyOverHowmuch(1 << 20); // bodies are 1 KiB: never compressed either way
        producer.setMaxMessageSize(8 << 20);
        producer.start();
        return producer;
    }

    private static byte[] body(int size, long seed) {
        byte[] b = new byte[size];
        new Random(seed).nextBytes(b);
        return b;
    }

    /** Threads sending back to back (batches of {@code --batch}, or single sync sends) for a measured window. */
    static Map<String, Object> produce(Args args, boolean batched) throws Exception {
        String topic = args.require("topic");
        int threads = args.intValue("threads", batched ? 32 : 64);
        int batchSize = batched ? args.intValue("batch", 64) : 1;
        byte[] payload = body(args.intValue("size", 1024), 1);
        double seconds = args.doubleValue("seconds", 20);
        double warmup = args.doubleValue("warmup-s", 5);
        long total = args.longValue("total", 0); // fill mode: stop after this many messages, no warm-up
        DefaultMQProducer producer = producer(args, "bench_producer");
        args.rejectUnknown();
        // the route, the connection, and the JIT: one send first
        producer.send(new Message(topic, payload));
        AtomicLong ok = new AtomicLong();
        AtomicLong failed = new AtomicLong();
        AtomicLong claimed = new AtomicLong();
        long start = System.nanoTime();
        long measureFrom = total > 0 ? start : start + (long) (warmup * 1e9);
        long stopAt = total > 0 ? Long.MAX_VALUE : measureFrom + (long) (seconds * 1e9);
        Latencies[] lat = new Latencies[threads];
        AtomicLong okInWindow = new AtomicLong();
        List<Thread> workers = new ArrayList<>();
        Map<String, Integer> errorKinds = new ConcurrentHashMap<>();
        for (int t = 0; t < threads; t++) {
            Latencies mine = lat[t] = new Latencies();
            Thread w = new Thread(() -> {
                List<Message> batch = new ArrayList<>(batchSize);
                while (true) {
                    long now = System.nanoTime();
                    if (now >= stopAt) {
                        break;
                    }
                    if (total > 0 && claimed.addAndGet(batchSize) > total + batchSize - 1) {
                        break;
                    }
                    try {
                        SendResult r;
                        long t0 = System.nanoTime();
                        if (batched) {
                            batch.clear();
                            for (int i = 0; i < batchSize; i++) {
                                batch.add(new Message(topic, payload));
                            }
                            r = producer.send(batch);
                        } else {
                            r = producer.send(new Message(topic, payload));
                        }
                        long t1 = System.nanoTime();
                        if (r.getSendStatus() == SendStatus.SEND_OK) {
                            ok.addAndGet(batchSize);
                            if (t0 >= measureFrom && t1 <= stopAt) {
                                okInWindow.addAndGet(batchSize);
                                mine.add(t1 - t0);
                            }
                        } else {
                            failed.addAndGet(batchSize);
                            errorKinds.merge(r.getSendStatus().name(), 1, Integer::sum);
                        }
                    } catch (Exception e) {
                        failed.addAndGet(batchSize);
                        errorKinds.merge(e.getClass().getSimpleName() + ": " + String.valueOf(e.getMessage())
                                .split("\n")[0], 1, Integer::sum);
                    }
                }
            }, "sender-" + t);
            workers.add(w);
            w.start();
        }
        for (Thread w : workers) {
            w.join();
        }
        long end = System.nanoTime();
        producer.shutdown();
        Latencies all = new Latencies();
        for (Latencies l : lat) {
            all.addAll(l);
        }
        Map<String, Object> r = JsonOut.event("result");
        r.put("bench", batched ? "produce_batch" : "produce_sync");
        double window = total > 0 ? (end - start) / 1e9 : seconds;
        r.put("msgs_per_s", (total > 0 ? ok.get() : okInWindow.get()) / window);
        r.put("seconds", window);
        r.put("sent_ok", ok.get());
        r.put("failed", failed.get());
        r.put("errors", errorKinds);
        r.put("threads", threads);
        r.put("batch", batchSize);
        r.put("call_p50_ms", all.quantileMs(0.5));
        r.put("call_p99_ms", all.quantileMs(0.99));
        return r;
    }

    /** A DefaultLitePullConsumer subscribed from the first offset, until it has {@code --count} messages. */
    static Map<String, Object> drain(Args args) throws Exception {
        String topic = args.require("topic");
        long count = args.longValue("count", 1_000_000);
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(args.require("group"));
        consumer.setNamesrvAddr(args.require("namesrv"));
        consumer.setInstanceName("bench-drain-" + ProcessHandle.current().pid());
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setPullBatchSize(args.intValue("pull-batch", 32));
        consumer.setPullThreadNums(args.intValue("pull-threads", 20));
        consumer.setPollTimeoutMillis(1000);
        consumer.setAutoCommit(true);
        double timeout = args.doubleValue("timeout-s", 600);
        args.rejectUnknown();
        consumer.subscribe(topic, "*");
        consumer.start();
        long got = 0;
        long bytes = 0;
        long first = 0;
        // (broker, queue) -> the queue offsets seen: a message delivered twice counts once in "distinct"
        Map<String, BitSet> seen = new HashMap<>();
        long distinct = 0;
        long start = System.nanoTime();
        long deadline = start + (long) (timeout * 1e9);
        while (got < count && System.nanoTime() < deadline) {
            List<MessageExt> batch = consumer.poll();
            if (!batch.isEmpty() && first == 0) {
                first = System.nanoTime();
            }
            got += batch.size();
            for (MessageExt m : batch) {
                bytes += m.getBody().length;
                BitSet offsets = seen.computeIfAbsent(m.getBrokerName() + "/" + m.getQueueId(), k -> new BitSet());
                int offset = (int) m.getQueueOffset();
                if (!offsets.get(offset)) {
                    offsets.set(offset);
                    distinct++;
                }
            }
        }
        long end = System.nanoTime();
        consumer.shutdown();
        Map<String, Object> r = JsonOut.event("result");
        r.put("bench", "consume_drain");
        // from the first delivered batch (start-up and the first rebalance, ~1 s, are not the drain)
        r.put("msgs_per_s", got / ((end - (first == 0 ? start : first)) / 1e9));
        r.put("received", got);
        r.put("distinct", distinct);
        r.put("mb", bytes / 1e6);
        r.put("startup_s", first == 0 ? Double.NaN : (first - start) / 1e9);
        r.put("seconds", (end - start) / 1e9);
        return r;
    }

    /** A push consumer and a producer in this JVM: a steady {@code --rate} of async sends for a window. */
    static Map<String, Object> e2e(Args args) throws Exception {
        String topic = args.require("topic");
        double rate = args.doubleValue("rate", 2000);
        double seconds = args.doubleValue("seconds", 30);
        double warmup = args.doubleValue("warmup-s", 5);
        int size = args.intValue("size", 1024);
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(args.require("group"));
        consumer.setNamesrvAddr(args.require("namesrv"));
        consumer.setInstanceName("bench-e2e-" + ProcessHandle.current().pid());
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET);
        consumer.subscribe(topic, "*");
        Latencies sendToReceive = new Latencies();
        Latencies bornToReceive = new Latencies();
        long[] window = {Long.MAX_VALUE, Long.MAX_VALUE};
        AtomicLong delivered = new AtomicLong();
        long total = (long) (rate * (warmup + seconds));
        CountDownLatch all = new CountDownLatch(1);
        consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            long now = System.nanoTime();
            long nowMs = System.currentTimeMillis();
            for (MessageExt m : msgs) {
                byte[] b = m.getBody();
                if (b.length < 8) {
                    continue;
                }
                long sent = java.nio.ByteBuffer.wrap(b).getLong();
                synchronized (sendToReceive) {
                    if (sent >= window[0] && sent < window[1]) {
                        sendToReceive.add(now - sent);
                        bornToReceive.add((nowMs - m.getBornTimestamp()) * 1_000_000L);
                    }
                }
                if (delivered.incrementAndGet() >= total) {
                    all.countDown();
                }
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        // the topic exists before the consumer starts (else its route comes with the next 30 s poll)
        DefaultMQProducer producer = producer(args, "bench_e2e_producer");
        args.rejectUnknown();
        producer.send(new Message(topic, new byte[8]));
        consumer.start();
        long assignedBy = System.nanoTime() + 60_000_000_000L;
        while (consumer.getDefaultMQPushConsumerImpl().getRebalanceImpl().getProcessQueueTable().keySet().stream()
                .noneMatch(mq -> mq.getTopic().equals(topic)) && System.nanoTime() < assignedBy) {
            Thread.sleep(50);
        }
        Thread.sleep(1000); // its pulls are held at the broker
        AtomicLong failed = new AtomicLong();
        long start = System.nanoTime();
        synchronized (sendToReceive) {
            window[0] = start + (long) (warmup * 1e9);
            window[1] = window[0] + (long) (seconds * 1e9);
        }
        byte[] pad = body(size, 2);
        for (long i = 0; i < total; i++) {
            long due = start + (long) (i * 1e9 / rate);
            long wait = due - System.nanoTime();
            if (wait > 0) {
                TimeUnit.NANOSECONDS.sleep(wait);
            }
            byte[] b = pad.clone();
            java.nio.ByteBuffer.wrap(b).putLong(System.nanoTime());
            producer.send(new Message(topic, b), new SendCallback() {
                @Override
                public void onSuccess(SendResult r) {
                }

                @Override
                public void onException(Throwable e) {
                    failed.incrementAndGet();
                }
            });
        }
        all.await(30, TimeUnit.SECONDS);
        producer.shutdown();
        consumer.shutdown();
        Map<String, Object> r = JsonOut.event("result");
        r.put("bench", "e2e");
        synchronized (sendToReceive) {
            r.put("p50_ms", sendToReceive.quantileMs(0.5));
            r.put("p99_ms", sendToReceive.quantileMs(0.99));
            r.put("max_ms", sendToReceive.quantileMs(1.0));
            r.put("b2r_p50_ms", bornToReceive.quantileMs(0.5));
            r.put("b2r_p99_ms", bornToReceive.quantileMs(0.99));
            r.put("samples", sendToReceive.count());
        }
        r.put("rate", rate);
        r.put("delivered", delivered.get());
        r.put("sent", total);
        r.put("send_failed", failed.get());
        return r;
    }
}
