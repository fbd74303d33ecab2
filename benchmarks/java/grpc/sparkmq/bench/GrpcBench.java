package sparkmq.bench;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import sparkmq.jutil.Args;
import sparkmq.jutil.JsonOut;
import sparkmq.jutil.Latencies;

/**
 * Benchmarks with RocketMQ 5's gRPC Java client (rocketmq-client-java 5.2.0), the same program against RocketMQ's
 * proxy and against sparkmq's gRPC endpoint.  One {@code result} JSON line on stdout.
 *
 * <pre>
 *   send     --endpoint HOST:PORT --topic T [--threads 32] [--size 1024] [--seconds 20] [--warmup-s 5]
 *   pop-init --endpoint HOST:PORT --topic T --group G      (the group's first receive: its offset starts here)
 *   pop      --endpoint HOST:PORT --topic T --group G --count N [--threads 4] [--batch 32] [--invisible-s 30]
 * </pre>
 *
 * {@code send}: threads each sending one message at a time ({@code Producer.send}); msgs/s of sends answered
 * in the window, and the per-send p50/p99.  {@code pop}: threads each {@code receive(batch)} then ack every
 * message ({@code ackAsync}, all awaited before the next receive) until N messages were acked; msgs/s.
 */
public final class GrpcBench {
    private GrpcBench() {
    }

    /** Runs one benchmark; see the class comment. */
    public static void main(String[] argv) throws Exception {
        JsonOut.event("init");
        Args args = new Args(argv);
        String mode = args.positional().isEmpty() ? "" : args.positional().get(0);
        Map<String, Object> result;
        switch (mode) {
            case "send": result = send(args); break;
            case "pop-init": result = pop(args, true); break;
            case "pop": result = pop(args, false); break;
            default:
                System.err.println("modes: send, pop-init, pop");
                System.exit(2);
                return;
        }
        JsonOut.emit(result);
        System.exit(0);
    }

    private static ClientConfiguration config(Args args) {
        return ClientConfiguration.newBuilder().setEndpoints(args.require("endpoint")).enableSsl(args.flag("tls"))
                .setRequestTimeout(Duration.ofSeconds(args.intValue("timeout-s", 10))).build();
    }

    static Map<String, Object> send(Args args) throws Exception {
        String topic = args.require("topic");
        int threads = args.intValue("threads", 32);
        byte[] body = new byte[args.intValue("size", 1024)];
        new Random(1).nextBytes(body);
        double seconds = args.doubleValue("seconds", 20);
        double warmup = args.doubleValue("warmup-s", 5);
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        Producer producer = provider.newProducerBuilder().setClientConfiguration(config(args)).setTopics(topic)
                .build();
        args.rejectUnknown();
        producer.send(provider.newMessageBuilder().setTopic(topic).setBody(body).build());
        long start = System.nanoTime();
        long measureFrom = start + (long) (warmup * 1e9);
        long stopAt = measureFrom + (long) (seconds * 1e9);
        AtomicLong okInWindow = new AtomicLong();
        AtomicLong failed = new AtomicLong();
        Map<String, Integer> errors = new ConcurrentHashMap<>();
        Latencies[] lat = new Latencies[threads];
        List<Thread> workers = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            Latencies mine = lat[t] = new Latencies();
            Thread w = new Thread(() -> {
                while (System.nanoTime() < stopAt) {
                    Message m = provider.newMessageBuilder().setTopic(topic).setBody(body).build();
                    long t0 = System.nanoTime();
                    try {
                        producer.send(m);
                        long t1 = System.nanoTime();
                        if (t0 >= measureFrom && t1 <= stopAt) {
                            okInWindow.incrementAndGet();
                            mine.add(t1 - t0);
                        }
                    } catch (Exception e) {
                        failed.incrementAndGet();
                        errors.merge(e.getClass().getSimpleName() + ": " + String.valueOf(e.getMessage())
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
        producer.close();
        Latencies all = new Latencies();
        for (Latencies l : lat) {
            all.addAll(l);
        }
        Map<String, Object> r = JsonOut.event("result");
        r.put("bench", "grpc_send");
        r.put("msgs_per_s", okInWindow.get() / seconds);
        r.put("p50_ms", all.quantileMs(0.5));
        r.put("p99_ms", all.quantileMs(0.99));
        r.put("failed", failed.get());
        r.put("errors", errors);
        r.put("threads", threads);
        return r;
    }

    static Map<String, Object> pop(Args args, boolean initOnly) throws Exception {
        String topic = args.require("topic");
        long count = args.longValue("count", 100_000);
        int threads = args.intValue("threads", 4);
        int batch = args.intValue("batch", 32);
        Duration invisible = Duration.ofSeconds(args.intValue("invisible-s", 30));
        double timeout = args.doubleValue("timeout-s", 600);
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        SimpleConsumer consumer = provider.newSimpleConsumerBuilder().setClientConfiguration(config(args))
                .setConsumerGroup(args.require("group"))
                .setSubscriptionExpressions(Map.of(topic, FilterExpression.SUB_ALL))
                .setAwaitDuration(Duration.ofSeconds(args.intValue("await-s", 2))).build();
        args.rejectUnknown();
        Map<String, Object> r = JsonOut.event("result");
        if (initOnly) {
            List<MessageView> got = consumer.receive(batch, invisible);
            for (MessageView m : got) {
                consumer.ack(m);
            }
            consumer.close();
            r.put("bench", "grpc_pop_init");
            r.put("received", got.size());
            return r;
        }
        AtomicLong acked = new AtomicLong();
        AtomicLong failed = new AtomicLong();
        AtomicLong emptyReceives = new AtomicLong();
        Map<String, Integer> errors = new ConcurrentHashMap<>();
        long start = System.nanoTime();
        long deadline = start + (long) (timeout * 1e9);
        long[] firstAt = {0};
        List<Thread> workers = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            Thread w = new Thread(() -> {
                while (acked.get() < count && System.nanoTime() < deadline) {
                    try {
                        List<MessageView> got = consumer.receive(batch, invisible);
                        if (got.isEmpty()) {
                            emptyReceives.incrementAndGet();
                            continue;
                        }
                        synchronized (firstAt) {
                            if (firstAt[0] == 0) {
                                firstAt[0] = System.nanoTime();
                            }
                        }
                        List<CompletableFuture<Void>> acks = new ArrayList<>(got.size());
                        for (MessageView m : got) {
                            acks.add(consumer.ackAsync(m));
                        }
                        for (CompletableFuture<Void> f : acks) {
                            try {
                                f.join();
                                acked.incrementAndGet();
                            } catch (Exception e) {
                                failed.incrementAndGet();
                                errors.merge("ack " + e.getClass().getSimpleName(), 1, Integer::sum);
                            }
                        }
                    } catch (Exception e) {
                        failed.incrementAndGet();
                        errors.merge(e.getClass().getSimpleName() + ": " + String.valueOf(e.getMessage())
                                .split("\n")[0], 1, Integer::sum);
                    }
                }
            }, "popper-" + t);
            workers.add(w);
            w.start();
        }
        for (Thread w : workers) {
            w.join();
        }
        long end = System.nanoTime();
        consumer.close();
        r.put("bench", "grpc_pop");
        long from = firstAt[0] == 0 ? start : firstAt[0];
        r.put("msgs_per_s", acked.get() / ((end - from) / 1e9));
        r.put("acked", acked.get());
        r.put("failed", failed.get());
        r.put("empty_receives", emptyReceives.get());
        r.put("errors", errors);
        r.put("seconds", (end - start) / 1e9);
        return r;
    }
}
