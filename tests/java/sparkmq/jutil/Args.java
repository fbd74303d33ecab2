package sparkmq.jutil;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Command-line options of the drivers: {@code --name value} pairs, {@code --flag} switches (a name followed by
 * another option or by nothing), and positional words.  A name given several times keeps every value
 * ({@link #all}); {@link #get} returns the last one.  Unknown names are reported by {@link #rejectUnknown} so a
 * typo in a test fails loudly instead of running with a default.
 */
public final class Args {
    private final Map<String, List<String>> options = new LinkedHashMap<>();
    private final List<String> positional = new ArrayList<>();
    private final java.util.Set<String> read = new java.util.HashSet<>();

    /** Parses {@code argv}. */
    public Args(String[] argv) {
        for (int i = 0; i < argv.length; i++) {
            String word = argv[i];
            if (word.startsWith("--") && word.length() > 2) {
                String name = word.substring(2);
                String value = "true";
                int eq = name.indexOf('=');
                if (eq >= 0) {
                    value = name.substring(eq + 1);
                    name = name.substring(0, eq);
                } else if (i + 1 < argv.length && !argv[i + 1].startsWith("--")) {
                    value = argv[++i];
                }
                options.computeIfAbsent(name, k -> new ArrayList<>()).add(value);
            } else {
                positional.add(word);
            }
        }
    }

    /** The positional words (the mode first). */
    public List<String> positional() {
        return positional;
    }

    /** Whether the option was given. */
    public boolean has(String name) {
        read.add(name);
        return options.containsKey(name);
    }

    /** The last value of an option, or {@code fallback}. */
    public String get(String name, String fallback) {
        read.add(name);
        List<String> values = options.get(name);
        return values == null ? fallback : values.get(values.size() - 1);
    }

    /** The last value of a required option; a {@link UsageError} when it is missing. */
    public String require(String name) {
        String value = get(name, null);
        if (value == null) {
            throw new UsageError("missing --" + name);
        }
        return value;
    }

    /** Every value of an option, in order (empty when absent). */
    public List<String> all(String name) {
        read.add(name);
        return options.getOrDefault(name, List.of());
    }

    /** An integer option. */
    public int intValue(String name, int fallback) {
        String value = get(name, null);
        try {
            return value == null ? fallback : Integer.parseInt(value);
        } catch (NumberFormatException e) {
            throw new UsageError("--" + name + " must be an integer, got " + value);
        }
    }

    /** A long option. */
    public long longValue(String name, long fallback) {
        String value = get(name, null);
        try {
            return value == null ? fallback : Long.parseLong(value);
        } catch (NumberFormatException e) {
            throw new UsageError("--" + name + " must be an integer, got " + value);
        }
    }

    /** A decimal option. */
    public double doubleValue(String name, double fallback) {
        String value = get(name, null);
        try {
            return value == null ? fallback : Double.parseDouble(value);
        } catch (NumberFormatException e) {
            throw new UsageError("--" + name + " must be a number, got " + value);
        }
    }

    /** A boolean option: {@code --flag}, {@code --flag true} or {@code --flag false}. */
    public boolean flag(String name) {
        String value = get(name, "false");
        if (!value.equals("true") && !value.equals("false")) {
            throw new UsageError("--" + name + " takes true or false, got " + value);
        }
        return value.equals("true");
    }

    /** Fails with a {@link UsageError} naming every option that no code asked for. */
    public void rejectUnknown() {
        List<String> unknown = new ArrayList<>();
        for (String name : options.keySet()) {
            if (!read.contains(name)) {
                unknown.add("--" + name);
            }
        }
        if (!unknown.isEmpty()) {
            throw new UsageError("unknown options: " + String.join(" ", unknown));
        }
    }

    /** A bad command line: the drivers print it and exit with code 2. */
    public static final class UsageError extends RuntimeException {
        public UsageError(String message) {
            super(message);
        }
    }
}
