package sparkmq.jclient;

import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.ClientConfig;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.common.message.MessageClientExt;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.RPCHook;
import sparkmq.jutil.Args;
import sparkmq.jutil.JsonOut;

/** What every mode shares: ACL hook, client settings, subscriptions, and a message as a JSON event. */
final class Common {
    private Common() {
    }

    /** {@code AclClientRPCHook(new SessionCredentials(ak, sk))} when {@code --ak} and {@code --sk} are given. */
    static RPCHook rpcHook(Args args) {
        String ak = args.get("ak", null);
        String sk = args.get("sk", null);
        if (ak == null && sk == null) {
            return null;
        }
        if (ak == null || sk == null) {
            throw new Args.UsageError("--ak and --sk go together");
        }
        return new AclClientRPCHook(new SessionCredentials(ak, sk));
    }

    /**
     * The settings every client takes from the command line: name servers ({@code --namesrv "a:9876;b:9876"}),
     * instance name, and the intervals a test may shorten (route polling, heartbeats, offset persistence).
     */
    static void configure(ClientConfig config, Args args) {
        config.setNamesrvAddr(args.require("namesrv"));
        if (args.has("instance")) {
            config.setInstanceName(args.get("instance", null));
        } else {
            // the default instance name is the pid: two drivers in one test are two processes anyway, but a
            // unique name keeps two clients of one process apart too
            config.setInstanceName("sparkmq-" + ProcessHandle.current().pid() + "-" + System.nanoTime());
        }
        config.setPollNameServerInterval(args.intValue("poll-namesrv-ms", 30_000));
        config.setHeartbeatBrokerInterval(args.intValue("heartbeat-ms", 30_000));
        config.setPersistConsumerOffsetInterval(args.intValue("persist-offset-ms", 5_000));
        config.setVipChannelEnabled(false);
        if (args.has("namespace")) {
            config.setNamespaceV2(args.get("namespace", null));
        }
        if (args.has("api-timeout-ms")) {
            config.setMqClientApiTimeout(args.intValue("api-timeout-ms", 3000));
        }
    }

    /** {@code --sql EXPR} (SQL92) or {@code --tags EXPR} (default {@code *}). */
    static MessageSelector selector(Args args) {
        if (args.has("sql")) {
            return MessageSelector.bySql(args.get("sql", null));
        }
        return MessageSelector.byTag(args.get("tags", "*"));
    }

    /** {@code --sub TOPIC=EXPR} (repeatable, tag expressions): further subscriptions of a consumer. */
    static Map<String, String> extraSubscriptions(Args args) {
        Map<String, String> subs = new LinkedHashMap<>();
        for (String spec : args.all("sub")) {
            int eq = spec.indexOf('=');
            subs.put(eq < 0 ? spec : spec.substring(0, eq), eq < 0 ? "*" : spec.substring(eq + 1));
        }
        return subs;
    }

    /** A queue as JSON fields. */
    static Map<String, Object> queue(MessageQueue mq) {
        Map<String, Object> q = new LinkedHashMap<>();
        q.put("topic", mq.getTopic());
        q.put("brokerName", mq.getBrokerName());
        q.put("queueId", mq.getQueueId());
        return q;
    }

    /** Queues as a sorted JSON list. */
    static List<Map<String, Object>> queues(java.util.Collection<MessageQueue> mqs) {
        List<MessageQueue> sorted = new ArrayList<>(mqs);
        java.util.Collections.sort(sorted);
        List<Map<String, Object>> out = new ArrayList<>();
        for (MessageQueue mq : sorted) {
            out.add(queue(mq));
        }
        return out;
    }

    /**
     * A received message as a {@code received} event: both ids (the consumer's {@code getMsgId()}, which is the
     * producer's UNIQ_KEY when there is one, and {@code MessageClientExt#getOffsetMsgId()}, the store host and
     * commit-log offset), every header field, the properties, and the body in base64.
     */
    static Map<String, Object> received(MessageExt m, boolean withBody) {
        Map<String, Object> e = JsonOut.event("received");
        e.put("msgId", m.getMsgId());
        e.put("offsetMsgId", m instanceof MessageClientExt ? ((MessageClientExt) m).getOffsetMsgId() : m.getMsgId());
        e.put("topic", m.getTopic());
        e.put("tags", m.getTags());
        e.put("keys", m.getKeys());
        e.put("brokerName", m.getBrokerName());
        e.put("queueId", m.getQueueId());
        e.put("queueOffset", m.getQueueOffset());
        e.put("commitLogOffset", m.getCommitLogOffset());
        e.put("bornTimestamp", m.getBornTimestamp());
        e.put("storeTimestamp", m.getStoreTimestamp());
        e.put("bornHost", m.getBornHostString());
        e.put("storeHost", String.valueOf(m.getStoreHost()));
        e.put("reconsumeTimes", m.getReconsumeTimes());
        e.put("sysFlag", m.getSysFlag());
        e.put("flag", m.getFlag());
        e.put("bodyCRC", m.getBodyCRC());
        e.put("storeSize", m.getStoreSize());
        e.put("bodyLen", m.getBody() == null ? -1 : m.getBody().length);
        if (withBody) {
            e.put("body", m.getBody() == null ? null : Base64.getEncoder().encodeToString(m.getBody()));
        }
        e.put("properties", new LinkedHashMap<>(m.getProperties()));
        e.put("thread", Thread.currentThread().getName());
        e.put("receivedMs", System.currentTimeMillis());
        return e;
    }
}
