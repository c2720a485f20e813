// The load generator of bench/zk_ceiling.py, in Java: many ZooKeeper sessions in one JVM, the agents'
// request mix sent open loop with the client's asynchronous API, one JSON line per step on stdout.
//
//   javac -cp ZOOKEEPER_CLASSPATH -d CLASSES ZkLoad.java
//   java -cp CLASSES:ZOOKEEPER_CLASSPATH ZkLoad --hosts H --root /ceiling --sessions 200 --group-size 100
//        --events-per-group 4 --seed 0 --warmup-rate 250 --warmup-seconds 10 --rates 500,1000 --step-seconds 15
//        --max-outstanding 20000 --kind "90:getChildren /members" --kind ...
//
// The harness (bench/zk_ceiling.py) lays out the groups, then starts this program. Protocol, one JSON object
// a line: this program prints {"ready": N} once its N sessions are connected and their member nodes
// created; the harness answers {"start": WALL_CLOCK_SECONDS}; from then on this program runs the warm-up
// (step -1) and the steps, printing one line per step at its end; "stop" on stdin (or its end) cuts the
// ramp short; {"closed": true} is the last line. A step's line has the same fields as the Python workers'
// (sent by kind, not_sent, answered, errors, hist, write_hist, late_ms_max, watch_events, outstanding) and
// exact percentiles of the step's latencies ("percentiles", from a sorted array).
//
// Latency: from the call handed to the client to its completion callback (run on the session's event
// thread), so the generator's own queueing is in it. An answer counts in the step current when it arrives.
// Each session is one VM of one group (session i: group i / group-size, vm{i % group-size}). Kinds are
// named as MIX in bench/zk_ceiling.py; an unknown kind is an error at start.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.zookeeper.AsyncCallback;
import org.apache.zookeeper.CreateMode;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.WatchedEvent;
import org.apache.zookeeper.Watcher;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.ZooKeeper;
import org.apache.zookeeper.data.Stat;

public final class ZkLoad {
    static final double HIST_RATIO = 1.02;  // as Histogram in bench/zk_ceiling.py
    static final double HIST_FLOOR_MS = 0.01;

    enum Op {
        CHILDREN_MEMBERS("getChildren /members"),
        CHILDREN_EVENTS("getChildren /events"),
        CHILDREN_OUT("getChildren /out"),
        CHILDREN_EVENT("getChildren /events/{id}"),
        CHILDREN_ACKS("getChildren /events/{id}/acks"),
        DATA_EVENT("getData /events/{id}"),
        DATA_MEMBER("getData /members/{vm}"),
        DATA_LEADER("getData /leader"),
        EXISTS_PAUSE("exists /pause"),
        EXISTS_ME("exists /members/{me}"),
        ACK("create/delete /events/{id}/acks/{me} (ephemeral)"),
        OUT("create/delete /out/{me} (persistent)"),
        SET_EVENT("setData /events/{id}");

        final String kind;

        Op(String kind) {
            this.kind = kind;
        }

        boolean write() {
            return this == ACK || this == OUT || this == SET_EVENT;
        }

        static Op of(String kind) {
            for (Op op : values()) {
                if (op.kind.equals(kind)) {
                    return op;
                }
            }
            throw new IllegalArgumentException("unknown kind of request: " + kind);
        }
    }

    /** What one step saw. Answers are added from every session's event thread. */
    static final class Window {
        final int[] sent = new int[Op.values().length];
        int notSent;
        double lateMsMax;
        private long[] latencies = new long[1 << 14];  // nanoseconds
        private int answered;
        private long[] writeLatencies = new long[1 << 10];
        private int writesAnswered;
        private final Map<String, Integer> errors = new TreeMap<>();

        synchronized void answer(long nanos, boolean write, String error) {
            if (answered == latencies.length) {
                latencies = Arrays.copyOf(latencies, 2 * latencies.length);
            }
            latencies[answered++] = nanos;
            if (write) {
                if (writesAnswered == writeLatencies.length) {
                    writeLatencies = Arrays.copyOf(writeLatencies, 2 * writeLatencies.length);
                }
                writeLatencies[writesAnswered++] = nanos;
            }
            if (error != null) {
                errors.merge(error, 1, Integer::sum);
            }
        }

        synchronized String toJson(int step, long watchEvents, long outstanding) {
            long[] all = Arrays.copyOf(latencies, answered);
            long[] writes = Arrays.copyOf(writeLatencies, writesAnswered);
            Arrays.sort(all);
            Arrays.sort(writes);
            StringBuilder out = new StringBuilder(4096);
            out.append("{\"step\": ").append(step).append(", \"sent\": {");
            String sep = "";
            for (Op op : Op.values()) {
                if (sent[op.ordinal()] > 0) {
                    out.append(sep).append(quote(op.kind)).append(": ").append(sent[op.ordinal()]);
                    sep = ", ";
                }
            }
            out.append("}, \"not_sent\": ").append(notSent).append(", \"answered\": ").append(answered);
            out.append(", \"errors\": {");
            sep = "";
            for (Map.Entry<String, Integer> e : errors.entrySet()) {
                out.append(sep).append(quote(e.getKey())).append(": ").append(e.getValue());
                sep = ", ";
            }
            out.append("}, \"hist\": ").append(histogram(all)).append(", \"write_hist\": ").append(histogram(writes));
            out.append(", \"percentiles\": {\"p50_ms\": ").append(num(percentile(all, 0.5)))
                .append(", \"p90_ms\": ").append(num(percentile(all, 0.9)))
                .append(", \"p99_ms\": ").append(num(percentile(all, 0.99)))
                .append(", \"max_ms\": ").append(num(percentile(all, 1.0)))
                .append(", \"write_p50_ms\": ").append(num(percentile(writes, 0.5)))
                .append(", \"write_p99_ms\": ").append(num(percentile(writes, 0.99))).append("}");
            out.append(", \"late_ms_max\": ").append(num(lateMsMax));
            out.append(", \"watch_events\": ").append(watchEvents);
            out.append(", \"outstanding\": ").append(outstanding).append("}");
            return out.toString();
        }
    }

    /** The q quantile of sorted nanoseconds, in ms: the value of rank ceil(q * n); NaN when empty. */
    static double percentile(long[] sorted, double q) {
        if (sorted.length == 0) {
            return Double.NaN;
        }
        int rank = Math.max(1, (int) Math.ceil(q * sorted.length));
        return sorted[Math.min(rank, sorted.length) - 1] / 1e6;
    }

    /** The logarithmic buckets of Histogram in bench/zk_ceiling.py, as its to_json. */
    static String histogram(long[] nanos) {
        TreeMap<Integer, Integer> buckets = new TreeMap<>();
        double logRatio = Math.log(HIST_RATIO);
        for (long n : nanos) {
            double ms = n / 1e6;
            int index = ms <= HIST_FLOOR_MS ? 0 : (int) (Math.log(ms / HIST_FLOOR_MS) / logRatio) + 1;
            buckets.merge(index, 1, Integer::sum);
        }
        StringBuilder out = new StringBuilder("{");
        String sep = "";
        for (Map.Entry<Integer, Integer> e : buckets.entrySet()) {
            out.append(sep).append('"').append(e.getKey()).append("\": ").append(e.getValue());
            sep = ", ";
        }
        return out.append('}').toString();
    }

    static String num(double value) {
        return Double.isNaN(value) || Double.isInfinite(value) ? "NaN" : Double.toString(value);
    }

    static String quote(String s) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.append('"').toString();
    }

    static String eventId(int group, int k) {
        return String.format("%04X%04X-0000-4000-8000-000000000000", group, k);
    }

    static byte[] record(String eid, String vmA, String vmB, double at) {
        return ("{\"event_id\": \"" + eid + "\", \"event_type\": \"Freeze\", \"resources\": [\"" + vmA + "\", \"" + vmB
                + "\"], \"not_before\": null, \"first_seen_by\": \"" + vmA + "\", \"first_seen_at\": " + at
                + ", \"done_at\": null}").getBytes(StandardCharsets.UTF_8);
    }

    static double now() {
        return System.currentTimeMillis() / 1e3;
    }

    /** A request in flight: its callback (of every kind the client has) records the answer. */
    final class Request implements AsyncCallback.DataCallback, AsyncCallback.ChildrenCallback,
            AsyncCallback.StatCallback, AsyncCallback.StringCallback, AsyncCallback.VoidCallback {
        final long sentAt = System.nanoTime();
        final Session session;
        final Op op;

        Request(Session session, Op op) {
            this.session = session;
            this.op = op;
        }

        void done(int rc) {
            long nanos = System.nanoTime() - sentAt;
            answeredTotal.incrementAndGet();
            if (op == Op.ACK || op == Op.OUT) {
                session.busy = false;
            }
            String error = null;
            // exists of a missing node is an answer (no node), as it is for kazoo.
            if (rc != 0 && !(rc == KeeperException.Code.NONODE.intValue()
                    && (op == Op.EXISTS_PAUSE || op == Op.EXISTS_ME))) {
                error = KeeperException.Code.get(rc).name();
            }
            window.answer(nanos, op.write(), error);
        }

        @Override
        public void processResult(int rc, String path, Object ctx, byte[] data, Stat stat) {
            done(rc);
        }

        @Override
        public void processResult(int rc, String path, Object ctx, List<String> children) {
            done(rc);
        }

        @Override
        public void processResult(int rc, String path, Object ctx, Stat stat) {
            done(rc);
        }

        @Override
        public void processResult(int rc, String path, Object ctx, String name) {
            done(rc);
        }

        @Override
        public void processResult(int rc, String path, Object ctx) {
            done(rc);
        }
    }

    final class Session implements Watcher {
        final int group;
        final String vm;
        final String base;
        final CountDownLatch connected = new CountDownLatch(1);
        final Watcher watch = event -> watchEvents.incrementAndGet();  // the node watches of this session
        ZooKeeper zk;
        String ack;  // the ack this session holds (or is creating); scheduler thread only
        boolean out;  // scheduler thread only
        volatile boolean busy;  // a create or delete of this session's own nodes is in flight

        Session(int group, String vm) {
            this.group = group;
            this.vm = vm;
            this.base = root + "/g" + group;
        }

        @Override
        public void process(WatchedEvent event) {  // the session's state
            if (event.getState() == Watcher.Event.KeeperState.SyncConnected) {
                connected.countDown();
            }
        }
    }

    final String hosts;
    final String root;
    final int groupSize;
    final int eventsPerGroup;
    final long maxOutstanding;
    final Random rng;
    final Op[] ops;
    final int[] cumulative;
    final List<Session> sessions = new ArrayList<>();
    final AtomicLong answeredTotal = new AtomicLong();
    final AtomicLong watchEvents = new AtomicLong();
    long sentTotal;  // scheduler thread only
    volatile Window window = new Window();
    volatile boolean stop;

    ZkLoad(Map<String, String> options, List<String> kinds) {
        hosts = options.get("hosts");
        root = options.getOrDefault("root", "/ceiling");
        groupSize = Integer.parseInt(options.get("group-size"));
        eventsPerGroup = Integer.parseInt(options.getOrDefault("events-per-group", "4"));
        maxOutstanding = Long.parseLong(options.getOrDefault("max-outstanding", "20000"));
        rng = new Random(Long.parseLong(options.getOrDefault("seed", "0")));
        ops = new Op[kinds.size()];
        cumulative = new int[kinds.size()];
        int total = 0;
        for (int i = 0; i < kinds.size(); i++) {
            String[] parts = kinds.get(i).split(":", 2);
            ops[i] = Op.of(parts[1]);
            total += Integer.parseInt(parts[0]);
            cumulative[i] = total;
        }
        if (total <= 0) {
            throw new IllegalArgumentException("the mix has no weight");
        }
    }

    void connect(int count) throws Exception {
        int timeoutMs = 30_000;  // as bench/zk_ceiling.py's SESSION_TIMEOUT (the default when the ceiling was measured)
        for (int i = 0; i < count; i++) {
            Session s = new Session(i / groupSize, "vm" + (i % groupSize));
            s.zk = new ZooKeeper(hosts, timeoutMs, s);
            sessions.add(s);
        }
        for (Session s : sessions) {
            if (!s.connected.await(60, TimeUnit.SECONDS)) {
                throw new IllegalStateException("a session did not connect within 60 s");
            }
            String data = "{\"vm\": \"" + s.vm + "\", \"session\": " + s.zk.getSessionId() + ", \"since\": " + now() + "}";
            s.zk.create(s.base + "/members/" + s.vm, data.getBytes(StandardCharsets.UTF_8), ZooDefs.Ids.OPEN_ACL_UNSAFE,
                    CreateMode.EPHEMERAL);
        }
    }

    void close() {
        for (Session s : sessions) {
            try {
                s.zk.close(2_000);
            } catch (Exception e) {  // best effort: the process ends next
            }
        }
    }

    void send(Window w) {
        int draw = rng.nextInt(cumulative[cumulative.length - 1]);
        int index = 0;
        while (cumulative[index] <= draw) {
            index++;
        }
        Op op = ops[index];
        Session s = sessions.get(rng.nextInt(sessions.size()));
        String eid = eventId(s.group, rng.nextInt(eventsPerGroup));
        if ((op == Op.ACK || op == Op.OUT) && s.busy) {
            op = Op.SET_EVENT;  // one write of a session's own nodes at a time
        }
        Request r = new Request(s, op);
        ZooKeeper zk = s.zk;
        String base = s.base;
        switch (op) {
            case CHILDREN_MEMBERS -> zk.getChildren(base + "/members", s.watch, (AsyncCallback.ChildrenCallback) r, null);
            case CHILDREN_EVENTS -> zk.getChildren(base + "/events", s.watch, (AsyncCallback.ChildrenCallback) r, null);
            case CHILDREN_OUT -> zk.getChildren(base + "/out", s.watch, (AsyncCallback.ChildrenCallback) r, null);
            case CHILDREN_EVENT -> zk.getChildren(base + "/events/" + eid, s.watch, (AsyncCallback.ChildrenCallback) r,
                    null);
            case CHILDREN_ACKS -> zk.getChildren(base + "/events/" + eid + "/acks", s.watch,
                    (AsyncCallback.ChildrenCallback) r, null);
            case DATA_EVENT -> zk.getData(base + "/events/" + eid, s.watch, r, null);
            case DATA_MEMBER -> {
                Session peer = sessions.get(rng.nextInt(sessions.size()));
                zk.getData(peer.base + "/members/" + peer.vm, s.watch, r, null);
            }
            case DATA_LEADER -> zk.getData(base + "/leader", s.watch, r, null);
            case EXISTS_PAUSE -> zk.exists(base + "/pause", s.watch, (AsyncCallback.StatCallback) r, null);
            case EXISTS_ME -> zk.exists(base + "/members/" + s.vm, s.watch, (AsyncCallback.StatCallback) r, null);
            case ACK -> {
                s.busy = true;
                if (s.ack == null) {
                    s.ack = base + "/events/" + eid + "/acks/" + s.vm;
                    byte[] data = ("{\"vm\": \"" + s.vm + "\", \"at\": " + now() + "}").getBytes(StandardCharsets.UTF_8);
                    zk.create(s.ack, data, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL,
                            (AsyncCallback.StringCallback) r, null);
                } else {
                    zk.delete(s.ack, -1, (AsyncCallback.VoidCallback) r, null);
                    s.ack = null;
                }
            }
            case OUT -> {
                s.busy = true;
                String path = base + "/out/" + s.vm;
                if (!s.out) {
                    byte[] data = ("{\"events\": [\"" + eid + "\"], \"at\": " + now() + "}")
                            .getBytes(StandardCharsets.UTF_8);
                    zk.create(path, data, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT,
                            (AsyncCallback.StringCallback) r, null);
                } else {
                    zk.delete(path, -1, (AsyncCallback.VoidCallback) r, null);
                }
                s.out = !s.out;
            }
            case SET_EVENT -> zk.setData(base + "/events/" + eid,
                    record(eid, "vm" + rng.nextInt(groupSize), s.vm, now()), -1, (AsyncCallback.StatCallback) r, null);
        }
        w.sent[op.ordinal()]++;
        sentTotal++;
    }

    /** Send at rate requests/s on a fixed schedule until the nanoTime until; hand back the step's window. */
    Window runStep(double rate, long until) {
        Window w = window;
        double interval = 1e9 / rate;
        double due = System.nanoTime();
        while (!stop) {
            long now = System.nanoTime();
            if (now >= until) {
                break;
            }
            if (due > now) {
                LockSupport.parkNanos(Math.min((long) (due - now), Math.min(until - now, 1_000_000L)));
                continue;
            }
            w.lateMsMax = Math.max(w.lateMsMax, (now - due) / 1e6);
            while (due <= now && due < until) {
                if (sentTotal - answeredTotal.get() >= maxOutstanding) {
                    w.notSent++;
                } else {
                    send(w);
                }
                due += interval;
            }
        }
        window = new Window();  // answers from now on count in the next step
        return w;
    }

    static double parseStart(String line) {
        Matcher m = Pattern.compile("\"start\"\\s*:\\s*([-+0-9.eE]+)").matcher(line);
        if (!m.find()) {
            throw new IllegalArgumentException("expected {\"start\": SECONDS}, got " + line);
        }
        return Double.parseDouble(m.group(1));
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> options = new HashMap<>();
        List<String> kinds = new ArrayList<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (!args[i].startsWith("--")) {
                throw new IllegalArgumentException("expected --option value, got " + args[i]);
            }
            if (args[i].equals("--kind")) {
                kinds.add(args[i + 1]);
            } else {
                options.put(args[i].substring(2), args[i + 1]);
            }
        }
        PrintStream out = new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), true,
                StandardCharsets.UTF_8);
        ZkLoad load = new ZkLoad(options, kinds);
        int count = Integer.parseInt(options.get("sessions"));
        double warmupRate = Double.parseDouble(options.get("warmup-rate"));
        double warmupSeconds = Double.parseDouble(options.get("warmup-seconds"));
        double stepSeconds = Double.parseDouble(options.get("step-seconds"));
        double[] rates = Arrays.stream(options.get("rates").split(",")).mapToDouble(Double::parseDouble).toArray();
        int status = 0;
        try {
            load.connect(count);
            out.println("{\"ready\": " + load.sessions.size() + "}");
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String first = in.readLine();
            if (first == null) {
                return;
            }
            double start = parseStart(first);
            Thread control = new Thread(() -> {  // "stop", or the end of input (the harness gone), ends the ramp
                try {
                    for (String line = in.readLine(); line != null; line = in.readLine()) {
                        if (line.trim().equals("stop")) {
                            break;
                        }
                    }
                } catch (java.io.IOException e) {
                    // the end of input
                }
                load.stop = true;
            }, "control");
            control.setDaemon(true);
            control.start();
            long begin = System.nanoTime() + (long) (Math.max(0.0, start - now()) * 1e9);
            while (System.nanoTime() < begin && !load.stop) {
                LockSupport.parkNanos(Math.min(begin - System.nanoTime(), 10_000_000L));
            }
            long at = begin;
            for (int index = 0; index <= rates.length && !load.stop; index++) {
                double rate = index == 0 ? warmupRate : rates[index - 1];
                double seconds = index == 0 ? warmupSeconds : stepSeconds;
                at += (long) (seconds * 1e9);
                Window w = load.runStep(rate, at);
                long watched = load.watchEvents.getAndSet(0);
                if (load.stop && System.nanoTime() < at - 500_000_000L) {
                    break;  // a step cut short is not reported
                }
                out.println(w.toJson(index - 1, watched, load.sentTotal - load.answeredTotal.get()));
            }
        } catch (Exception e) {
            e.printStackTrace();
            status = 1;
        } finally {
            load.window = new Window();
            load.close();
            out.println("{\"closed\": true}");
        }
        System.exit(status);
    }
}
