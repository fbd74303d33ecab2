package sparkmq.jutil;

import java.util.Arrays;

/**
 * Latency samples in nanoseconds, recorded by one thread (or under the caller's lock), merged and summarized at
 * the end: count, p50, p99, max in milliseconds.
 */
public final class Latencies {
    private long[] samples = new long[1024];
    private int size;

    /** Adds one sample (nanoseconds). */
    public void add(long nanos) {
        if (size == samples.length) {
            samples = Arrays.copyOf(samples, size * 2);
        }
        samples[size++] = nanos;
    }

    /** Adds every sample of another recorder. */
    public void addAll(Latencies other) {
        for (int i = 0; i < other.size; i++) {
            add(other.samples[i]);
        }
    }

    /** The number of samples. */
    public int count() {
        return size;
    }

    /** The q-quantile (0..1) in milliseconds, NaN without samples (nearest rank). */
    public double quantileMs(double q) {
        if (size == 0) {
            return Double.NaN;
        }
        long[] sorted = Arrays.copyOf(samples, size);
        Arrays.sort(sorted);
        int index = (int) Math.min(size - 1, Math.max(0, Math.ceil(q * size) - 1));
        return sorted[index] / 1e6;
    }
}
