package sparkmq.jutil;

import java.io.IOException;
import java.io.InputStream;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * When a long-running driver stops: after a duration, when stdin reaches end of file (the Python harness closes
 * the pipe), or when the driver itself says it is done ({@link #fire}).  Whichever comes first.
 */
public final class StopSignal {
    private final CountDownLatch latch = new CountDownLatch(1);
    private volatile String reason = "";

    /** Fires after {@code seconds} (when > 0), and at stdin's end of file when {@code watchStdin}. */
    public StopSignal(double seconds, boolean watchStdin) {
        if (watchStdin) {
            Thread t = new Thread(() -> {
                InputStream in = System.in;
                byte[] buf = new byte[256];
                try {
                    while (in.read(buf) >= 0) {
                        // lines are ignored: only the end of the stream matters
                    }
                } catch (IOException ignored) {
                    // a broken pipe is an end too
                }
                fire("stdin_closed");
            }, "stdin-watch");
            t.setDaemon(true);
            t.start();
        }
        if (seconds > 0) {
            Thread t = new Thread(() -> {
                try {
                    if (!latch.await((long) (seconds * 1000), TimeUnit.MILLISECONDS)) {
                        fire("duration");
                    }
                } catch (InterruptedException ignored) {
                    Thread.currentThread().interrupt();
                }
            }, "duration-watch");
            t.setDaemon(true);
            t.start();
        }
    }

    /** Stops the driver (the first reason is kept). */
    public synchronized void fire(String why) {
        if (latch.getCount() > 0) {
            reason = why;
            latch.countDown();
        }
    }

    /** Whether it fired. */
    public boolean fired() {
        return latch.getCount() == 0;
    }

    /** Waits until it fires; returns the reason. */
    public String await() throws InterruptedException {
        latch.await();
        return reason;
    }

    /** Waits up to {@code millis}; true when it fired. */
    public boolean await(long millis) throws InterruptedException {
        return latch.await(millis, TimeUnit.MILLISECONDS);
    }

    /** Why it fired ("" before). */
    public String reason() {
        return reason;
    }
}
